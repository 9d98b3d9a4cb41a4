//! Spend per tenant in proxy-wasm shared data, updated with compare-and-swap (CAS) so that no
//! worker's booking is lost. Host-free: runs against any [`SharedStore`] (the host's shared data,
//! or `MemoryStore` in tests), with the time passed in.
//!
//! # Layout and bounds
//!
//! - `cost/<ledger>/t/<tenant>`: the tenant's [`Spend`], 41 bytes: version `2`, day id
//!   (`yyyymmdd`, u32 LE), day spend (nano-USD, u64 LE), month id (`yyyymm`, u32 LE), month spend
//!   (u64 LE), total spend since the key was created (u64 LE), reserved (nano-USD held by the
//!   requests in flight, in that day, u64 LE; `crate::reservation`). **One key per tenant**,
//!   reused when a period rolls over: a booking or a read in a new day (month) sees the stored
//!   day (month) id differ and starts that period from 0 (the day's reservations included). One
//!   read checks every budget; one CAS write reserves; one CAS write books (and settles the
//!   reservation). A version-1 record (33 bytes, before reservations) is read with nothing
//!   reserved and written back as version 2; a record of any other size or version (a later
//!   build's) is an error, never read as a zero spend.
//! - `cost/<ledger>/~zone`: the creation record (`tollgate_common::shared_data::CreationRecord`, 18
//!   bytes): tenants counted, the key-creation lock's lease end (Unix ms; 0 = free), and
//!   whether the store has refused a new key.
//! - `cost/<ledger>/~overflow`: a [`Spend`] shared by every tenant first seen once `max_tenants`
//!   keys exist (their budgets are then checked against this pooled spend).
//!
//! So the ledger holds at most `max_tenants + 2` keys of at most 41 bytes plus the key names.
//! Keys are never deleted (Envoy's shared data cannot delete them), until the proxy restarts.
//!
//! # A store that cannot take a new key
//!
//! An nginx zone declared with `eviction=none` refuses a new key once full
//! (`tollgate_common::shared_data`); an evicting zone would instead drop other tenants' records,
//! resetting their spend, which is why the ledger must live in such a zone (`shm_kv cost SIZE
//! eviction=none`, sized with [`KEY_BYTES`]). A tenant whose key cannot be created is
//! booked into the overflow record (which, like the creation record and
//! the keys of tenants with a configured budget, is created in `on_configure`, before the zone
//! can fill up): its spend is never lost, only shared, and a budget checked against the pooled
//! spend is reached sooner, never later. The filter decides per request whether such a tenant
//! is refused instead (`store_full`); a read that fails is an error, never a zero spend. The
//! first refusal marks the creation record (`CreationRecord::store_full`): every worker then treats a
//! new tenant as refused at once, without taking the creation lease, so that no new tenant is
//! let through because the lease happened to be held when it came (a worker cannot wait for
//! the lease, and one that gave up cannot tell a full store from a busy one).
//!
//! # Key creation
//!
//! In Envoy, a write to a missing key is applied unconditionally whatever its CAS token, so two
//! workers that both create a tenant's key would both write, and the later write would erase a
//! booking made in between. Keys are therefore created under a lease lock held in the zone
//! record, the approach of rate-limit's limiter (see `plugins/rate-limit/src/limiter.rs`): take
//! the lock with a CAS write, re-read the key, write a zero record only if it is still missing,
//! release the lock (CAS) while counting the tenant. Bookings themselves are then plain CAS
//! updates of an existing key. The bound that remains is rate-limit's: a worker stalled for more
//! than [`CREATION_LEASE_MS`] between re-reading the missing key and writing it, while another
//! takes the expired lock, creates the key and books, would reset it once. Under ngx_wasm_module
//! a write without CAS never overwrites an existing key, so the bound there is 0.
//!
//! A booking cannot wait (proxy-wasm has no sleep): one that finds the lease held through all
//! its tries (its holder descheduled inside it, seen on a loaded 2-core machine) books into the
//! overflow record, counted as overflowed. That spend is shared, never lost; the tenant's own
//! record lacks that one booking.

use tollgate_common::shared_data::{
    create_once, ensure_key, CreateError, Created, KeySpace, LeaseWait, SharedStore, StoreError,
};
pub use tollgate_common::shared_data::{CreationRecord, CREATION_LEASE_MS};

use crate::period::Periods;

/// Encoded [`Spend`] size (bytes).
pub const SPEND_LEN: usize = 41;
/// Size of a version-1 record (no `reserved`), still read.
const SPEND_V1_LEN: usize = 33;
/// Bytes a tenant's key and value take in an nginx `shm_kv` zone with the longest names
/// (`cost/` + 128-byte ledger + `/t/` + 128-byte tenant + 41-byte value = 305 bytes of key and
/// value: 1 + 5 blocks of 64 bytes plus the zone's per-block share of its index, ~66 bytes a
/// block, see nginx-compat/services/src/kv/). Typical names (`cost/default/t/` + a 36-byte
/// tenant id: 92 bytes) take 2 blocks, ~133 bytes. Size the zone as `max_tenants` times this.
pub const KEY_BYTES: usize = 400;
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;

/// A tenant's spend (nano-USD) in the current day and month and in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// The day `day` belongs to (`yyyymmdd`).
    pub day_id: u32,
    /// Spend in that UTC day.
    pub day: u64,
    /// The month `month` belongs to (`yyyymm`).
    pub month_id: u32,
    /// Spend in that UTC month.
    pub month: u64,
    /// Spend since the key was created.
    pub total: u64,
    /// Held by requests admitted in day `day_id` and not settled yet (nano-USD): their
    /// reservations (`crate::reservation`). Reset with the day.
    pub reserved: u64,
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

impl Spend {
    /// The 41-byte encoding (see the module docs).
    pub fn encode(&self) -> [u8; SPEND_LEN] {
        let mut out = [0u8; SPEND_LEN];
        let parts: [&[u8]; 7] = [
            &[VERSION],
            &self.day_id.to_le_bytes(),
            &self.day.to_le_bytes(),
            &self.month_id.to_le_bytes(),
            &self.month.to_le_bytes(),
            &self.total.to_le_bytes(),
            &self.reserved.to_le_bytes(),
        ];
        let mut at = 0usize;
        for p in parts {
            let end = at.saturating_add(p.len());
            if let Some(dst) = out.get_mut(at..end) {
                dst.copy_from_slice(p);
            }
            at = end;
        }
        out
    }

    /// Decodes [`Spend::encode`]'s output, or a version-1 record (nothing reserved); `None`
    /// for anything else.
    pub fn decode(b: &[u8]) -> Option<Spend> {
        let reserved = match (b.len(), b.first()) {
            (SPEND_LEN, Some(&VERSION)) => le_u64(b, 33)?,
            (SPEND_V1_LEN, Some(&VERSION_1)) => 0,
            _ => return None,
        };
        Some(Spend {
            day_id: le_u32(b, 1)?,
            day: le_u64(b, 5)?,
            month_id: le_u32(b, 13)?,
            month: le_u64(b, 17)?,
            total: le_u64(b, 25)?,
            reserved,
        })
    }

    /// This spend seen in `now`'s periods: a day or month that has changed starts from 0.
    pub fn rolled(&self, now: &Periods) -> Spend {
        Spend {
            day_id: now.day,
            day: if self.day_id == now.day { self.day } else { 0 },
            month_id: now.month,
            month: if self.month_id == now.month {
                self.month
            } else {
                0
            },
            total: self.total,
            // Reservations expire with their day (a request settling later finds them gone).
            reserved: if self.day_id == now.day {
                self.reserved
            } else {
                0
            },
        }
    }

    /// This spend with `hold` released: its nano-USD taken off `reserved` (saturating) when the
    /// record is still in the day the reservation was made in; otherwise that day's
    /// reservations are already gone with it (see [`Spend::rolled`]), and nothing is taken off
    /// the new day's. Apply before [`Spend::rolled`].
    pub fn settled(&self, hold: Option<Hold>) -> Spend {
        match hold {
            Some(h) if h.day_id == self.day_id => Spend {
                reserved: self.reserved.saturating_sub(h.nano),
                ..*self
            },
            _ => *self,
        }
    }

    /// Adds `nano` nano-USD to every period (saturating).
    pub fn add(&self, nano: u64) -> Spend {
        Spend {
            day: self.day.saturating_add(nano),
            month: self.month.saturating_add(nano),
            total: self.total.saturating_add(nano),
            ..*self
        }
    }
}

/// A reservation held on a tenant's own record (`crate::reservation`): `nano` nano-USD added to
/// `reserved` in day `day_id` (`yyyymmdd`), released by the request's booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The day the reservation was made in.
    pub day_id: u32,
    /// What it holds (nano-USD).
    pub nano: u64,
}

/// A stored record that is neither layout [`Spend::decode`] reads (a later build's): an error
/// (`InternalFailure`), never a zero spend.
fn decoded(value: &[u8]) -> Result<Spend, StoreError> {
    Spend::decode(value).ok_or(StoreError::Failed(UNKNOWN_LAYOUT))
}

/// The status given for a record of an unknown layout.
const UNKNOWN_LAYOUT: u32 = tollgate_common::shared_data::status::INTERNAL_FAILURE;

/// Where a ledger lives and how hard it tries.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The ledger's name.
    pub name: String,
    /// `cost/<ledger>/t/`.
    pub tenant_prefix: String,
    /// `cost/<ledger>/~zone`.
    pub record_key: String,
    /// `cost/<ledger>/~overflow`.
    pub overflow_key: String,
    /// CAS attempts after the first, per update.
    pub cas_retries: u32,
    /// Most tenant keys.
    pub max_tenants: u64,
}

/// What a booking did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookStats {
    /// CAS mismatches and creation-lock waits.
    pub cas_retries: u32,
    /// Whether this booking created the tenant's key.
    pub created: bool,
    /// Whether the spend went to the overflow record (zone full or the key refused).
    pub overflowed: bool,
    /// Whether the store refused the tenant's new key (nginx: a full zone).
    pub store_full: bool,
    /// Whether the creation lock was found taken over on release (lease exceeded).
    pub lock_lost: bool,
}

/// Whether the spend is in its own record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The tenant's own key exists.
    Own,
    /// The tenant has no key and shares the overflow record (zone full: `max_tenants` reached,
    /// or the store refused its key); its budget is checked against the pooled spend.
    Pooled,
    /// The tenant has no key yet (spend 0); the first booking creates it.
    New,
}

/// A tenant's spend as read at a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The spend, rolled to the request's periods.
    pub spend: Spend,
    /// Where it was read.
    pub standing: Standing,
    /// The tenant's own record as read and its CAS token ([`Standing::Own`] only): the first
    /// attempt of a write that follows soon after (a reservation) starts from it instead of
    /// reading again; a write in between makes that CAS fail and the next attempt read.
    pub record: Option<(Vec<u8>, u32)>,
}

/// Why [`Ledger::open`] could not give a tenant its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// The store refused the new key (this host status; nginx: a full zone that evicts nothing).
    StoreFull(u32),
    /// The store could not be read or written (this host status).
    Failed(u32),
}

/// A booking that did not happen: the spend was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotBooked {
    /// What the attempt did.
    pub stats: BookStats,
    /// The host status that stopped it; `None`: the CAS attempts ran out.
    pub failed: Option<u32>,
}

impl Ledger {
    /// A ledger named `name` (keys under `cost/<name>/`).
    pub fn new(name: &str, cas_retries: u32, max_tenants: u64) -> Ledger {
        Ledger {
            name: name.to_string(),
            tenant_prefix: format!("cost/{name}/t/"),
            record_key: format!("cost/{name}/~zone"),
            overflow_key: format!("cost/{name}/~overflow"),
            cas_retries,
            max_tenants,
        }
    }

    /// The ledger's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shared-data key of `tenant`.
    pub fn key(&self, tenant: &str) -> String {
        let mut key = String::with_capacity(self.tenant_prefix.len().saturating_add(tenant.len()));
        key.push_str(&self.tenant_prefix);
        key.push_str(tenant);
        key
    }

    /// Creates the creation record and the overflow record if missing (the root context calls this
    /// in `on_configure`, before its worker serves requests), and the keys of `tenants` (those
    /// with a configured budget), so that they never need the creation lock and exist before the
    /// store can fill up.
    ///
    /// # Errors
    /// The first key that could not be read or written, and why (the filter logs it).
    pub fn ensure<'a, S: SharedStore + ?Sized>(
        &self,
        store: &S,
        tenants: impl Iterator<Item = &'a str>,
        now_ms: u64,
    ) -> Result<(), (String, StoreError)> {
        ensure_key(store, &self.record_key, &CreationRecord::default().encode())
            .map_err(|e| (self.record_key.clone(), e))?;
        // One deadline for every key created here while another worker holds the lease.
        let wait = LeaseWait::default();
        for key in std::iter::once(self.overflow_key.clone()).chain(tenants.map(|t| self.key(t))) {
            let mut stats = BookStats::default();
            let missing = store.get(&key).map_err(|e| (key.clone(), e))?.0.is_none();
            if missing {
                match self.create(store, &key, false, now_ms, &wait, &mut stats) {
                    Ok(Created::Ready | Created::SpaceFull) | Err(CreateError::Contended) => {}
                    Ok(Created::StoreFull(status)) | Err(CreateError::Failed(status)) => {
                        return Err((key, StoreError::Failed(status)))
                    }
                }
            }
        }
        Ok(())
    }

    /// The spend of `tenant` in `now`'s periods: one read (two or three for a tenant without a
    /// key: then the creation record tells whether it is pooled in the overflow record, whose spend
    /// counts).
    ///
    /// # Errors
    /// A read that failed, or a record of an unknown layout: the spend is unknown (never taken
    /// as 0).
    pub fn spend<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        tenant_key: &str,
        now: &Periods,
    ) -> Result<Lookup, StoreError> {
        let (value, cas) = store.get(tenant_key)?;
        let (value, standing) = match value {
            Some(v) => (Some(v), Standing::Own),
            None => {
                let full = store
                    .get(&self.record_key)?
                    .0
                    .and_then(|z| CreationRecord::decode(&z))
                    .is_some_and(|z| z.keys >= self.max_tenants);
                if full {
                    (store.get(&self.overflow_key)?.0, Standing::Pooled)
                } else {
                    (None, Standing::New)
                }
            }
        };
        let spend = match &value {
            Some(v) => decoded(v)?,
            None => Spend::default(),
        };
        let record = match (standing, value, cas) {
            (Standing::Own, Some(v), Some(cas)) => Some((v, cas)),
            _ => None,
        };
        Ok(Lookup {
            spend: spend.rolled(now),
            standing,
            record,
        })
    }

    /// The pooled spend (the overflow record) in `now`'s periods.
    ///
    /// # Errors
    /// A read that failed.
    pub fn pooled<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now: &Periods,
    ) -> Result<Spend, StoreError> {
        let spend = match store.get(&self.overflow_key)?.0 {
            Some(v) => decoded(&v)?,
            None => Spend::default(),
        };
        Ok(spend.rolled(now))
    }

    /// Gives a tenant without a key ([`Standing::New`]) its own key now, before its request goes
    /// upstream, so that a store that cannot take it is known while the request can still be
    /// refused. Returns the tenant's standing afterwards: [`Standing::Own`] (created here or by
    /// another worker, or the lease was busy: the booking will create it), or
    /// [`Standing::Pooled`] (`max_tenants` reached).
    ///
    /// # Errors
    /// [`OpenError::StoreFull`] when the store refused the key; [`OpenError::Failed`] when the
    /// creation record could not be read or written.
    pub fn open<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        tenant_key: &str,
        now_ms: u64,
        stats: &mut BookStats,
    ) -> Result<Standing, OpenError> {
        match self.create(
            store,
            tenant_key,
            true,
            now_ms,
            &LeaseWait::default(),
            stats,
        ) {
            Ok(Created::Ready) | Err(CreateError::Contended) => Ok(Standing::Own),
            Ok(Created::SpaceFull) => Ok(Standing::Pooled),
            Ok(Created::StoreFull(status)) => {
                stats.store_full = true;
                Err(OpenError::StoreFull(status))
            }
            Err(CreateError::Failed(status)) => Err(OpenError::Failed(status)),
        }
    }

    /// Adds `nano` nano-USD to the spend of `tenant_key` at Unix time `now_ms`, creating the key
    /// (or, zone full, the key refused by the store, or the creation lease held by another
    /// worker through every try, booking to the overflow record), and releases the request's
    /// reservation `hold` in the same write ([`Spend::settled`]; a hold is on the tenant's own
    /// record, so a booking that goes to the overflow record releases nothing: the hold then
    /// expires with its day). At most `cas_retries + 1` CAS attempts.
    ///
    /// # Errors
    /// [`NotBooked`] when the CAS attempts ran out or the store failed (its status; a record of
    /// an unknown layout is `InternalFailure`, left as it is).
    pub fn book<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        tenant_key: &str,
        now_ms: u64,
        nano: u64,
        hold: Option<Hold>,
    ) -> Result<BookStats, NotBooked> {
        let now = Periods::at(now_ms / 1_000);
        let attempts = self.cas_retries.saturating_add(1);
        let mut stats = BookStats::default();
        // One deadline for the tenant's key and the overflow record's, if both are created.
        let wait = LeaseWait::default();
        let mut key = tenant_key;
        let mut failures = 0u32;
        let failed = |stats, status| NotBooked {
            stats,
            failed: Some(status),
        };
        // One more turn for the creation of a missing key, one for the overflow record.
        for _ in 0..attempts.saturating_add(2) {
            let (value, cas) = match store.get(key) {
                Ok(read) => read,
                Err(StoreError::Failed(status)) => return Err(failed(stats, status)),
                Err(StoreError::CasMismatch) => continue,
            };
            let Some(value) = value else {
                match self.create(store, key, !stats.overflowed, now_ms, &wait, &mut stats) {
                    Ok(Created::Ready) => continue,
                    Ok(Created::SpaceFull) => {
                        stats.overflowed = true;
                        key = &self.overflow_key;
                        continue;
                    }
                    Ok(Created::StoreFull(status)) => {
                        if stats.overflowed {
                            // Not even the overflow record (missing, store full): lost.
                            return Err(failed(stats, status));
                        }
                        stats.store_full = true;
                        stats.overflowed = true;
                        key = &self.overflow_key;
                        continue;
                    }
                    Err(CreateError::Failed(status)) => return Err(failed(stats, status)),
                    // The lock stayed taken: the holder may have created the key meanwhile.
                    Err(CreateError::Contended)
                        if store.get(key).is_ok_and(|(v, _)| v.is_some()) =>
                    {
                        continue
                    }
                    // Another worker held the creation lease through every try (it was
                    // descheduled inside it): the spend goes to the overflow record rather than
                    // being lost, as when the zone is full.
                    Err(CreateError::Contended) if !stats.overflowed => {
                        stats.overflowed = true;
                        key = &self.overflow_key;
                        continue;
                    }
                    Err(CreateError::Contended) => {
                        return Err(NotBooked {
                            stats,
                            failed: None,
                        })
                    }
                }
            };
            let Some(stored) = Spend::decode(&value) else {
                return Err(failed(stats, UNKNOWN_LAYOUT));
            };
            let release = hold.filter(|_| !stats.overflowed);
            let next = stored.settled(release).rolled(&now).add(nano);
            match cas.map(|cas| store.set(key, &next.encode(), Some(cas))) {
                Some(Ok(())) => return Ok(stats),
                Some(Err(StoreError::Failed(status))) => return Err(failed(stats, status)),
                Some(Err(StoreError::CasMismatch)) | None => {}
            }
            stats.cas_retries = stats.cas_retries.saturating_add(1);
            failures = failures.saturating_add(1);
            if failures >= attempts {
                return Err(NotBooked {
                    stats,
                    failed: None,
                });
            }
        }
        Err(NotBooked {
            stats,
            failed: None,
        })
    }

    /// Creates `key` with a zero [`Spend`] exactly once, under the zone's creation lease
    /// (`tollgate_common::shared_data::create_once`).
    fn create<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        counted: bool,
        now_ms: u64,
        wait: &LeaseWait,
        stats: &mut BookStats,
    ) -> Result<Created, CreateError> {
        // Waiting for another worker's lease costs attempts too: allow more of them than for a
        // CAS update, since the holder needs three host calls to release it.
        let attempts = self.cas_retries.saturating_add(1).saturating_mul(4);
        let zone = KeySpace {
            key: &self.record_key,
            max_keys: self.max_tenants,
            attempts,
            wait,
        };
        let (result, did) = create_once(
            store,
            &zone,
            key,
            &Spend::default().encode(),
            counted,
            now_ms,
        );
        stats.cas_retries = stats.cas_retries.saturating_add(did.cas_retries);
        stats.created |= did.created;
        stats.lock_lost |= did.lock_lost;
        result
    }
}

/// A tenant's budget (nano-USD per UTC period; `None`: no limit for that period).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Per UTC day.
    pub day: Option<u64>,
    /// Per UTC month.
    pub month: Option<u64>,
}

/// A budget that is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    /// `day` or `month` (the longer one when both are).
    pub period: &'static str,
    /// Seconds until that period resets (the next UTC midnight or first of the month).
    pub reset_secs: u64,
}

impl Budget {
    /// Whether any period is limited.
    pub fn is_limited(&self) -> bool {
        self.day.is_some() || self.month.is_some()
    }

    /// Whether `spend` (already rolled to `now`) has reached the budget: spend + reserved ≥
    /// budget in the day or the month (the reservations of requests in flight count against
    /// both, `crate::reservation`).
    pub fn check(&self, spend: &Spend, now: &Periods) -> Option<Exceeded> {
        let held = |period: u64| period.saturating_add(spend.reserved);
        if self.month.is_some_and(|b| held(spend.month) >= b) {
            return Some(Exceeded {
                period: "month",
                reset_secs: now.month_reset_secs,
            });
        }
        if self.day.is_some_and(|b| held(spend.day) >= b) {
            return Some(Exceeded {
                period: "day",
                reset_secs: now.day_reset_secs,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::shared_data::{MemoryStore, Semantics};

    #[test]
    fn encoding_round_trips() {
        let s = Spend {
            day_id: 20250131,
            day: 1,
            month_id: 202501,
            month: u64::MAX,
            total: 7,
            reserved: 9,
        };
        assert_eq!(Spend::decode(&s.encode()), Some(s));
        assert_eq!(Spend::decode(&s.encode()[..40]), None);
        assert_eq!(
            Spend::decode(&s.encode()[..33]),
            None,
            "v2 cut to v1's size"
        );
        // A version-1 record (before reservations): read with nothing reserved.
        let mut v1 = s.encode()[..33].to_vec();
        v1[0] = 1;
        assert_eq!(Spend::decode(&v1), Some(Spend { reserved: 0, ..s }));
        let mut v3 = s.encode().to_vec();
        v3[0] = 3;
        assert_eq!(Spend::decode(&v3), None, "a later layout is never misread");
        let z = CreationRecord {
            keys: 3,
            locked_until_ms: 9,
            store_full: false,
            pending: false,
        };
        assert_eq!(CreationRecord::decode(&z.encode()), Some(z));
    }

    #[test]
    fn periods_roll_over_in_place() {
        for sem in [Semantics::Envoy, Semantics::NgxWasm] {
            let store = MemoryStore::new(sem);
            let l = Ledger::new("t", 8, 10);
            l.ensure(&store, std::iter::empty(), 0).unwrap();
            let key = l.key("alice");
            // 2025-01-31T23:00:00Z, then 2025-02-01T01:00:00Z.
            let t0 = 1_738_364_400_000;
            l.book(&store, &key, t0, 5, None).unwrap();
            l.book(&store, &key, t0, 6, None).unwrap();
            let s = l
                .spend(&store, &key, &Periods::at(t0 / 1000))
                .unwrap()
                .spend;
            assert_eq!((s.day, s.month, s.total), (11, 11, 11));
            let t1 = t0 + 2 * 3_600_000;
            let seen = l
                .spend(&store, &key, &Periods::at(t1 / 1000))
                .unwrap()
                .spend;
            assert_eq!(
                (seen.day, seen.month, seen.total),
                (0, 0, 11),
                "read in the new day and month"
            );
            l.book(&store, &key, t1, 1, None).unwrap();
            let s = l
                .spend(&store, &key, &Periods::at(t1 / 1000))
                .unwrap()
                .spend;
            assert_eq!(
                (s.day_id, s.day, s.month_id, s.month, s.total),
                (20250201, 1, 202502, 1, 12)
            );
            assert_eq!(
                store.len(),
                3,
                "zone, overflow, one tenant key: {:?}",
                store.keys()
            );
        }
    }

    #[test]
    fn zone_full_pools_new_tenants() {
        let store = MemoryStore::new(Semantics::Envoy);
        let l = Ledger::new("t", 8, 2);
        l.ensure(&store, std::iter::empty(), 0).unwrap();
        let now = Periods::at(0);
        for t in ["a", "b", "c", "d"] {
            let stats = l.book(&store, &l.key(t), 0, 10, None).unwrap();
            assert_eq!(stats.overflowed, t == "c" || t == "d", "{t}");
        }
        assert_eq!(l.spend(&store, &l.key("a"), &now).unwrap().spend.total, 10);
        assert_eq!(
            l.spend(&store, &l.key("zz"), &now).unwrap().spend.total,
            20,
            "pooled"
        );
        assert_eq!(store.len(), 4);
    }

    #[test]
    fn a_creation_lease_held_elsewhere_pools_the_spend_instead_of_losing_it() {
        for sem in [Semantics::Envoy, Semantics::NgxWasm] {
            let store = MemoryStore::new(sem);
            let l = Ledger::new("t", 2, 100);
            l.ensure(&store, std::iter::empty(), 0).unwrap();
            // Another worker took the lease at t=1000 ms and was descheduled inside it.
            let (_, cas) = store.get(&l.record_key).unwrap();
            let held = CreationRecord {
                keys: 0,
                locked_until_ms: 1_000 + CREATION_LEASE_MS,
                store_full: false,
                pending: false,
            };
            store.set(&l.record_key, &held.encode(), cas).unwrap();
            let stats = l.book(&store, &l.key("new"), 1_000, 42, None).unwrap();
            assert!(stats.overflowed && !stats.created, "{sem:?}: {stats:?}");
            assert_eq!(l.pooled(&store, &Periods::at(1)).unwrap().total, 42);
            assert_eq!(store.get(&l.key("new")).unwrap().0, None);
        }
    }

    #[test]
    fn a_full_store_pools_new_tenants_and_resets_nobody() {
        use tollgate_common::shared_data::status::INTERNAL_FAILURE;
        for sem in [Semantics::Envoy, Semantics::NgxWasm] {
            let store = MemoryStore::new(sem);
            let l = Ledger::new("t", 8, 100);
            l.ensure(&store, ["capped"].into_iter(), 0).unwrap();
            let now = Periods::at(0);
            l.book(&store, &l.key("capped"), 0, 50, None).unwrap();
            l.book(&store, &l.key("old"), 0, 9, None).unwrap();
            store.set_capacity(Some(store.len()));
            let mut stats = BookStats::default();
            assert_eq!(
                l.open(&store, &l.key("new"), 0, &mut stats),
                Err(OpenError::StoreFull(INTERNAL_FAILURE))
            );
            assert!(stats.store_full);
            let zone =
                CreationRecord::decode(&store.get(&l.record_key).unwrap().0.unwrap()).unwrap();
            assert_eq!(zone.locked_until_ms, 0, "{sem:?}: lease released");
            // Another worker now holds the creation lease (descheduled inside it): a second new
            // tenant is still told the store is full, never admitted as if it had a record
            // (before the creation record kept the refusal, `open` gave up on the lease and
            // answered `Standing::Own`).
            let (z, cas) = store.get(&l.record_key).unwrap();
            let held = CreationRecord {
                locked_until_ms: CREATION_LEASE_MS,
                ..CreationRecord::decode(&z.unwrap()).unwrap()
            };
            store.set(&l.record_key, &held.encode(), cas).unwrap();
            let mut stats = BookStats::default();
            assert_eq!(
                l.open(&store, &l.key("new2"), 0, &mut stats),
                Err(OpenError::StoreFull(INTERNAL_FAILURE)),
                "{sem:?}"
            );
            assert_eq!(
                stats.cas_retries, 0,
                "refused without waiting for the lease"
            );
            // Its spend goes to the overflow record, never lost.
            let stats = l.book(&store, &l.key("new"), 0, 7, None).unwrap();
            assert!(stats.store_full && stats.overflowed);
            assert_eq!(l.pooled(&store, &now).unwrap().total, 7);
            // Tenants with a record keep it.
            l.book(&store, &l.key("capped"), 0, 5, None).unwrap();
            let read = l.spend(&store, &l.key("capped"), &now).unwrap();
            assert_eq!((read.spend.total, read.standing), (55, Standing::Own));
            assert_eq!(l.spend(&store, &l.key("old"), &now).unwrap().spend.total, 9);
            // A read that fails is an error, never a zero spend.
            store.set_failing_reads(true);
            assert!(l.spend(&store, &l.key("capped"), &now).is_err());
            let not = l.book(&store, &l.key("capped"), 0, 1, None).unwrap_err();
            assert_eq!(not.failed, Some(INTERNAL_FAILURE));
        }
    }

    #[test]
    fn budgets() {
        let now = Periods::at(0);
        let b = Budget {
            day: Some(10),
            month: Some(100),
        };
        let s = |day, month| Spend {
            day,
            month,
            ..Spend::default()
        };
        assert_eq!(b.check(&s(9, 9), &now), None);
        assert_eq!(b.check(&s(10, 10), &now).unwrap().period, "day");
        assert_eq!(b.check(&s(10, 100), &now).unwrap().period, "month");
        assert_eq!(b.check(&s(10, 100), &now).unwrap().reset_secs, 31 * 86_400);
        assert_eq!(Budget::default().check(&s(u64::MAX, u64::MAX), &now), None);
    }
}
