//! The limiter: a request's limits checked and charged in proxy-wasm shared data with CAS, so that
//! a limit holds for the whole gateway and not per worker. Host-free: it runs against any
//! [`SharedStore`] (the host's shared data, or `MemoryStore` in tests) with the time passed in.
//!
//! # Normal path
//!
//! For each limit of the rule, in order: one read (value + CAS token), decode, apply the algorithm.
//! If a limit refuses, the request is refused and **nothing is written** (later limits are not
//! read). If all admit, each new state is written with the CAS token just read: one read and at
//! most one CAS write per limit per request, no scan.
//!
//! A CAS mismatch means another worker wrote the key in between: re-read, re-apply, retry, at most
//! `cas_retries` times after the first attempt. Then `on_contention` decides: `allow` admits the
//! request without charging the remaining limits (fail-open), `deny` refuses it and gives back
//! what it had already charged (fail-closed). Every retry is counted.
//!
//! # Several limits
//!
//! A request is admitted only if every limit admits it. A refused request consumes nothing: limits
//! are read before anything is written. The only window is a race: limit 1 committed, then limit
//! 2's CAS fails and its re-read refuses. Then limit 1's units are refunded with a CAS update
//! (best effort, `cas_retries` bound; a failed refund is counted and leaves those units consumed:
//! under-admission, never over-admission).
//!
//! # Key creation (the first-insert problem)
//!
//! In Envoy, reading a missing key gives no CAS token and a write without one is applied
//! unconditionally (so is a write with any token to a missing key), so two workers that both
//! find a key missing would both "create" it and the later write would erase what the earlier
//! one admitted. Keys are therefore created under a lock held in the creation record
//! (`ratelimit/<zone>/~zone`, which exists from `on_configure` on): take the lock with a CAS
//! write, read the key again, write its initial state only if it is still missing, release the
//! lock (CAS) while counting the key. Every creator holds the lock while it checks and writes,
//! so a key is created exactly once; the update that follows is a normal CAS update. Creation
//! costs four reads and four writes, once per key.
//!
//! **Bound that remains.** The lock is a lease of [`CREATION_LEASE_MS`], taken with the zone
//! record marked `pending` and released with the mark cleared. A lease that ran out still
//! pending is never taken over: its holder either is stalled (descheduled) inside it or died
//! writing its key, which Kong's ngx_wasm_module does to a guest whose write meets a full
//! `eviction=none` zone (a host trap, not a status). Either way new keys are refused as for a
//! full store ([`OnStoreFull`]) until the holder releases (a stalled one does; a dead one never
//! does: the zone then refuses new keys until restart, fail-closed). While the lease runs, the
//! other creators find it held: contention, `on_contention` decides (on Kong, `deny` is what
//! keeps a trapped holder's lease from admitting new clients uncharged for up to
//! [`CREATION_LEASE_MS`]). Over-admission on a fresh key needs one event: the creation record
//! itself is created twice: every VM writes it in `on_configure` if missing, and a late write can
//! release a lock just taken or reset the key count, only during start-up, before the zone has
//! any key. The late initial write then resets the key to its initial state (a full bucket, an
//! empty window) once; each worker that saw the key missing writes at most once, so a key is
//! reset at most `workers − 1` times, and each reset gives back at most one `capacity` of units.
//! Hence over-admission ≤ `(workers − 1) × capacity` per key, and 0 unless the reset lands during
//! start-up. Under ngx_wasm_module a write without CAS never overwrites an existing key, so the
//! bound there is 0.
//!
//! # Memory
//!
//! A zone holds at most `max_keys` client keys, counted in the creation record under the creation
//! lock (exact, except in case 2 above). Once full, a new client is charged in its rule limit's
//! overflow bucket (`…/~overflow`), shared by all new clients (counted). Windows reuse their key:
//! a fixed window rewrites the window start in place, a token bucket its timestamp. Keys are
//! never deleted (Envoy's shared data has no delete), so the count only grows until the gateway
//! restarts.
//!
//! # A store that fails
//!
//! An nginx zone with `eviction=none` refuses a new key once full; any host may fail a call
//! (`tollgate_common::shared_data::StoreError::Failed`). The limiter never takes a failure for
//! "no state" (which would admit the request uncharged): a client key the store refuses goes to
//! the rule limit's overflow bucket when [`OnStoreFull::Overflow`] is set (that bucket is created in
//! `on_configure`, before the zone can fill up), and every other failure, or a refused key under
//! [`OnStoreFull::Deny`], gives [`Verdict::StoreFailed`], after refunding what the request had
//! already been charged. The key-creation lease is released even when the key's write fails.

use smallvec::SmallVec;
use tollgate_common::shared_data::{
    cas_update, create_once, CreateError, Created, KeySpace, LeaseWait, SharedStore, StoreError,
};
pub use tollgate_common::shared_data::{ensure_creation_record, ensure_key, CREATION_LEASE_MS};

use crate::algorithm::{Decision, Limit, State};
use crate::state::{decode, encode};

/// What a request gets when CAS retries run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnContention {
    /// Admitted (fail-open); limits not yet charged are not charged.
    #[default]
    Allow,
    /// Refused (fail-closed); what was charged is refunded.
    Deny,
}

/// Where a new client goes when the store refuses its key (an nginx zone full, `eviction=none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreFull {
    /// [`Verdict::StoreFailed`]: the filter's `store_full` policy answers the request.
    #[default]
    Deny,
    /// Charged in the rule limit's overflow bucket, with every other such client.
    Overflow,
}

/// The limiter's settings (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The record counting the rule's client keys: `ratelimit/<zone>/<rule>/~zone`.
    pub record_key: &'a str,
    /// Retries after the first attempt, per CAS loop.
    pub cas_retries: u32,
    /// Policy when retries run out.
    pub on_contention: OnContention,
    /// Largest number of client keys of the rule.
    pub max_keys: u64,
    /// Where a client goes whose new key the store refuses.
    pub store_full: OnStoreFull,
}

/// One limit to charge for a request.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The limit.
    pub limit: &'a Limit,
    /// Its shared-data key for this client (replaced by the overflow key when the zone is full).
    pub key: String,
    /// The rule limit's overflow bucket.
    pub overflow_key: &'a str,
    /// Whether creating `key` counts against `max_keys` (client keys yes, shared buckets no).
    pub counted: bool,
}

/// Limits of a rule held without an allocation by the per-request lists (a rule has at most
/// `crate::config::MAX_LIMITS_PER_RULE`; more go to the heap).
pub const INLINE_LIMITS: usize = 2;

/// One decision per limit, in limit order.
pub type Decisions = SmallVec<[Decision; INLINE_LIMITS]>;

/// The outcome for the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every limit admitted it: the decisions in limit order.
    Allowed(Decisions),
    /// Limit `index` refused it; nothing stays charged.
    Limited {
        /// Index of the refusing limit.
        index: usize,
        /// Its decision.
        decision: Decision,
    },
    /// CAS retries ran out and `on_contention` is `allow`.
    ContentionAllowed,
    /// CAS retries ran out and `on_contention` is `deny`.
    ContentionDenied,
    /// The store failed (this host status), or refused a new key under [`OnStoreFull::Deny`];
    /// nothing stays charged.
    StoreFailed(u32),
}

/// What happened, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// CAS mismatches and creation-lock waits.
    pub cas_retries: u32,
    /// Keys this request created.
    pub keys_created: u32,
    /// Limits charged in the overflow bucket because the zone was full.
    pub overflowed: u32,
    /// Refunds that ran out of retries (units left consumed).
    pub refund_failures: u32,
    /// Creation locks found taken over when releasing them (lease exceeded).
    pub lock_lost: u32,
    /// New client keys the store refused (nginx: a full zone that evicts nothing).
    pub store_full: u32,
}

/// The verdict and the statistics of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The outcome.
    pub verdict: Verdict,
    /// Counters.
    pub stats: Stats,
}

/// Why a limit's state could not be read.
enum Unreadable {
    /// The retry budget ran out.
    Contended,
    /// The store failed (this host status).
    Failed(u32),
}

/// Checks and charges a request of `weight` units at `now_ms` (Unix ms) against `targets` (the
/// limits of its rule, in order). See the module documentation.
pub fn check<S: SharedStore + ?Sized>(
    store: &S,
    settings: &Settings<'_>,
    targets: &mut [Target<'_>],
    now_ms: u64,
    weight: u64,
) -> Report {
    let mut stats = Stats::default();
    // One deadline for every key this request creates while another worker holds the lease.
    let wait = LeaseWait::default();
    let attempts = settings.cas_retries.saturating_add(1);
    let mut pending: SmallVec<[(State, Decision, Option<u32>); INLINE_LIMITS]> = SmallVec::new();
    for (index, target) in targets.iter_mut().enumerate() {
        let (state, cas) = match read(store, settings, target, now_ms, &wait, &mut stats) {
            Ok(read) => read,
            Err(why) => return unreadable(store, settings, &[], &[], weight, stats, why),
        };
        let (next, decision) = target.limit.apply(state, now_ms, weight);
        if !decision.allowed {
            return Report {
                verdict: Verdict::Limited { index, decision },
                stats,
            };
        }
        pending.push((next, decision, cas));
    }
    let mut decisions = Decisions::new();
    for (index, &(mut next, mut decision, mut cas)) in pending.iter().enumerate() {
        let Some((charged, rest)) = targets.split_at_mut_checked(index) else {
            break;
        };
        let Some(target) = rest.first_mut() else {
            break;
        };
        let mut tries = 1u32;
        loop {
            match store.set(&target.key, &encode(target.limit, &next), cas) {
                Ok(()) => {
                    decisions.push(decision);
                    break;
                }
                Err(StoreError::Failed(status)) => {
                    let why = Unreadable::Failed(status);
                    return unreadable(store, settings, charged, &decisions, weight, stats, why);
                }
                Err(StoreError::CasMismatch) => {}
            }
            stats.cas_retries = stats.cas_retries.saturating_add(1);
            if tries >= attempts {
                let why = Unreadable::Contended;
                return unreadable(store, settings, charged, &decisions, weight, stats, why);
            }
            tries = tries.saturating_add(1);
            let (state, fresh_cas) = match read(store, settings, target, now_ms, &wait, &mut stats)
            {
                Ok(read) => read,
                Err(why) => {
                    return unreadable(store, settings, charged, &decisions, weight, stats, why)
                }
            };
            (next, decision) = target.limit.apply(state, now_ms, weight);
            cas = fresh_cas;
            if !decision.allowed {
                refund(store, settings, charged, &decisions, weight, &mut stats);
                return Report {
                    verdict: Verdict::Limited { index, decision },
                    stats,
                };
            }
        }
    }
    Report {
        verdict: Verdict::Allowed(decisions),
        stats,
    }
}

/// The verdict when a limit's state could not be read or written: `on_contention` for a
/// contended key; [`Verdict::StoreFailed`] for a failed store (what was charged is refunded).
fn unreadable<S: SharedStore + ?Sized>(
    store: &S,
    settings: &Settings<'_>,
    charged: &[Target<'_>],
    decisions: &[Decision],
    weight: u64,
    mut stats: Stats,
    why: Unreadable,
) -> Report {
    let verdict = match (why, settings.on_contention) {
        (Unreadable::Contended, OnContention::Allow) => Verdict::ContentionAllowed,
        (Unreadable::Contended, OnContention::Deny) => {
            refund(store, settings, charged, decisions, weight, &mut stats);
            Verdict::ContentionDenied
        }
        (Unreadable::Failed(status), _) => {
            refund(store, settings, charged, decisions, weight, &mut stats);
            Verdict::StoreFailed(status)
        }
    };
    Report { verdict, stats }
}

/// The current state of `target` and its CAS token, creating the key if it is missing (and
/// switching to the overflow bucket if the rule's keys are all taken, or the store refuses the
/// key under [`OnStoreFull::Overflow`]).
fn read<S: SharedStore + ?Sized>(
    store: &S,
    settings: &Settings<'_>,
    target: &mut Target<'_>,
    now_ms: u64,
    wait: &LeaseWait,
    stats: &mut Stats,
) -> Result<(State, Option<u32>), Unreadable> {
    let get = |key: &str| match store.get(key) {
        Ok(read) => Ok(read),
        Err(StoreError::Failed(status)) => Err(Unreadable::Failed(status)),
        Err(StoreError::CasMismatch) => Err(Unreadable::Contended),
    };
    // At most: the client key, then the overflow bucket.
    for _ in 0..2 {
        let (value, cas) = get(&target.key)?;
        if let Some(value) = value {
            let state = decode(target.limit, &value).unwrap_or_else(|| target.limit.initial());
            return Ok((state, cas));
        }
        let initial = encode(target.limit, &target.limit.initial());
        let created = match create(store, settings, target, &initial, now_ms, wait, stats) {
            Ok(created) => Some(created),
            Err(Unreadable::Contended) => None,
            Err(e) => return Err(e),
        };
        let to_overflow = match created {
            // The creation lease stayed held through every try: its holder may have created
            // the key meanwhile; if not, a client key is charged in the overflow bucket (an
            // existing key: an update, never a creation) rather than left to `on_contention`,
            // which would admit it uncharged under `allow`. Under Kong's module a holder that
            // met a full zone died there (a host trap) and holds the lease until it runs out.
            None => {
                let (value, cas) = get(&target.key)?;
                if let Some(value) = value {
                    let state =
                        decode(target.limit, &value).unwrap_or_else(|| target.limit.initial());
                    return Ok((state, cas));
                }
                if !target.counted {
                    return Err(Unreadable::Contended);
                }
                true
            }
            Some(Created::Ready) => false,
            Some(Created::SpaceFull) => true,
            Some(Created::StoreFull(status)) => {
                stats.store_full = stats.store_full.saturating_add(1);
                if settings.store_full == OnStoreFull::Deny || !target.counted {
                    return Err(Unreadable::Failed(status));
                }
                true
            }
        };
        if to_overflow {
            stats.overflowed = stats.overflowed.saturating_add(1);
            target.key = target.overflow_key.to_string();
            target.counted = false;
            continue;
        }
        let (value, cas) = get(&target.key)?;
        return match value {
            Some(value) => Ok((
                decode(target.limit, &value).unwrap_or_else(|| target.limit.initial()),
                cas,
            )),
            None => Err(Unreadable::Contended),
        };
    }
    Err(Unreadable::Contended)
}

/// Creates `target`'s key with `initial` exactly once, under the zone's creation lease
/// (`tollgate_common::shared_data::create_once`, see the module documentation).
fn create<S: SharedStore + ?Sized>(
    store: &S,
    settings: &Settings<'_>,
    target: &Target<'_>,
    initial: &[u8],
    now_ms: u64,
    wait: &LeaseWait,
    stats: &mut Stats,
) -> Result<Created, Unreadable> {
    let attempts = settings.cas_retries.saturating_add(1);
    let zone = KeySpace {
        key: settings.record_key,
        max_keys: settings.max_keys,
        attempts,
        wait,
    };
    let (result, did) = create_once(store, &zone, &target.key, initial, target.counted, now_ms);
    stats.cas_retries = stats.cas_retries.saturating_add(did.cas_retries);
    stats.keys_created = stats.keys_created.saturating_add(u32::from(did.created));
    stats.lock_lost = stats.lock_lost.saturating_add(u32::from(did.lock_lost));
    result.map_err(|e| match e {
        CreateError::Contended => Unreadable::Contended,
        CreateError::Failed(status) => Unreadable::Failed(status),
    })
}

/// Gives back `weight` units to each of `charged` (their decisions in `decisions`).
fn refund<S: SharedStore + ?Sized>(
    store: &S,
    settings: &Settings<'_>,
    charged: &[Target<'_>],
    decisions: &[Decision],
    weight: u64,
    stats: &mut Stats,
) {
    let attempts = settings.cas_retries.saturating_add(1);
    for (target, decision) in charged.iter().zip(decisions) {
        let limit = target.limit;
        let result = cas_update(store, &target.key, attempts, |value| {
            let state = decode(limit, value?)?;
            Some(encode(limit, &limit.refund(state, weight, decision)).to_vec())
        });
        match result {
            Ok(retries) => stats.cas_retries = stats.cas_retries.saturating_add(retries),
            Err(c) => {
                stats.cas_retries = stats.cas_retries.saturating_add(c.retries);
                stats.refund_failures = stats.refund_failures.saturating_add(1);
            }
        }
    }
}
