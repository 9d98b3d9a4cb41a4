//! The window counts in proxy-wasm shared data, read at admission and added to with CAS at the
//! booking, exact across workers. Host-free: runs against any `SharedStore`.
//!
//! # Keys and bounds
//!
//! - `cost/<ledger>/k/<tenant>/<limit>`: the (tenant, limit)'s `WindowCount` (25 bytes), one
//!   key reused from window to window.
//! - `cost/<ledger>/~tokens`: the creation record of these keys
//!   (`tollgate_common::shared_data::CreationRecord`: keys counted, creation lease, store full).
//! - `cost/<ledger>/~tokens-overflow/<minute|hour|day>`: one count per window length shared by
//!   every (tenant, limit) whose key could not be created: `max_keys` reached, the store refused
//!   the key (a full nginx zone with `eviction=none`), or another worker held the creation lease
//!   through every try. A limit is then checked against that pooled count: reached sooner,
//!   never later.
//!
//! So at most `max_keys + 4` keys, whatever tenants a client makes up: a key is created only
//! for a configured limit of a tenant (limits are per configured name, never per model a client
//! writes), and the creation record counts them (`create_once`, the ledger's mechanism).
//! The creation and overflow records are made in `on_configure` (`TokenStore::ensure`).

use tollgate_common::shared_data::{
    create_once, ensure_key, CreateError, Created, CreationRecord, KeySpace, LeaseWait,
    SharedStore, StoreError,
};

use super::config::Limit;
use super::window::{Per, TokenHold, Window, WindowCount};

/// Where the counts live and how hard an update tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenStore {
    /// `cost/<ledger>/k/`.
    prefix: String,
    /// `cost/<ledger>/~tokens`.
    record_key: String,
    /// `cost/<ledger>/~tokens-overflow/`.
    overflow_prefix: String,
    /// CAS attempts after the first, per update.
    cas_retries: u32,
    /// Most counted keys.
    max_keys: u64,
}

/// A count as read at a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    /// Weighted tokens counted in the current window.
    pub tokens: u64,
    /// Weighted tokens reserved in it by requests not yet booked.
    pub reserved: u64,
    /// Read from the shared overflow record (the key does not exist and cannot be made).
    pub pooled: bool,
}

/// What an addition did, for the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddStats {
    /// CAS mismatches and held creation leases met.
    pub cas_retries: u32,
    /// This addition created the key.
    pub created: bool,
    /// The tokens went to the overflow record.
    pub overflowed: bool,
}

/// An addition that did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAdded {
    /// What the attempt did.
    pub stats: AddStats,
    /// The host status that stopped it; `None`: the CAS attempts ran out.
    pub failed: Option<u32>,
}

impl TokenStore {
    /// The counts of ledger `ledger` (keys under `cost/<ledger>/`).
    pub fn new(ledger: &str, cas_retries: u32, max_keys: u64) -> TokenStore {
        TokenStore {
            prefix: format!("cost/{ledger}/k/"),
            record_key: format!("cost/{ledger}/~tokens"),
            overflow_prefix: format!("cost/{ledger}/~tokens-overflow/"),
            cas_retries,
            max_keys,
        }
    }

    /// The key of `tenant`'s `limit`.
    pub fn key(&self, tenant: &str, limit: &Limit) -> String {
        let mut key = String::with_capacity(
            self.prefix
                .len()
                .saturating_add(tenant.len())
                .saturating_add(limit.name.len())
                .saturating_add(1),
        );
        key.push_str(&self.prefix);
        key.push_str(tenant);
        key.push('/');
        key.push_str(&limit.name);
        key
    }

    /// The overflow record of windows of length `per`.
    pub fn overflow_key(&self, per: Per) -> String {
        format!("{}{}", self.overflow_prefix, per.label())
    }

    /// Creates the creation record and the overflow records if missing (`on_configure`, before
    /// a store can fill up).
    ///
    /// # Errors
    /// The first key that could not be read or written.
    pub fn ensure<S: SharedStore + ?Sized>(&self, store: &S) -> Result<(), (String, StoreError)> {
        ensure_key(store, &self.record_key, &CreationRecord::default().encode())
            .map_err(|e| (self.record_key.clone(), e))?;
        for per in Per::ALL {
            let key = self.overflow_key(per);
            ensure_key(store, &key, &WindowCount::default().encode()).map_err(|e| (key, e))?;
        }
        Ok(())
    }

    /// The tokens counted for `key` (a limit of length `per`) in `window`: one read, or for a key
    /// not created yet two (the creation record) or three (the overflow record, when new keys
    /// go there now).
    ///
    /// # Errors
    /// A read that failed: the count is unknown (never taken as 0).
    pub fn used<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        per: Per,
        window: &Window,
    ) -> Result<Used, StoreError> {
        let count = |v: Option<Vec<u8>>, pooled| {
            let c = v.and_then(|v| WindowCount::decode(&v)).unwrap_or_default();
            Used {
                tokens: c.in_window(window),
                reserved: c.reserved_in(window),
                pooled,
            }
        };
        if let Some(v) = store.get(key)?.0 {
            return Ok(count(Some(v), false));
        }
        let full = store
            .get(&self.record_key)?
            .0
            .and_then(|r| CreationRecord::decode(&r))
            .is_some_and(|r| r.store_full || r.keys >= self.max_keys);
        if !full {
            return Ok(count(None, false));
        }
        Ok(count(store.get(&self.overflow_key(per))?.0, true))
    }

    /// Adds `tokens` to `key` (a limit of length `per`) in the window of `now_ms` and releases
    /// `hold` (the request's reservation, if it was made in that window), creating the key under
    /// the creation lease when missing, or adding to the overflow record when it cannot be
    /// created. At most `cas_retries + 1` CAS attempts.
    ///
    /// # Errors
    /// [`NotAdded`] when the CAS attempts ran out or the store failed (its status).
    pub fn add<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        per: Per,
        now_ms: u64,
        (tokens, hold): (u64, Option<TokenHold>),
    ) -> Result<AddStats, NotAdded> {
        self.update(store, key, per, now_ms, |c, w| Some(c.add(w, tokens, hold)))
            .map(|(stats, _)| stats)
    }

    /// Reserves `estimate` weighted tokens in `key`'s window at `now_ms` unless the window is
    /// spent: counted + reserved ≥ `limit_tokens` (then nothing is written). One CAS update, so
    /// that concurrent requests of every worker see each other's reservations. Returns what was
    /// counted and reserved before, and the hold (`None`: spent, or nothing to reserve).
    ///
    /// # Errors
    /// [`NotAdded`] when the CAS attempts ran out or the store failed (its status).
    pub fn reserve<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        (per, limit_tokens): (Per, u64),
        now_ms: u64,
        estimate: u64,
    ) -> Result<(Used, Option<TokenHold>, AddStats), NotAdded> {
        let spent = |c: &WindowCount, w: &Window| {
            c.in_window(w).saturating_add(c.reserved_in(w)) >= limit_tokens
        };
        let (stats, (before, pooled)) = self.update(store, key, per, now_ms, |c, w| {
            (estimate > 0 && !spent(c, w)).then(|| c.reserve(w, estimate))
        })?;
        let window = Window::at(per, now_ms);
        let used = Used {
            tokens: before.in_window(&window),
            reserved: before.reserved_in(&window),
            pooled,
        };
        let hold = (estimate > 0 && !spent(&before, &window)).then_some(TokenHold {
            index: window.index,
            tokens: estimate,
        });
        Ok((used, hold, stats))
    }

    /// The CAS update of `key`'s count by `next` (`None`: nothing written), creating the key
    /// or moving to the overflow record as [`TokenStore::add`] says. Returns the statistics and
    /// the count read before the write (and whether it was the overflow record's).
    fn update<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        per: Per,
        now_ms: u64,
        next: impl Fn(&WindowCount, &Window) -> Option<WindowCount>,
    ) -> Result<(AddStats, (WindowCount, bool)), NotAdded> {
        let window = Window::at(per, now_ms);
        let attempts = self.cas_retries.saturating_add(1);
        let wait = LeaseWait::default();
        let overflow = self.overflow_key(per);
        let mut stats = AddStats::default();
        let mut key = key;
        let mut failures = 0u32;
        let failed = |stats, status| NotAdded {
            stats,
            failed: Some(status),
        };
        // One more turn for creating a missing key, one for moving to the overflow record.
        for _ in 0..attempts.saturating_add(2) {
            let (value, cas) = match store.get(key) {
                Ok(read) => read,
                Err(StoreError::Failed(status)) => return Err(failed(stats, status)),
                Err(StoreError::CasMismatch) => continue,
            };
            let Some(value) = value else {
                if stats.overflowed {
                    // The overflow record is made in on_configure; never created here (Envoy
                    // would insert it unconditionally over another worker's).
                    return Err(failed(
                        stats,
                        tollgate_common::shared_data::status::NOT_FOUND,
                    ));
                }
                match self.create(store, key, now_ms, &wait, &mut stats) {
                    Ok(Created::Ready) => continue,
                    Err(CreateError::Failed(status)) => return Err(failed(stats, status)),
                    Err(CreateError::Contended)
                        if store.get(key).is_ok_and(|(v, _)| v.is_some()) =>
                    {
                        continue
                    }
                    Ok(Created::SpaceFull | Created::StoreFull(_))
                    | Err(CreateError::Contended) => {
                        stats.overflowed = true;
                        key = &overflow;
                        continue;
                    }
                }
            };
            let before = WindowCount::decode(&value).unwrap_or_default();
            let Some(after) = next(&before, &window) else {
                return Ok((stats, (before, stats.overflowed)));
            };
            match cas.map(|cas| store.set(key, &after.encode(), Some(cas))) {
                Some(Ok(())) => return Ok((stats, (before, stats.overflowed))),
                Some(Err(StoreError::Failed(status))) => return Err(failed(stats, status)),
                Some(Err(StoreError::CasMismatch)) | None => {}
            }
            stats.cas_retries = stats.cas_retries.saturating_add(1);
            failures = failures.saturating_add(1);
            if failures >= attempts {
                break;
            }
        }
        Err(NotAdded {
            stats,
            failed: None,
        })
    }

    /// Creates `key` with an empty count exactly once, under the creation lease.
    fn create<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        key: &str,
        now_ms: u64,
        wait: &LeaseWait,
        stats: &mut AddStats,
    ) -> Result<Created, CreateError> {
        let zone = KeySpace {
            key: &self.record_key,
            max_keys: self.max_keys,
            // Waiting for another worker's lease costs attempts too (as the ledger's).
            attempts: self.cas_retries.saturating_add(1).saturating_mul(4),
            wait,
        };
        let (result, did) = create_once(
            store,
            &zone,
            key,
            &WindowCount::default().encode(),
            true,
            now_ms,
        );
        stats.cas_retries = stats.cas_retries.saturating_add(did.cas_retries);
        stats.created |= did.created;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::shared_data::{MemoryStore, Semantics};

    const NOW: u64 = 1_795_917_642_250;

    fn limit(name: &str, per: Per) -> Limit {
        Limit::total(name, 100, per)
    }

    fn ready(max_keys: u64, semantics: Semantics) -> (TokenStore, MemoryStore) {
        let s = TokenStore::new("t", 8, max_keys);
        let store = MemoryStore::new(semantics);
        s.ensure(&store).expect("ensure");
        (s, store)
    }

    #[test]
    fn counts_add_up_within_a_window_and_restart_in_the_next() {
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let (s, store) = ready(10, semantics);
            let key = s.key("alice", &limit("tpm", Per::Minute));
            assert_eq!(key, "cost/t/k/alice/tpm");
            let w = Window::at(Per::Minute, NOW);
            assert_eq!(
                s.used(&store, &key, Per::Minute, &w),
                Ok(Used {
                    tokens: 0,
                    reserved: 0,
                    pooled: false
                })
            );
            let first = s
                .add(&store, &key, Per::Minute, NOW, (40, None))
                .expect("add");
            assert!(first.created && !first.overflowed);
            s.add(&store, &key, Per::Minute, NOW + 1_000, (2, None))
                .expect("add");
            assert_eq!(
                s.used(&store, &key, Per::Minute, &w).expect("used").tokens,
                42
            );
            // 18 s later it is the next minute: the same key, counted from 0.
            let next = Window::at(Per::Minute, NOW + 18_000);
            assert_eq!(
                s.used(&store, &key, Per::Minute, &next)
                    .expect("used")
                    .tokens,
                0
            );
            s.add(&store, &key, Per::Minute, NOW + 18_000, (5, None))
                .expect("add");
            assert_eq!(
                s.used(&store, &key, Per::Minute, &next)
                    .expect("used")
                    .tokens,
                5
            );
            assert_eq!(store.len(), 5, "record, 3 overflow records, one key");
        }
    }

    #[test]
    fn concurrent_additions_are_exact() {
        let (s, store) = ready(10, Semantics::Envoy);
        let s = TokenStore {
            cas_retries: 1_000,
            ..s
        };
        let key = s.key("alice", &limit("tpm", Per::Minute));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..250 {
                        s.add(&store, &key, Per::Minute, NOW, (3, None))
                            .expect("add");
                    }
                });
            }
        });
        let w = Window::at(Per::Minute, NOW);
        assert_eq!(
            s.used(&store, &key, Per::Minute, &w).expect("used").tokens,
            3_000
        );
    }

    #[test]
    fn cycling_tenants_never_grows_the_store_past_max_keys() {
        let (s, store) = ready(5, Semantics::NgxWasm);
        let w = Window::at(Per::Hour, NOW);
        for i in 0..1_000 {
            let key = s.key(&format!("t{i}"), &limit("tph", Per::Hour));
            s.add(&store, &key, Per::Hour, NOW, (1, None)).expect("add");
        }
        assert_eq!(store.len(), 4 + 5, "records + max_keys keys");
        // The 995 tenants beyond share the hour's overflow record, and read it.
        let late = s.key("t999", &limit("tph", Per::Hour));
        assert_eq!(
            s.used(&store, &late, Per::Hour, &w),
            Ok(Used {
                tokens: 995,
                reserved: 0,
                pooled: true
            })
        );
        let early = s.key("t0", &limit("tph", Per::Hour));
        assert_eq!(
            s.used(&store, &early, Per::Hour, &w),
            Ok(Used {
                tokens: 1,
                reserved: 0,
                pooled: false
            })
        );
    }

    #[test]
    fn a_full_store_pools_and_a_failing_one_is_an_error() {
        let (s, store) = ready(100, Semantics::NgxWasm);
        store.set_capacity(Some(store.len()));
        let key = s.key("bob", &limit("tpd", Per::Day));
        let stats = s.add(&store, &key, Per::Day, NOW, (7, None)).expect("add");
        assert!(stats.overflowed);
        let w = Window::at(Per::Day, NOW);
        assert_eq!(
            s.used(&store, &key, Per::Day, &w),
            Ok(Used {
                tokens: 7,
                reserved: 0,
                pooled: true
            })
        );
        store.set_failing_reads(true);
        assert!(s.used(&store, &key, Per::Day, &w).is_err());
        assert!(s
            .add(&store, &key, Per::Day, NOW, (1, None))
            .expect_err("fails")
            .failed
            .is_some());
    }

    #[test]
    fn a_record_of_another_layout_counts_as_a_fresh_window() {
        let (s, store) = ready(10, Semantics::Envoy);
        let key = s.key("carol", &limit("tpm", Per::Minute));
        store.set(&key, b"garbage", None).expect("set");
        let w = Window::at(Per::Minute, NOW);
        assert_eq!(
            s.used(&store, &key, Per::Minute, &w).expect("used").tokens,
            0
        );
        s.add(&store, &key, Per::Minute, NOW, (9, None))
            .expect("add");
        assert_eq!(
            s.used(&store, &key, Per::Minute, &w).expect("used").tokens,
            9
        );
    }

    #[test]
    fn reservations_hold_the_window_and_bookings_release_them() {
        let (s, store) = ready(10, Semantics::Envoy);
        let key = s.key("alice", &limit("tpm", Per::Minute));
        let w = Window::at(Per::Minute, NOW);
        // 100 tokens a minute: 60 reserved, then 40, then the window is spent.
        let (used, first, _) = s
            .reserve(&store, &key, (Per::Minute, 100), NOW, 60)
            .expect("reserve");
        assert_eq!((used.tokens, used.reserved), (0, 0));
        let first = first.expect("held");
        let (used, second, _) = s
            .reserve(&store, &key, (Per::Minute, 100), NOW, 40)
            .expect("reserve");
        assert_eq!(used.reserved, 60);
        assert!(second.is_some());
        let (used, third, _) = s
            .reserve(&store, &key, (Per::Minute, 100), NOW, 1)
            .expect("reserve");
        assert_eq!(
            (used.reserved, third),
            (100, None),
            "spent by reservations: nothing held"
        );
        // The first booking counts 25 and releases its 60: 40 reserved, 25 counted.
        s.add(&store, &key, Per::Minute, NOW, (25, Some(first)))
            .expect("add");
        let now = s.used(&store, &key, Per::Minute, &w).expect("used");
        assert_eq!((now.tokens, now.reserved), (25, 40));
        // A request that ends without usage books 0 and releases its hold.
        s.add(&store, &key, Per::Minute, NOW, (0, second))
            .expect("add");
        let now = s.used(&store, &key, Per::Minute, &w).expect("used");
        assert_eq!((now.tokens, now.reserved), (25, 0));
        // Nothing to reserve: a read, never a write.
        let before = store.len();
        let (_, none, _) = s
            .reserve(&store, &key, (Per::Minute, 100), NOW, 0)
            .expect("read");
        assert_eq!((none, store.len()), (None, before));
    }

    #[test]
    fn concurrent_reservations_never_hold_past_a_spent_window() {
        // 4 threads race 50 reservations of 10 each on a limit of 100: exactly 10 are held.
        let (s, store) = ready(10, Semantics::NgxWasm);
        let s = TokenStore {
            cas_retries: 1_000,
            ..s
        };
        let key = s.key("alice", &limit("tpm", Per::Minute));
        let held = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        let (_, hold, _) = s
                            .reserve(&store, &key, (Per::Minute, 100), NOW, 10)
                            .expect("reserve");
                        if hold.is_some() {
                            held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(held.into_inner(), 10);
        let w = Window::at(Per::Minute, NOW);
        assert_eq!(
            s.used(&store, &key, Per::Minute, &w)
                .expect("used")
                .reserved,
            100
        );
    }
}
