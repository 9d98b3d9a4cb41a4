//! The host side of [`crate::remote`]: the tick that reads the lease record, the
//! `dispatch_http_call` of the VM that takes the lease, and the writes after it. A filter's root
//! context owns one [`RemoteDocument`] per remote document, calls [`RemoteDocument::tick`] from
//! `on_tick` and [`RemoteDocument::on_response`] from `on_http_call_response`, and installs
//! what they return.

use std::time::Duration;

use proxy_wasm::hostcalls;

use crate::host_calls::{http_call_response_body, http_call_response_header};
use crate::remote::{
    after_fetch, document_at, document_key, encode_document, plan_tick, Lease, RemoteSource,
};
use crate::shared_data::{cas_update, HostSharedData, SharedStore, StoreError};

/// CAS attempts of one write before giving up (another VM wrote meanwhile: its record is as
/// fresh).
const ATTEMPTS: u32 = 4;
/// How long the VM that fetched a document holds the lease while its filter checks it
/// (seconds): a large document is read over several ticks.
pub const CHECK_LEASE_SECONDS: u64 = 60;

/// One remote document of a root context.
#[derive(Debug)]
pub struct RemoteDocument {
    /// Where it comes from.
    pub source: RemoteSource,
    /// For log lines, e.g. `jwt-auth: JWKS jwks/.well-known/jwks.json`.
    label: String,
    key: String,
    /// `fetched_at` of the document this VM installed (0: none).
    installed: u64,
    in_flight: Option<u32>,
}

/// Writes `key` with CAS (read, then write with the token read), so that it is correct under
/// both hosts' rules: Envoy's, where a write without a token overwrites, and ngx_wasm_module's,
/// where it is a mismatch on an existing key (a missing key is written without a token).
fn store(key: &str, value: impl Fn(Option<&[u8]>) -> Vec<u8>) -> Result<(), String> {
    cas_update(&HostSharedData, key, ATTEMPTS, |previous| {
        Some(value(previous))
    })
    .map(|_| ())
    .map_err(|e| format!("{} CAS mismatches, host status {:?}", e.retries, e.failed))
}

impl RemoteDocument {
    /// A document stored under `namespace` (see [`RemoteSource::shared_data_key`]); `label`
    /// prefixes its log lines.
    pub fn new(source: RemoteSource, namespace: &str, label: &str) -> Self {
        RemoteDocument {
            key: source.shared_data_key(namespace),
            label: format!("{label} {}{}", source.cluster, source.path),
            source,
            installed: 0,
            in_flight: None,
        }
    }

    /// Whether the call `token` is this document's fetch.
    pub fn owns(&self, token: u32) -> bool {
        self.in_flight == Some(token)
    }

    /// On a tick at `now` (Unix seconds): a newer document than the installed one, with its
    /// `fetched_at`, to install (then counted as installed, so a document is read once per VM);
    /// and, when this VM takes the lease, the fetch is started.
    pub fn tick(&mut self, now: u64) -> Option<(u64, Vec<u8>)> {
        let (record, cas) = match HostSharedData.get(&self.key) {
            Ok(read) => read,
            Err(e) => {
                log::warn!(
                    "{}: cannot read the record {} ({e:?})",
                    self.label,
                    self.key
                );
                return None;
            }
        };
        let s = &self.source;
        let plan = plan_tick(
            now,
            record.as_deref(),
            self.installed,
            s.cache_duration_seconds,
            s.timeout_ms.div_ceil(1000),
        );
        let mut newer = None;
        if let Some(fetched_at) = plan.install {
            match HostSharedData.get(&document_key(&self.key)) {
                Ok((Some(value), _)) => {
                    if let Some(document) = document_at(&value, fetched_at) {
                        self.installed = fetched_at;
                        newer = Some((fetched_at, document.to_vec()));
                    }
                }
                Ok((None, _)) => {}
                Err(e) => log::warn!("{}: cannot read the document ({e:?})", self.label),
            }
        }
        if let Some(lease) = plan.take_lease {
            if self.in_flight.is_none() && HostSharedData.set(&self.key, &lease, cas).is_ok() {
                self.fetch(now);
            }
        }
        newer
    }

    fn fetch(&mut self, now: u64) {
        let s = &self.source;
        let headers = vec![
            (":method", "GET"),
            (":path", s.path.as_str()),
            (":authority", s.authority.as_str()),
            (":scheme", "http"),
            ("accept", "application/json"),
        ];
        match hostcalls::dispatch_http_call(
            &s.cluster,
            headers,
            None,
            vec![],
            Duration::from_millis(s.timeout_ms),
        ) {
            Ok(token) => self.in_flight = Some(token),
            Err(e) => self.failed(now, &format!("dispatch_http_call: {e:?}")),
        }
    }

    /// Logs a failed fetch and pushes the lease `retry_seconds` ahead; every VM keeps its
    /// document.
    fn failed(&self, now: u64, why: &str) {
        log::warn!(
            "{}: fetch failed: {why}; keeping the current document",
            self.label
        );
        let retry = self.source.retry_seconds;
        if let Err(e) = store(&self.key, |previous| {
            after_fetch(now, previous, false, retry).encode()
        }) {
            log::warn!(
                "{}: could not store the record {}: {e}",
                self.label,
                self.key
            );
        }
    }

    /// The response to this document's fetch (`body_size` bytes) at `now`: the body of a 200 of
    /// at most `max_bytes`, to be checked by the filter and then given to [`Self::accept`] or
    /// [`Self::reject`] (the lease is held [`CHECK_LEASE_SECONDS`] meanwhile, so no other VM
    /// fetches it again). Anything else keeps the current document everywhere, logged.
    pub fn on_response(&mut self, now: u64, body_size: usize) -> Option<Vec<u8>> {
        self.in_flight = None;
        let status = http_call_response_header(":status").unwrap_or_default();
        if status != "200" {
            self.failed(now, &format!("status {status:?}"));
            return None;
        }
        if body_size > self.source.max_bytes {
            self.failed(
                now,
                &format!(
                    "response of {body_size} bytes, over max_bytes {}",
                    self.source.max_bytes
                ),
            );
            return None;
        }
        if let Err(e) = store(&self.key, |previous| {
            let mut lease = previous.and_then(Lease::decode).unwrap_or_default();
            lease.lease_until = now.saturating_add(CHECK_LEASE_SECONDS);
            lease.encode()
        }) {
            log::warn!(
                "{}: could not extend the lease {}: {e}",
                self.label,
                self.key
            );
        }
        Some(http_call_response_body(body_size))
    }

    /// A fetched body the filter checked and refused: every VM keeps its document.
    pub fn reject(&self, now: u64, why: &str) {
        self.failed(now, &format!("refused: {why}"));
    }

    /// A fetched body the filter checked and accepted, at `now`: stored for every VM. `false`
    /// (logged) when it cannot be stored; then no VM installs it, this one neither.
    pub fn accept(&mut self, now: u64, body: &[u8]) -> bool {
        // The document first, then the record that points at it (module docs of `remote`).
        let value = encode_document(now, body);
        let doc_key = document_key(&self.key);
        let written = match HostSharedData.get(&doc_key) {
            Ok((_, cas)) => HostSharedData.set(&doc_key, &value, cas),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let why = match e {
                StoreError::CasMismatch => "written by another VM meanwhile".to_string(),
                StoreError::Failed(status) => format!(
                    "host status {status}: in nginx the shm_kv zone must hold {} bytes more",
                    value.len()
                ),
            };
            self.failed(now, &format!("cannot store the document: {why}"));
            return false;
        }
        let retry = self.source.retry_seconds;
        if let Err(e) = store(&self.key, |_| after_fetch(now, None, true, retry).encode()) {
            log::warn!(
                "{}: could not store the record {}: {e}",
                self.label,
                self.key
            );
        }
        self.installed = now;
        log::info!("{}: fetched {} bytes at {now}", self.label, body.len());
        true
    }
}
