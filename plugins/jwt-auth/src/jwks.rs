//! Remote JWKS shared by every VM of the gateway through proxy-wasm shared data, so that the
//! JWKS is fetched once per `cache_duration_seconds` for the whole gateway, not once per worker.
//!
//! One shared-data value per JWKS URL holds the last good document and a fetch lease:
//!
//! ```text
//! byte 0      version (1)
//! bytes 1..9  fetched_at   u64 little-endian, Unix seconds of the last good fetch (0: never)
//! bytes 9..17 lease_until  u64 little-endian, Unix seconds until which one VM is fetching
//! bytes 17..  the JWKS document (JSON) of the last good fetch
//! ```
//!
//! Every VM reads the value on each tick (one read per second). A VM that finds it stale takes
//! the lease with a CAS write and fetches; the others keep using the current keys and pick up
//! the new document when its `fetched_at` changes. A failed fetch keeps the old document and
//! pushes the lease `retry_seconds` ahead. Bound: while the key does not exist yet, a write
//! with no CAS value is unconditional in Envoy, so at start-up up to one fetch per VM may run.

/// Current record layout version.
pub const VERSION: u8 = 1;
const HEADER: usize = 17;

/// The decoded shared-data value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Unix seconds of the last good fetch (0: never).
    pub fetched_at: u64,
    /// Unix seconds until which a fetch is under way.
    pub lease_until: u64,
    /// JWKS JSON of the last good fetch.
    pub body: Vec<u8>,
}

impl Record {
    /// Encodes the record (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER.saturating_add(self.body.len()));
        out.push(VERSION);
        out.extend_from_slice(&self.fetched_at.to_le_bytes());
        out.extend_from_slice(&self.lease_until.to_le_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// Decodes a record; `None` if it is too short or of another version (then it is rewritten).
    pub fn decode(bytes: &[u8]) -> Option<Record> {
        let (&version, rest) = bytes.split_first()?;
        if version != VERSION {
            return None;
        }
        let fetched_at = u64::from_le_bytes(rest.get(0..8)?.try_into().ok()?);
        let lease_until = u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?);
        Some(Record {
            fetched_at,
            lease_until,
            body: rest.get(16..)?.to_vec(),
        })
    }
}

/// What a VM should do on a tick.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickPlan {
    /// A newer good document to parse and install (its `fetched_at` and body).
    pub install: Option<(u64, Vec<u8>)>,
    /// Take the lease by writing this value with the CAS just read, then fetch.
    pub take_lease: Option<Vec<u8>>,
}

/// Plans a tick at `now` given the shared value (if any), the `fetched_at` of the keys this VM
/// has installed (0: none), the cache duration and the call timeout (seconds).
pub fn plan_tick(
    now: u64,
    shared: Option<&[u8]>,
    installed: u64,
    ttl: u64,
    timeout_s: u64,
) -> TickPlan {
    let record = shared.and_then(Record::decode);
    let mut plan = TickPlan::default();
    let (fetched_at, lease_until, body) = match &record {
        Some(r) => (r.fetched_at, r.lease_until, r.body.as_slice()),
        None => (0, 0, &[][..]),
    };
    if fetched_at != 0 && fetched_at != installed {
        plan.install = Some((fetched_at, body.to_vec()));
    }
    let stale = fetched_at == 0 || now >= fetched_at.saturating_add(ttl);
    if stale && now >= lease_until {
        let lease = Record {
            fetched_at,
            lease_until: now.saturating_add(timeout_s).saturating_add(1),
            body: body.to_vec(),
        };
        plan.take_lease = Some(lease.encode());
    }
    plan
}

/// The value to write after a fetch at `now`: the new document if `fetched` is `Some`, else
/// the previous document kept with the lease pushed `retry_seconds` ahead.
pub fn after_fetch(
    now: u64,
    previous: Option<&[u8]>,
    fetched: Option<&[u8]>,
    retry_seconds: u64,
) -> Record {
    match fetched {
        Some(body) => Record {
            fetched_at: now,
            lease_until: 0,
            body: body.to_vec(),
        },
        None => {
            let prev = previous.and_then(Record::decode);
            Record {
                fetched_at: prev.as_ref().map_or(0, |r| r.fetched_at),
                lease_until: now.saturating_add(retry_seconds),
                body: prev.map(|r| r.body).unwrap_or_default(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_bad_values() {
        let r = Record {
            fetched_at: 7,
            lease_until: 9,
            body: b"{}".to_vec(),
        };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(&[]), None);
        assert_eq!(Record::decode(&[2; 40]), None);
        assert_eq!(Record::decode(&[1, 0, 0]), None);
    }

    #[test]
    fn first_tick_takes_the_lease() {
        let plan = plan_tick(1000, None, 0, 300, 5);
        assert_eq!(plan.install, None);
        let lease = Record::decode(&plan.take_lease.unwrap()).unwrap();
        assert_eq!(lease.lease_until, 1006);
        assert_eq!(lease.fetched_at, 0);
    }

    #[test]
    fn others_wait_for_the_lease_then_install() {
        let leased = Record {
            fetched_at: 0,
            lease_until: 1006,
            body: vec![],
        }
        .encode();
        assert_eq!(
            plan_tick(1001, Some(&leased), 0, 300, 5),
            TickPlan::default()
        );
        let good = after_fetch(1002, Some(&leased), Some(b"jwks"), 10).encode();
        let plan = plan_tick(1003, Some(&good), 0, 300, 5);
        assert_eq!(plan.install, Some((1002, b"jwks".to_vec())));
        assert_eq!(plan.take_lease, None, "fresh document: no fetch");
        assert_eq!(
            plan_tick(1003, Some(&good), 1002, 300, 5),
            TickPlan::default()
        );
        let plan = plan_tick(1302, Some(&good), 1002, 300, 5);
        assert!(plan.take_lease.is_some(), "stale after the cache duration");
    }

    #[test]
    fn failed_fetch_keeps_keys_and_backs_off() {
        let good = after_fetch(1000, None, Some(b"jwks"), 10).encode();
        let failed = after_fetch(1400, Some(&good), None, 10);
        assert_eq!(
            (
                failed.fetched_at,
                failed.lease_until,
                failed.body.as_slice()
            ),
            (1000, 1410, &b"jwks"[..])
        );
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
