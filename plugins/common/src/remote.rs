//! A document fetched from an upstream with `dispatch_http_call` and shared by every VM of the
//! gateway through proxy-wasm shared data, so that it is fetched once per
//! `cache_duration_seconds` for the whole gateway, not once per worker (jwt-auth's remote JWKS,
//! cost's remote price table). This module is host-free: the records and the decisions. The
//! host side (ticks, the call, the writes) is [`crate::remote_fetch`].
//!
//! Two shared-data values per document, so that the tick that every VM runs (every
//! [`TICK_MILLIS`]) reads a few bytes, not the document (a price table is megabytes):
//!
//! ```text
//! KEY (the lease record, 17 bytes)
//!   byte 0      version (2)
//!   bytes 1..9  fetched_at   u64 little-endian, Unix seconds of the last good fetch (0: never)
//!   bytes 9..17 lease_until  u64 little-endian, Unix seconds until which one VM is fetching
//! KEY#document (the last good document)
//!   bytes 0..8  fetched_at   u64 little-endian, the same as the lease record's when current
//!   bytes 8..   the document as fetched (validated by the filter before it was stored)
//! ```
//!
//! A VM that finds the record stale takes the lease with a CAS write and fetches; the others keep
//! their installed document and install the new one once the record's `fetched_at` changes and
//! the document value carries the same `fetched_at` (written first, so a reader sees either the
//! old pair or the new one; a mismatch is read again on the next tick). A failed fetch, or a
//! fetched document the filter refuses, keeps the old document everywhere and pushes the lease
//! `retry_seconds` ahead. Bound: while the key does not exist yet, a write with no CAS value is
//! unconditional in Envoy, so at start-up up to one fetch per VM may run.

use serde::Deserialize;

use crate::config::ConfigError;

/// Current lease record layout version.
pub const VERSION: u8 = 2;
const LEASE_BYTES: usize = 17;
/// Tick period of a filter with a remote document (milliseconds).
pub const TICK_MILLIS: u32 = 500;

/// A remote document as configured (JSON), e.g.
/// `{"cluster": "jwks", "path": "/jwks.json", "cache_duration_seconds": 300}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemote {
    cluster: String,
    path: String,
    authority: Option<String>,
    timeout_ms: Option<u64>,
    cache_duration_seconds: Option<u64>,
    retry_seconds: Option<u64>,
    max_bytes: Option<usize>,
}

/// Defaults and bounds of one kind of remote document.
#[derive(Debug, Clone, Copy)]
pub struct RemoteDefaults {
    /// `cache_duration_seconds` when not given.
    pub cache_duration_seconds: u64,
    /// `retry_seconds` when not given.
    pub retry_seconds: u64,
    /// `timeout_ms` when not given.
    pub timeout_ms: u64,
    /// `max_bytes` when not given, and its largest value.
    pub max_bytes: usize,
    /// Largest `max_bytes`.
    pub max_bytes_limit: usize,
}

/// A remote document's endpoint (an upstream cluster of the proxy) and refresh policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSource {
    /// Cluster name (Envoy) or upstream (nginx) to call.
    pub cluster: String,
    /// Request path, e.g. `/.well-known/jwks.json`.
    pub path: String,
    /// `:authority` of the request (defaults to the cluster name).
    pub authority: String,
    /// Call timeout (milliseconds).
    pub timeout_ms: u64,
    /// How long a fetched document is used before it is refreshed (seconds).
    pub cache_duration_seconds: u64,
    /// Delay before another attempt after a failed fetch (seconds).
    pub retry_seconds: u64,
    /// Largest response body accepted (bytes).
    pub max_bytes: usize,
}

impl RawRemote {
    /// The checked source; errors name `field` (the JSON path of this object) and the member.
    pub fn checked(self, field: &str, d: RemoteDefaults) -> Result<RemoteSource, ConfigError> {
        if self.cluster.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.cluster"),
                "must not be empty",
            ));
        }
        if !self.path.starts_with('/') {
            return Err(ConfigError::new(
                format!("{field}.path"),
                "must start with `/`",
            ));
        }
        let source = RemoteSource {
            authority: self.authority.unwrap_or_else(|| self.cluster.clone()),
            cluster: self.cluster,
            path: self.path,
            timeout_ms: self.timeout_ms.unwrap_or(d.timeout_ms),
            cache_duration_seconds: self
                .cache_duration_seconds
                .unwrap_or(d.cache_duration_seconds),
            retry_seconds: self.retry_seconds.unwrap_or(d.retry_seconds),
            max_bytes: self.max_bytes.unwrap_or(d.max_bytes),
        };
        if source.cache_duration_seconds == 0 || source.retry_seconds == 0 || source.timeout_ms == 0
        {
            return Err(ConfigError::new(
                field,
                "`cache_duration_seconds`, `retry_seconds` and `timeout_ms` must be positive",
            ));
        }
        if source.max_bytes == 0 || source.max_bytes > d.max_bytes_limit {
            return Err(ConfigError::new(
                format!("{field}.max_bytes"),
                format!("must be from 1 to {} bytes", d.max_bytes_limit),
            ));
        }
        Ok(source)
    }
}

impl RemoteSource {
    /// The lease record's shared-data key under `namespace` (e.g. `tollgate.jwt_auth/jwks`), the
    /// same for every VM that fetches the same document. In nginx the part before the first `/`
    /// names the `shm_kv` zone.
    pub fn shared_data_key(&self, namespace: &str) -> String {
        format!("{namespace}/{}{}", self.cluster, self.path)
    }
}

/// The shared-data key of the document that goes with the lease record `key`.
pub fn document_key(key: &str) -> String {
    format!("{key}#document")
}

/// The decoded lease record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    /// Unix seconds of the last good fetch (0: never).
    pub fetched_at: u64,
    /// Unix seconds until which a fetch is under way (or, after a failure, not retried).
    pub lease_until: u64,
}

impl Lease {
    /// Encodes the record (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEASE_BYTES);
        out.push(VERSION);
        out.extend_from_slice(&self.fetched_at.to_le_bytes());
        out.extend_from_slice(&self.lease_until.to_le_bytes());
        out
    }

    /// Decodes a record; `None` if it has another length or version (then it is rewritten).
    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        if bytes.len() != LEASE_BYTES || bytes.first() != Some(&VERSION) {
            return None;
        }
        Some(Lease {
            fetched_at: u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?),
            lease_until: u64::from_le_bytes(bytes.get(9..17)?.try_into().ok()?),
        })
    }
}

/// The document value: `fetched_at` then the document.
pub fn encode_document(fetched_at: u64, document: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(document.len().saturating_add(8));
    out.extend_from_slice(&fetched_at.to_le_bytes());
    out.extend_from_slice(document);
    out
}

/// The document of a document value if it was fetched at `fetched_at`, else `None` (a reader
/// between the two writes of a refresh: try again on the next tick).
pub fn document_at(value: &[u8], fetched_at: u64) -> Option<&[u8]> {
    let stamp = u64::from_le_bytes(value.get(0..8)?.try_into().ok()?);
    (stamp == fetched_at).then(|| value.get(8..)).flatten()
}

/// What a VM should do on a tick.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickPlan {
    /// A newer good document exists (its `fetched_at`): read the document value and install it.
    pub install: Option<u64>,
    /// Take the lease by writing this value with the CAS just read, then fetch.
    pub take_lease: Option<Vec<u8>>,
}

/// Plans a tick at `now` (Unix seconds) given the lease record (if any), the `fetched_at` of the
/// document this VM has installed (0: none), the cache duration and the call timeout (seconds).
pub fn plan_tick(
    now: u64,
    record: Option<&[u8]>,
    installed: u64,
    ttl: u64,
    timeout_s: u64,
) -> TickPlan {
    let lease = record.and_then(Lease::decode).unwrap_or_default();
    let mut plan = TickPlan::default();
    if lease.fetched_at != 0 && lease.fetched_at != installed {
        plan.install = Some(lease.fetched_at);
    }
    let stale = lease.fetched_at == 0 || now >= lease.fetched_at.saturating_add(ttl);
    if stale && now >= lease.lease_until {
        let taken = Lease {
            fetched_at: lease.fetched_at,
            lease_until: now.saturating_add(timeout_s).saturating_add(1),
        };
        plan.take_lease = Some(taken.encode());
    }
    plan
}

/// The lease record after a fetch at `now`: fetched now if it succeeded, else the previous
/// `fetched_at` kept with the lease pushed `retry_seconds` ahead.
pub fn after_fetch(now: u64, previous: Option<&[u8]>, ok: bool, retry_seconds: u64) -> Lease {
    if ok {
        return Lease {
            fetched_at: now,
            lease_until: 0,
        };
    }
    Lease {
        fetched_at: previous.and_then(Lease::decode).map_or(0, |l| l.fetched_at),
        lease_until: now.saturating_add(retry_seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: RemoteDefaults = RemoteDefaults {
        cache_duration_seconds: 300,
        retry_seconds: 10,
        timeout_ms: 5000,
        max_bytes: 1 << 20,
        max_bytes_limit: 1 << 24,
    };

    fn raw(json: &str) -> RawRemote {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn config_defaults_and_errors() {
        let s = raw(r#"{"cluster": "c", "path": "/p"}"#)
            .checked("x", D)
            .unwrap();
        assert_eq!(
            (s.authority.as_str(), s.cache_duration_seconds, s.max_bytes),
            ("c", 300, 1 << 20)
        );
        assert_eq!(s.shared_data_key("ns/k"), "ns/k/c/p");
        for (json, field) in [
            (r#"{"cluster": "", "path": "/p"}"#, "x.cluster"),
            (r#"{"cluster": "c", "path": "p"}"#, "x.path"),
            (r#"{"cluster": "c", "path": "/p", "retry_seconds": 0}"#, "x"),
            (
                r#"{"cluster": "c", "path": "/p", "max_bytes": 99999999}"#,
                "x.max_bytes",
            ),
        ] {
            assert_eq!(raw(json).checked("x", D).unwrap_err().field, field);
        }
    }

    #[test]
    fn records_round_trip_and_bad_values() {
        let l = Lease {
            fetched_at: 7,
            lease_until: 9,
        };
        assert_eq!(Lease::decode(&l.encode()), Some(l));
        assert_eq!(Lease::decode(&[]), None);
        assert_eq!(
            Lease::decode(&[1; 17]),
            None,
            "version 1 (one value) is rewritten"
        );
        assert_eq!(Lease::decode(&[2; 40]), None);
        let doc = encode_document(7, b"{}");
        assert_eq!(document_at(&doc, 7), Some(&b"{}"[..]));
        assert_eq!(document_at(&doc, 8), None, "another refresh's document");
        assert_eq!(document_at(&[0; 3], 0), None);
    }

    #[test]
    fn first_tick_takes_the_lease() {
        let plan = plan_tick(1000, None, 0, 300, 5);
        assert_eq!(plan.install, None);
        let lease = Lease::decode(&plan.take_lease.unwrap()).unwrap();
        assert_eq!((lease.fetched_at, lease.lease_until), (0, 1006));
    }

    #[test]
    fn others_wait_for_the_lease_then_install() {
        let leased = Lease {
            fetched_at: 0,
            lease_until: 1006,
        }
        .encode();
        assert_eq!(
            plan_tick(1001, Some(&leased), 0, 300, 5),
            TickPlan::default()
        );
        let good = after_fetch(1002, Some(&leased), true, 10).encode();
        let plan = plan_tick(1003, Some(&good), 0, 300, 5);
        assert_eq!(plan.install, Some(1002));
        assert_eq!(plan.take_lease, None, "fresh document: no fetch");
        assert_eq!(
            plan_tick(1003, Some(&good), 1002, 300, 5),
            TickPlan::default()
        );
        let plan = plan_tick(1302, Some(&good), 1002, 300, 5);
        assert!(plan.take_lease.is_some(), "stale after the cache duration");
    }

    #[test]
    fn failed_fetch_keeps_the_document_and_backs_off() {
        let good = after_fetch(1000, None, true, 10).encode();
        let failed = after_fetch(1400, Some(&good), false, 10);
        assert_eq!((failed.fetched_at, failed.lease_until), (1000, 1410));
        let enc = failed.encode();
        assert_eq!(
            plan_tick(1405, Some(&enc), 1000, 300, 5),
            TickPlan::default()
        );
        assert!(plan_tick(1410, Some(&enc), 1000, 300, 5)
            .take_lease
            .is_some());
    }
}
