//! The limiter against the in-memory shared data, under Envoy's and ngx_wasm_module's CAS rules:
//! operation counts, several limits, refunds, contention policies, the key bound, and the
//! first-insert handling with a worker paused at chosen host calls.

// A test crate: its helpers (outside #[test] functions, which clippy.toml already covers) may
// unwrap, index and panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable
)]

use std::cell::{Cell, RefCell};

use tollgate_common::shared_data::{MemoryStore, Read, Semantics, SharedStore, StoreError};
use tollgate_rate_limit::algorithm::{Limit, Period, State};
use tollgate_rate_limit::limiter::{
    check, ensure_creation_record, OnContention, OnStoreFull, Settings, Target, Verdict,
    CREATION_LEASE_MS,
};
use tollgate_rate_limit::state::{decode, encode, CreationRecord};

const T0: u64 = 1_700_006_400_000; // Unix ms, aligned on the day
const ZONE: &str = "ratelimit/t/~zone";
const BOTH: [Semantics; 2] = [Semantics::Envoy, Semantics::NgxWasm];

fn settings(cas_retries: u32, on_contention: OnContention, max_keys: u64) -> Settings<'static> {
    Settings {
        record_key: ZONE,
        cas_retries,
        on_contention,
        max_keys,
        store_full: OnStoreFull::Deny,
    }
}

fn store(semantics: Semantics) -> MemoryStore {
    let s = MemoryStore::new(semantics);
    assert_eq!(ensure_creation_record(&s, ZONE), Ok(true));
    assert_eq!(ensure_creation_record(&s, ZONE), Ok(false), "only once");
    s
}

fn targets<'a>(limits: &'a [Limit], client: &str) -> Vec<Target<'a>> {
    limits
        .iter()
        .enumerate()
        .map(|(i, l)| Target {
            limit: l,
            key: format!("ratelimit/t/r/{i}/{client}"),
            overflow_key: OVERFLOW[i],
            counted: true,
        })
        .collect()
}

const OVERFLOW: [&str; 4] = [
    "ratelimit/t/r/0/~overflow",
    "ratelimit/t/r/1/~overflow",
    "ratelimit/t/r/2/~overflow",
    "ratelimit/t/r/3/~overflow",
];

fn run<S: SharedStore + ?Sized>(
    s: &S,
    st: &Settings<'_>,
    limits: &[Limit],
    client: &str,
    now: u64,
    weight: u64,
) -> Verdict {
    check(s, st, &mut targets(limits, client), now, weight).verdict
}

fn allowed(v: &Verdict) -> bool {
    matches!(v, Verdict::Allowed(_))
}

fn zone(s: &MemoryStore) -> CreationRecord {
    CreationRecord::decode(&s.get(ZONE).unwrap().0.unwrap()).unwrap()
}

fn state(s: &MemoryStore, limit: &Limit, key: &str) -> State {
    decode(limit, &s.get(key).unwrap().0.unwrap()).unwrap()
}

#[test]
fn exact_and_one_read_at_most_one_write_per_limit_once_the_key_exists() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 100);
        let limits = [Limit::fixed_window(5, Period::Minute).unwrap()];
        assert!(
            allowed(&run(&s, &st, &limits, "alice", T0, 1)),
            "creates the key"
        );
        assert_eq!(
            zone(&s),
            CreationRecord {
                keys: 1,
                locked_until_ms: 0,
                store_full: false,
                pending: false,
            }
        );
        let mut admitted = 1;
        for i in 0..20 {
            let before = s.ops();
            let v = run(&s, &st, &limits, "alice", T0 + i, 1);
            let after = s.ops();
            assert_eq!(after.reads - before.reads, 1, "{sem:?}: one read");
            if allowed(&v) {
                admitted += 1;
                assert_eq!(after.writes - before.writes, 1, "one CAS write");
            } else {
                assert_eq!(after.writes - before.writes, 0, "a refusal writes nothing");
                let Verdict::Limited { index, decision } = v else {
                    panic!("{v:?}")
                };
                assert_eq!(index, 0);
                assert_eq!(decision.remaining, 0);
                assert_eq!(decision.retry_after_ms, 60_000 - i);
            }
        }
        assert_eq!(admitted, 5);
        assert_eq!(
            s.len(),
            2,
            "the creation record and one key: the window reuses its key"
        );
        assert!(
            allowed(&run(&s, &st, &limits, "alice", T0 + 60_000, 1)),
            "next window"
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s.keys()[0].1, 21, "state value: 21 bytes");
    }
}

#[test]
fn keys_are_isolated() {
    let s = store(Semantics::Envoy);
    let st = settings(8, OnContention::Allow, 100);
    let limits = [Limit::token_bucket(3, 1, Period::Hour).unwrap()];
    for client in ["a", "b"] {
        let n = (0..10)
            .filter(|_| allowed(&run(&s, &st, &limits, client, T0, 1)))
            .count();
        assert_eq!(n, 3, "{client}");
    }
    assert_eq!(zone(&s).keys, 2);
}

#[test]
fn a_refused_request_consumes_nothing_from_other_limits() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 100);
        // The second limit refuses first: the first limit must not lose units.
        let limits = [
            Limit::fixed_window(10, Period::Minute).unwrap(),
            Limit::fixed_window(2, Period::Minute).unwrap(),
        ];
        let verdicts: Vec<Verdict> = (0..5).map(|_| run(&s, &st, &limits, "c", T0, 1)).collect();
        assert_eq!(verdicts.iter().filter(|v| allowed(v)).count(), 2);
        assert!(matches!(verdicts[2], Verdict::Limited { index: 1, .. }));
        let first = state(&s, &limits[0], "ratelimit/t/r/0/c");
        assert_eq!(
            first,
            State::FixedWindow {
                window_start_ms: T0,
                count: 2
            }
        );
        // The first refuses: the second is not even read.
        let limits = [
            Limit::token_bucket(1, 1, Period::Day).unwrap(),
            Limit::fixed_window(10, Period::Minute).unwrap(),
        ];
        assert!(allowed(&run(&s, &st, &limits, "d", T0, 1)));
        let before = s.ops();
        assert!(matches!(
            run(&s, &st, &limits, "d", T0, 1),
            Verdict::Limited { index: 0, .. }
        ));
        assert_eq!(
            (s.ops().reads - before.reads, s.ops().writes - before.writes),
            (1, 0)
        );
    }
}

/// A store that calls `hook` before each operation (with the operation and key), so that a test
/// can make "another worker" act between two host calls of the worker under test.
struct Hooked<'a, F: Fn(&'static str, &str)> {
    inner: &'a MemoryStore,
    hook: F,
}

impl<F: Fn(&'static str, &str)> SharedStore for Hooked<'_, F> {
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        (self.hook)("get", key);
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        (self.hook)("set", key);
        self.inner.set(key, value, cas)
    }
}

#[test]
fn a_race_between_read_and_commit_refunds_the_earlier_limits() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 100);
        let limits = [
            Limit::token_bucket(5, 1, Period::Day).unwrap(),
            Limit::fixed_window(3, Period::Minute).unwrap(),
        ];
        assert!(allowed(&run(&s, &st, &limits, "e", T0, 1)));
        // Before our commit of limit 1, another worker fills limit 1's window.
        let fired = Cell::new(false);
        let hooked = Hooked {
            inner: &s,
            hook: |op, key| {
                if op == "set" && key.ends_with("/1/e") && !fired.replace(true) {
                    let full = State::FixedWindow {
                        window_start_ms: T0,
                        count: 3,
                    };
                    let (_, cas) = s.get(key).unwrap();
                    s.set(key, &encode(&limits[1], &full), cas).unwrap();
                }
            },
        };
        let report = check(&hooked, &st, &mut targets(&limits, "e"), T0, 1);
        assert!(
            matches!(report.verdict, Verdict::Limited { index: 1, .. }),
            "{report:?}"
        );
        assert!(report.stats.cas_retries >= 1);
        assert_eq!(report.stats.refund_failures, 0);
        let bucket = state(&s, &limits[0], "ratelimit/t/r/0/e");
        assert_eq!(
            bucket,
            State::TokenBucket {
                level: 4 * 86_400_000,
                updated_at_ms: T0
            },
            "{sem:?}: limit 0 refunded: 4 units left, as after the first request"
        );
    }
}

/// A store whose every write to `victim` is preceded by another worker's write to it.
struct Meddler<'a> {
    inner: &'a MemoryStore,
    victim: &'a str,
}

impl SharedStore for Meddler<'_> {
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        if key == self.victim {
            let (current, token) = self.inner.get(key).unwrap();
            if let Some(current) = current {
                self.inner.set(key, &current, token).unwrap();
            }
        }
        self.inner.set(key, value, cas)
    }
}

#[test]
fn contention_follows_the_policy_and_counts_retries() {
    for sem in BOTH {
        let limits = [
            Limit::fixed_window(100, Period::Minute).unwrap(),
            Limit::fixed_window(100, Period::Minute).unwrap(),
        ];
        for (policy, retries) in [
            (OnContention::Allow, 0),
            (OnContention::Allow, 2),
            (OnContention::Deny, 3),
        ] {
            let s = store(sem);
            let st = settings(retries, policy, 100);
            assert!(allowed(&run(&s, &st, &limits, "f", T0, 1)));
            let meddler = Meddler {
                inner: &s,
                victim: "ratelimit/t/r/1/f",
            };
            let report = check(&meddler, &st, &mut targets(&limits, "f"), T0, 1);
            assert_eq!(report.stats.cas_retries, retries + 1, "{sem:?} {policy:?}");
            let count0 = |s: &MemoryStore| match state(s, &limits[0], "ratelimit/t/r/0/f") {
                State::FixedWindow { count, .. } => count,
                other => panic!("{other:?}"),
            };
            match policy {
                OnContention::Allow => {
                    assert_eq!(report.verdict, Verdict::ContentionAllowed);
                    assert_eq!(count0(&s), 2, "fail-open keeps what was charged");
                }
                OnContention::Deny => {
                    assert_eq!(report.verdict, Verdict::ContentionDenied);
                    assert_eq!(count0(&s), 1, "fail-closed refunds limit 0");
                }
            }
        }
    }
}

#[test]
fn beyond_max_keys_new_clients_share_the_overflow_bucket() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 2);
        let limits = [Limit::fixed_window(2, Period::Minute).unwrap()];
        let mut overflowed = 0;
        let mut admitted = std::collections::BTreeMap::new();
        for client in ["a", "b", "c", "d", "a", "b", "c", "d", "c", "d"] {
            let report = check(&s, &st, &mut targets(&limits, client), T0, 1);
            overflowed += report.stats.overflowed;
            *admitted.entry(client).or_insert(0) += u32::from(allowed(&report.verdict));
        }
        assert_eq!(zone(&s).keys, 2, "{sem:?}: exactly max_keys client keys");
        assert_eq!(overflowed, 6, "c and d, three requests each");
        assert_eq!((admitted["a"], admitted["b"]), (2, 2));
        assert_eq!(admitted["c"] + admitted["d"], 2, "one bucket of 2 for both");
        let keys: Vec<String> = s.keys().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "ratelimit/t/r/0/a",
                "ratelimit/t/r/0/b",
                "ratelimit/t/r/0/~overflow",
                ZONE
            ]
        );
        // Shared buckets (overflow, missing key) are not counted against max_keys.
        let mut shared = vec![Target {
            limit: &limits[0],
            key: "ratelimit/t/r/0/~missing".into(),
            overflow_key: OVERFLOW[0],
            counted: false,
        }];
        assert!(allowed(&check(&s, &st, &mut shared, T0, 1).verdict));
        assert_eq!(zone(&s).keys, 2);
    }
}

#[test]
fn bad_bytes_in_shared_data_read_as_a_fresh_state() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 100);
        let limits = [Limit::fixed_window(2, Period::Minute).unwrap()];
        s.set("ratelimit/t/r/0/g", br#"{"count":99}"#, None)
            .unwrap();
        let v = run(&s, &st, &limits, "g", T0, 1);
        assert!(allowed(&v), "{v:?}");
        let Verdict::Allowed(d) = v else {
            unreachable!()
        };
        assert_eq!(d[0].remaining, 1);
        // A state of other parameters (the configuration changed) reads as fresh too.
        let other = Limit::fixed_window(3, Period::Minute).unwrap();
        let v = run(&s, &st, &[other], "g", T0, 1);
        let Verdict::Allowed(d) = v else {
            panic!("{v:?}")
        };
        assert_eq!(d[0].remaining, 2);
        // A garbage creation record is replaced, not trusted.
        s.set(ZONE, b"garbage", None).ok();
        let s2 = MemoryStore::new(sem);
        s2.set(ZONE, b"garbage", None).unwrap();
        assert!(allowed(&run(&s2, &st, &limits, "h", T0, 1)));
        assert_eq!(zone(&s2).keys, 1);
    }
}

/// While a worker holds the creation lock, others cannot create the key: they wait (retries,
/// then up to `LEASE_WAIT_MS` while the holder's lease is live), then go to the overflow bucket,
/// which this store lacks (the filter creates it in `on_configure`), so they follow the
/// contention policy. No lost update, under both semantics.
#[test]
fn the_creation_lock_excludes_other_creators() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(3, OnContention::Allow, 100);
        let limits = [Limit::fixed_window(2, Period::Minute).unwrap()];
        let other = RefCell::new(None);
        let hooked = Hooked {
            inner: &s,
            hook: |op, key| {
                // The worker under test holds the lock and is about to read the missing key.
                if op == "get"
                    && key == "ratelimit/t/r/0/k"
                    && zone(&s).locked_until_ms != 0
                    && other.borrow().is_none()
                {
                    let report = check(&s, &st, &mut targets(&limits, "k"), T0 + 5, 1);
                    *other.borrow_mut() = Some(report);
                }
            },
        };
        let ours = check(&hooked, &st, &mut targets(&limits, "k"), T0, 1);
        let theirs = other.borrow_mut().take().unwrap();
        assert_eq!(theirs.verdict, Verdict::ContentionAllowed, "{sem:?}");
        // 1 + cas_retries lock waits for the client key and as many for the overflow bucket,
        // and for the client key more while the holder's lease is live (LEASE_WAIT_MS).
        assert!(
            theirs.stats.cas_retries > 8,
            "{}: the waiter gave up after its attempts alone",
            theirs.stats.cas_retries
        );
        assert!(allowed(&ours.verdict));
        assert_eq!(ours.stats.keys_created, 1);
        assert_eq!(ours.stats.lock_lost, 0);
        assert_eq!(
            zone(&s),
            CreationRecord {
                keys: 1,
                locked_until_ms: 0,
                store_full: false,
                pending: false,
            }
        );
        assert_eq!(
            (0..5)
                .filter(|_| allowed(&run(&s, &st, &limits, "k", T0, 1)))
                .count(),
            1
        );
    }
}

/// A worker stalled for longer than the lease between reading the key as missing and writing
/// it. Its lease is still marked pending, so another worker does not take it over (before, it
/// did, created the key and admitted a full quota that the stalled worker's late initial write
/// then reset on Envoy): a pending lease past its end reads as a full store, since that is also
/// what a holder killed by Kong's host trap on a full zone leaves. The other worker's new
/// clients are refused (`store_full` policy) until the stalled one releases: no over-admission
/// on either host.
#[test]
fn a_creator_stalled_beyond_the_lease_is_not_taken_over() {
    for sem in BOTH {
        let s = store(sem);
        let st = settings(3, OnContention::Allow, 100);
        let quota = 3u64;
        let limits = [Limit::fixed_window(quota, Period::Hour).unwrap()];
        let fired = Cell::new(false);
        let during = std::cell::RefCell::new(Vec::new());
        let hooked = Hooked {
            inner: &s,
            hook: |op, key| {
                // Stalled with the lock, having read the key as missing, about to write it.
                if op == "set" && key == "ratelimit/t/r/0/k" && !fired.replace(true) {
                    let later = T0 + CREATION_LEASE_MS + 1;
                    let verdicts = (0..10).map(|_| run(&s, &st, &limits, "k", later, 1));
                    during.borrow_mut().extend(verdicts);
                }
            },
        };
        let ours = check(&hooked, &st, &mut targets(&limits, "k"), T0, 1);
        let during = during.into_inner();
        assert_eq!(during.len(), 10, "the hook ran");
        assert!(
            during.iter().all(|v| matches!(v, Verdict::StoreFailed(_))),
            "{sem:?}: {during:?}"
        );
        assert_eq!(ours.stats.lock_lost, 0, "nobody took the lease over");
        assert!(allowed(&ours.verdict));
        let later = (0..10)
            .filter(|_| allowed(&run(&s, &st, &limits, "k", T0 + 10, 1)))
            .count() as u64;
        assert_eq!(1 + later, quota, "{sem:?}: exactly the quota");
    }
}

#[test]
fn the_zone_record_is_created_on_demand_if_missing() {
    for sem in BOTH {
        let s = MemoryStore::new(sem);
        let st = settings(0, OnContention::Deny, 100);
        let limits = [Limit::fixed_window(1, Period::Minute).unwrap()];
        assert!(allowed(&run(&s, &st, &limits, "z", T0, 1)));
        assert_eq!(zone(&s).keys, 1);
    }
}

/// A lock a little ahead of our clock is another worker's (held); one far ahead is stale (the
/// clock was set back) and is taken over, so that a clock step cannot block key creation.
#[test]
fn clock_skew_and_clock_steps_around_the_creation_lock() {
    for sem in BOTH {
        let limits = [Limit::fixed_window(2, Period::Minute).unwrap()];
        let st = settings(2, OnContention::Deny, 100);
        for (ahead, held) in [
            (CREATION_LEASE_MS + 500, true),
            (3_600_000, false),
            (0, false),
        ] {
            let s = store(sem);
            let (_, cas) = s.get(ZONE).unwrap();
            let locked = CreationRecord {
                keys: 0,
                locked_until_ms: T0 + ahead,
                store_full: false,
                pending: false,
            };
            s.set(ZONE, &locked.encode(), cas).unwrap();
            let v = run(&s, &st, &limits, "m", T0, 1);
            if held {
                assert_eq!(v, Verdict::ContentionDenied, "{sem:?} {ahead}");
                assert_eq!(s.get("ratelimit/t/r/0/m").unwrap().0, None);
            } else {
                assert!(allowed(&v), "{sem:?} {ahead}: {v:?}");
                assert_eq!(
                    zone(&s),
                    CreationRecord {
                        keys: 1,
                        locked_until_ms: 0,
                        store_full: false,
                        pending: false,
                    }
                );
            }
        }
    }
}

/// A creation lease held through every try (Kong's module: its holder died in a host trap on a
/// full zone, and the lease runs for CREATION_LEASE_MS) charges a new client in the overflow
/// bucket, whatever `on_contention` says: never admitted uncharged.
#[test]
fn a_held_creation_lease_charges_new_clients_in_the_overflow_bucket() {
    for sem in BOTH {
        for policy in [OnContention::Allow, OnContention::Deny] {
            let s = store(sem);
            let st = settings(3, policy, 100);
            let limits = [Limit::fixed_window(2, Period::Day).unwrap()];
            s.set(OVERFLOW[0], &encode(&limits[0], &limits[0].initial()), None)
                .unwrap();
            let (_, cas) = s.get(ZONE).unwrap();
            let held = CreationRecord {
                keys: 0,
                locked_until_ms: T0 + CREATION_LEASE_MS,
                store_full: false,
                pending: true,
            };
            s.set(ZONE, &held.encode(), cas).unwrap();
            let verdicts: Vec<Verdict> = (0..5)
                .map(|i| run(&s, &st, &limits, &format!("new-{i}"), T0 + 1, 1))
                .collect();
            assert_eq!(
                verdicts.iter().filter(|v| allowed(v)).count(),
                2,
                "{sem:?} {policy:?}: the overflow bucket's 2: {verdicts:?}"
            );
            assert!(
                verdicts
                    .iter()
                    .all(|v| allowed(v) || matches!(v, Verdict::Limited { .. })),
                "{verdicts:?}"
            );
            assert_eq!(s.get("ratelimit/t/r/0/new-0").unwrap().0, None);
        }
    }
}

/// A full store that evicts nothing (nginx `eviction=none`): existing clients stay limited, a new
/// client is refused (`deny`) or charged in the overflow bucket (`overflow`), the creation lease
/// is never left held, and a store whose reads fail never admits uncharged.
#[test]
fn a_full_store_lifts_no_limit_and_leaves_no_lease() {
    for sem in BOTH {
        for policy in [OnStoreFull::Deny, OnStoreFull::Overflow] {
            let s = store(sem);
            let limits = [
                Limit::fixed_window(2, Period::Minute).unwrap(),
                Limit::fixed_window(3, Period::Minute).unwrap(),
            ];
            let st = Settings {
                store_full: policy,
                ..settings(8, OnContention::Allow, 100)
            };
            // The overflow buckets exist before the store fills (the filter's on_configure).
            for (i, l) in limits.iter().enumerate() {
                s.set(OVERFLOW[i], &encode(l, &l.initial()), None).unwrap();
            }
            assert!(allowed(&run(&s, &st, &limits, "old", T0, 1)));
            s.set_capacity(Some(s.len()));
            let report = check(&s, &st, &mut targets(&limits, "new"), T0, 1);
            // Deny stops at the first refused key; overflow goes on to the second limit.
            let refused = if policy == OnStoreFull::Deny { 1 } else { 2 };
            assert_eq!(report.stats.store_full, refused, "{sem:?} {policy:?}");
            match policy {
                OnStoreFull::Deny => {
                    assert_eq!(report.verdict, Verdict::StoreFailed(10));
                    assert_eq!(
                        state(&s, &limits[0], OVERFLOW[0]),
                        limits[0].initial(),
                        "nothing charged"
                    );
                }
                OnStoreFull::Overflow => {
                    assert!(allowed(&report.verdict));
                    assert_eq!(report.stats.overflowed, 2);
                    // The overflow bucket (2 per minute) is shared by every new client.
                    assert!(allowed(&run(&s, &st, &limits, "new2", T0, 1)));
                    assert!(matches!(
                        run(&s, &st, &limits, "new3", T0, 1),
                        Verdict::Limited { index: 0, .. }
                    ));
                }
            }
            assert_eq!(zone(&s).locked_until_ms, 0, "the lease is released");
            assert_eq!(
                zone(&s).keys,
                2,
                "old's two keys; refused ones are not counted"
            );
            // The existing client keeps its state: one more, then limited.
            assert!(allowed(&run(&s, &st, &limits, "old", T0, 1)));
            assert!(matches!(
                run(&s, &st, &limits, "old", T0, 1),
                Verdict::Limited { index: 0, .. }
            ));
            // Reads that fail: refused, never admitted uncharged.
            s.set_failing_reads(true);
            assert_eq!(
                run(&s, &st, &limits, "old", T0 + 60_000, 1),
                Verdict::StoreFailed(10)
            );
        }
    }
}

/// A write that fails after an earlier limit was charged: that charge is given back.
#[test]
fn a_store_failing_on_a_later_limit_refunds_the_earlier_ones() {
    struct FailSecond<'a>(&'a MemoryStore);
    impl SharedStore for FailSecond<'_> {
        fn get(&self, key: &str) -> Result<Read, StoreError> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            if key.starts_with("ratelimit/t/r/1/") && self.0.get(key)?.0.is_some() {
                return Err(StoreError::Failed(10));
            }
            self.0.set(key, value, cas)
        }
    }
    for sem in BOTH {
        let s = store(sem);
        let st = settings(8, OnContention::Allow, 100);
        let limits = [
            Limit::fixed_window(5, Period::Minute).unwrap(),
            Limit::fixed_window(5, Period::Minute).unwrap(),
        ];
        assert!(allowed(&run(&s, &st, &limits, "c", T0, 1)));
        let v = run(&FailSecond(&s), &st, &limits, "c", T0, 1);
        assert_eq!(v, Verdict::StoreFailed(10));
        let State::FixedWindow { count, .. } = state(&s, &limits[0], "ratelimit/t/r/0/c") else {
            panic!()
        };
        assert_eq!(
            count, 1,
            "{sem:?}: the second request's unit on limit 0 was refunded"
        );
    }
}
