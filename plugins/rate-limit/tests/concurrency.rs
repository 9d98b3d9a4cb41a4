//! Several simulated workers interleaved at host-call granularity, deterministically.
//!
//! Each worker is a thread, but only one runs at a time: before every shared-data operation a
//! worker hands the turn back, and once every live worker is waiting a seeded PRNG picks which
//! one performs its next operation. That explores arbitrary interleavings (including a worker
//! left waiting between its read and its write while others run many requests), reproducibly
//! per seed, under both hosts' CAS rules.

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

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};

use tollgate_common::shared_data::{MemoryStore, Read, Semantics, SharedStore, StoreError};
use tollgate_rate_limit::algorithm::{Limit, Period, State};
use tollgate_rate_limit::limiter::{
    check, ensure_creation_record, OnContention, OnStoreFull, Settings, Target, Verdict,
};
use tollgate_rate_limit::state::{decode, CreationRecord};

const T0: u64 = 1_700_006_400_000;
const ZONE: &str = "ratelimit/sim/~zone";
const WORKERS: usize = 4;

struct GateState {
    running: Option<usize>,
    waiting: Vec<usize>,
    live: usize,
    rng: u64,
}

/// Gives the turn to one waiting worker at a time, chosen by a seeded xorshift.
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

impl Gate {
    fn new(workers: usize, seed: u64) -> Self {
        Gate {
            state: Mutex::new(GateState {
                running: None,
                waiting: Vec::new(),
                live: workers,
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            }),
            cv: Condvar::new(),
        }
    }

    fn pick(st: &mut GateState) {
        if st.running.is_none() && !st.waiting.is_empty() && st.waiting.len() == st.live {
            st.waiting.sort_unstable();
            st.rng ^= st.rng << 13;
            st.rng ^= st.rng >> 7;
            st.rng ^= st.rng << 17;
            let i = (st.rng % st.waiting.len() as u64) as usize;
            st.running = Some(st.waiting.swap_remove(i));
        }
    }

    /// Waits for `me`'s next turn (also the first call of a worker).
    fn turn(&self, me: usize) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if st.running == Some(me) {
            st.running = None;
        }
        st.waiting.push(me);
        Self::pick(&mut st);
        self.cv.notify_all();
        while st.running != Some(me) {
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn exit(&self, me: usize) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.live -= 1;
        if st.running == Some(me) {
            st.running = None;
        }
        Self::pick(&mut st);
        self.cv.notify_all();
    }
}

/// A worker's view of the shared store: every operation waits for the worker's turn.
struct Scheduled<'a> {
    inner: &'a MemoryStore,
    gate: &'a Gate,
    me: usize,
}

impl SharedStore for Scheduled<'_> {
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        self.gate.turn(self.me);
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.gate.turn(self.me);
        self.inner.set(key, value, cas)
    }
}

#[derive(Default, Debug)]
struct Tally {
    allowed: BTreeMap<String, u64>,
    limited: u64,
    contention_allowed: u64,
    contention_denied: u64,
    keys_created: u64,
    refund_failures: u64,
    retries: u64,
}

struct Sim<'a> {
    semantics: Semantics,
    limits: &'a [Limit],
    clients: &'a [&'a str],
    per_worker: usize,
    cas_retries: u32,
    on_contention: OnContention,
    max_keys: u64,
}

impl Sim<'_> {
    fn run(&self, seed: u64) -> (Tally, MemoryStore) {
        let store = MemoryStore::new(self.semantics);
        // Every worker's root context runs ensure_creation_record in on_configure; one of them creates it.
        ensure_creation_record(&store, ZONE).unwrap();
        let gate = Gate::new(WORKERS, seed);
        let overflow: Vec<String> = (0..self.limits.len())
            .map(|i| format!("ratelimit/sim/r/{i}/~overflow"))
            .collect();
        let settings = Settings {
            record_key: ZONE,
            cas_retries: self.cas_retries,
            on_contention: self.on_contention,
            max_keys: self.max_keys,
            store_full: OnStoreFull::Deny,
        };
        let tallies: Vec<Tally> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..WORKERS)
                .map(|me| {
                    let (store, gate, overflow, settings) = (&store, &gate, &overflow, &settings);
                    scope.spawn(move || {
                        let view = Scheduled {
                            inner: store,
                            gate,
                            me,
                        };
                        let mut tally = Tally::default();
                        gate.turn(me);
                        for r in 0..self.per_worker {
                            let client = self.clients[(me + r) % self.clients.len()];
                            let mut targets: Vec<Target<'_>> = self
                                .limits
                                .iter()
                                .enumerate()
                                .map(|(i, l)| Target {
                                    limit: l,
                                    key: format!("ratelimit/sim/r/{i}/{client}"),
                                    overflow_key: &overflow[i],
                                    counted: true,
                                })
                                .collect();
                            // Within one window; workers' clocks differ by a few ms.
                            let now = T0 + (r as u64) + me as u64;
                            let report = check(&view, settings, &mut targets, now, 1);
                            tally.keys_created += u64::from(report.stats.keys_created);
                            tally.refund_failures += u64::from(report.stats.refund_failures);
                            tally.retries += u64::from(report.stats.cas_retries);
                            match report.verdict {
                                Verdict::Allowed(_) => {
                                    let bucket = if targets[0].key.ends_with("~overflow") {
                                        "~overflow"
                                    } else {
                                        client
                                    };
                                    *tally.allowed.entry(bucket.to_string()).or_default() += 1
                                }
                                Verdict::Limited { .. } => tally.limited += 1,
                                Verdict::ContentionAllowed => tally.contention_allowed += 1,
                                Verdict::ContentionDenied => tally.contention_denied += 1,
                                Verdict::StoreFailed(status) => {
                                    panic!("an unbounded store failed: {status}")
                                }
                            }
                        }
                        gate.exit(me);
                        tally
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut total = Tally::default();
        for t in tallies {
            for (k, v) in t.allowed {
                *total.allowed.entry(k).or_default() += v;
            }
            total.limited += t.limited;
            total.contention_allowed += t.contention_allowed;
            total.contention_denied += t.contention_denied;
            total.keys_created += t.keys_created;
            total.refund_failures += t.refund_failures;
            total.retries += t.retries;
        }
        (total, store)
    }
}

const SEEDS: u64 = 60;

fn zone(s: &MemoryStore) -> CreationRecord {
    CreationRecord::decode(&s.get(ZONE).unwrap().0.unwrap()).unwrap()
}

/// A fresh key hammered by 4 workers: exactly N admitted, the key created once, under both
/// hosts' rules (no pre-created key: the creation lock covers the first insert).
#[test]
fn a_fresh_key_admits_exactly_n_under_every_interleaving() {
    let n = 20;
    for limit in [
        Limit::fixed_window(n, Period::Minute).unwrap(),
        Limit::token_bucket(n, 1, Period::Day).unwrap(),
    ] {
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let mut retries = 0;
            for seed in 0..SEEDS {
                let sim = Sim {
                    semantics,
                    limits: &[limit],
                    clients: &["hot"],
                    per_worker: 12,
                    cas_retries: 64,
                    on_contention: OnContention::Deny,
                    max_keys: 100,
                };
                let (t, store) = sim.run(seed);
                let admitted = t.allowed.get("hot").copied().unwrap_or(0);
                assert_eq!(
                    (admitted, t.contention_denied, t.keys_created),
                    (n, 0, 1),
                    "{semantics:?} {limit:?} seed {seed}: {t:?}"
                );
                assert_eq!(t.limited, 4 * 12 - n);
                assert_eq!(
                    zone(&store),
                    CreationRecord {
                        keys: 1,
                        locked_until_ms: 0,
                        store_full: false,
                        pending: false,
                    }
                );
                retries += t.retries;
            }
            assert!(retries > 0, "the interleavings did produce CAS conflicts");
        }
    }
}

/// Two limits on one key under contention: exactly the smaller quota admitted, and the larger
/// limit's count equals the admissions (refunds after races leave nothing over-consumed).
#[test]
fn several_limits_stay_exact_and_refunds_leave_no_over_consumption() {
    let limits = [
        Limit::fixed_window(30, Period::Minute).unwrap(),
        Limit::token_bucket(10, 1, Period::Day).unwrap(),
    ];
    for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
        for seed in 0..SEEDS {
            let sim = Sim {
                semantics,
                limits: &limits,
                clients: &["hot"],
                per_worker: 6,
                cas_retries: 64,
                on_contention: OnContention::Deny,
                max_keys: 100,
            };
            let (t, store) = sim.run(seed);
            assert_eq!(
                t.allowed.get("hot").copied(),
                Some(10),
                "{semantics:?} seed {seed}: {t:?}"
            );
            assert_eq!(t.refund_failures, 0);
            let first = decode(
                &limits[0],
                &store.get("ratelimit/sim/r/0/hot").unwrap().0.unwrap(),
            )
            .unwrap();
            assert_eq!(
                first,
                State::FixedWindow {
                    window_start_ms: T0,
                    count: 10
                },
                "{semantics:?} seed {seed}"
            );
        }
    }
}

/// Many clients, few keys allowed: exactly max_keys client keys are created whatever the
/// interleaving; the rest share the overflow bucket; nobody gets more than its quota.
#[test]
fn max_keys_is_exact_under_concurrent_creation() {
    let limits = [Limit::fixed_window(3, Period::Minute).unwrap()];
    let clients = ["c0", "c1", "c2", "c3", "c4", "c5", "c6"];
    for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
        for seed in 0..SEEDS {
            let sim = Sim {
                semantics,
                limits: &limits,
                clients: &clients,
                per_worker: 14,
                cas_retries: 64,
                on_contention: OnContention::Deny,
                max_keys: 4,
            };
            let (t, store) = sim.run(seed);
            assert_eq!(zone(&store).keys, 4, "{semantics:?} seed {seed}");
            assert_eq!(t.keys_created, 5, "4 client keys and the overflow bucket");
            assert_eq!(
                store.len(),
                4 + 1 + 1,
                "client keys, overflow, creation record"
            );
            assert!(t.allowed.values().all(|&n| n <= 3), "{t:?}");
            let total: u64 = t.allowed.values().sum();
            assert_eq!(
                total,
                5 * 3,
                "4 clients and the overflow bucket, 3 each: {t:?}"
            );
            assert_eq!(t.contention_denied, 0);
        }
    }
}

/// With no retries, contention happens; fail-open admits those requests without charging them,
/// and the charged admissions still never exceed the quota.
#[test]
fn fail_open_and_fail_closed_under_real_contention() {
    let n = 20;
    let limits = [Limit::fixed_window(n, Period::Minute).unwrap()];
    for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
        for on_contention in [OnContention::Allow, OnContention::Deny] {
            let (mut contended, mut admitted_total) = (0, 0);
            for seed in 0..SEEDS {
                let sim = Sim {
                    semantics,
                    limits: &limits,
                    clients: &["hot"],
                    per_worker: 8,
                    cas_retries: 0,
                    on_contention,
                    max_keys: 100,
                };
                let (t, store) = sim.run(seed);
                let charged = t.allowed.get("hot").copied().unwrap_or(0);
                assert!(charged <= n, "{t:?}");
                let count = match decode(
                    &limits[0],
                    &store.get("ratelimit/sim/r/0/hot").unwrap().0.unwrap(),
                ) {
                    Some(State::FixedWindow { count, .. }) => count,
                    other => panic!("{other:?}"),
                };
                assert_eq!(count, charged, "every admission charged exactly once");
                match on_contention {
                    OnContention::Allow => assert_eq!(t.contention_denied, 0),
                    OnContention::Deny => assert_eq!(t.contention_allowed, 0),
                }
                contended += t.contention_allowed + t.contention_denied;
                admitted_total += charged + t.contention_allowed;
            }
            assert!(
                contended > 0,
                "{semantics:?} {on_contention:?}: no contention seen"
            );
            assert!(admitted_total > 0);
        }
    }
}
