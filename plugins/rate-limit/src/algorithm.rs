//! The two rate-limit algorithms as pure functions of (state, now, weight): no host, no clock.
//!
//! Time is the host's wall clock in Unix milliseconds (`proxy_get_current_time_nanoseconds`
//! divided by 10^6), passed in. Quantities are in *quota units*: requests, or the cost units of
//! the rule's weight header.
//!
//! - **Token bucket**: a bucket of `capacity` units, refilled continuously at `requests` units per
//!   period; a request of weight `w` takes `w` units or is refused. The level is fixed-point: one
//!   unit is `P` *level steps*, where `P` is the period in milliseconds, so that `e` milliseconds
//!   refill exactly `e × requests` steps: no rounding, no drift and no starvation at any rate
//!   (1 per day refills as exactly as 10^9 per second). Bounds keep every product in `u64`
//!   (`capacity × P ≤ 10^9 × 86 400 000 < 2^64`); all arithmetic saturates anyway.
//! - **Fixed window**: windows aligned on the Unix epoch (`[k·P, (k+1)·P)`, so a day window is a
//!   UTC day); at most `requests` units per window. A client can get up to `2 × requests` units
//!   across a window boundary, the known trade-off of fixed windows.
//!
//! Clocks of different workers are read at slightly different moments, so a state written by one
//! worker can be a little ahead of another's `now`: within [`CLOCK_TOLERANCE_MS`] the earlier
//! `now` is simply not allowed to refill or to reopen an older window. A larger step backwards
//! (the system clock was set back) re-anchors the state at `now` without granting anything, so
//! that clients are not starved until the clock catches up.

use std::num::NonZeroU64;

use tollgate_common::arith::mul_saturating;

/// How far a state's timestamp may be ahead of `now` and still be treated as a race between
/// workers rather than the clock going backwards (milliseconds).
pub const CLOCK_TOLERANCE_MS: u64 = 1_000;

/// Largest `requests` and `capacity` accepted (quota units).
pub const MAX_UNITS: u64 = 1_000_000_000;

/// The period of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
}

impl Period {
    /// Length in seconds (the `w` parameter of RateLimit-Policy).
    pub fn seconds(self) -> u64 {
        match self {
            Period::Second => 1,
            Period::Minute => 60,
            Period::Hour => 3_600,
            Period::Day => 86_400,
        }
    }

    /// Length in milliseconds.
    pub fn millis(self) -> NonZeroU64 {
        let ms = match self {
            Period::Second => 1_000,
            Period::Minute => 60_000,
            Period::Hour => 3_600_000,
            Period::Day => 86_400_000,
        };
        NonZeroU64::new(ms).unwrap_or(NonZeroU64::MIN)
    }
}

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Continuous refill, bursts up to the capacity.
    TokenBucket,
    /// Epoch-aligned windows with a count.
    FixedWindow,
}

/// The per-key state of a limit (what shared data stores, see `state.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Token bucket: `level` in level steps (1 unit = period-in-ms steps), last refill time.
    TokenBucket {
        /// Level steps in the bucket, at most `capacity × P`.
        level: u64,
        /// Unix milliseconds of the last refill (0 in the initial state).
        updated_at_ms: u64,
    },
    /// Fixed window: the window the count belongs to.
    FixedWindow {
        /// Unix milliseconds at which the counted window starts (0 in the initial state).
        window_start_ms: u64,
        /// Units admitted in that window.
        count: u64,
    },
}

/// The outcome of one request against one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request fits.
    pub allowed: bool,
    /// Whole quota units left after this request (the `r` parameter of RateLimit).
    pub remaining: u64,
    /// Milliseconds until more quota becomes available (the `t` parameter of RateLimit): the end
    /// of the window, or the next whole unit of a token bucket; 0 when the bucket is full.
    pub reset_after_ms: u64,
    /// When refused: milliseconds until this request's weight would fit (Retry-After); else 0.
    pub retry_after_ms: u64,
    /// Fixed window: the window charged (to refund into the same window only); else 0.
    pub window_start_ms: u64,
}

/// [`Limit::fingerprint`] of these parameters.
fn fingerprint(
    algorithm: Algorithm,
    requests: NonZeroU64,
    capacity: NonZeroU64,
    period: Period,
) -> u32 {
    let mut bytes = [0u8; 25];
    let tag = match algorithm {
        Algorithm::TokenBucket => 1u8,
        Algorithm::FixedWindow => 2u8,
    };
    let fields = [requests.get(), capacity.get(), period.millis().get()];
    for (slot, chunk) in bytes
        .iter_mut()
        .zip(std::iter::once(tag).chain(fields.iter().flat_map(|f| f.to_le_bytes())))
    {
        *slot = chunk;
    }
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// One limit: an algorithm and its parameters, valid by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    algorithm: Algorithm,
    requests: NonZeroU64,
    capacity: NonZeroU64,
    period: Period,
    /// [`Limit::fingerprint`], computed once: every request reads it twice per limit (decoding
    /// and encoding the state), 2,700 instructions per request when it was recomputed.
    fingerprint: u32,
}

impl Limit {
    /// A token bucket of `capacity` units refilled with `requests` units per `period`.
    /// `None` unless both are in `1..=MAX_UNITS`.
    pub fn token_bucket(capacity: u64, requests: u64, period: Period) -> Option<Limit> {
        Some(Limit::new(
            Algorithm::TokenBucket,
            units(requests)?,
            units(capacity)?,
            period,
        ))
    }

    /// A fixed window of `requests` units per `period`. `None` unless `requests` is in
    /// `1..=MAX_UNITS`.
    pub fn fixed_window(requests: u64, period: Period) -> Option<Limit> {
        let requests = units(requests)?;
        Some(Limit::new(
            Algorithm::FixedWindow,
            requests,
            requests,
            period,
        ))
    }

    fn new(
        algorithm: Algorithm,
        requests: NonZeroU64,
        capacity: NonZeroU64,
        period: Period,
    ) -> Limit {
        Limit {
            algorithm,
            requests,
            capacity,
            period,
            fingerprint: fingerprint(algorithm, requests, capacity, period),
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Units per period (refill rate, or window quota).
    pub fn requests(&self) -> u64 {
        self.requests.get()
    }

    /// Largest burst in units (the token bucket's capacity; the window quota).
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// The period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// A 32-bit FNV-1a digest of the algorithm and parameters, stored with each state so that a
    /// state written under other parameters (after a configuration change) reads as fresh.
    /// Computed when the limit is made: the bytes hashed are the algorithm's tag (1 token bucket,
    /// 2 fixed window), then `requests`, `capacity` and the period in milliseconds as
    /// little-endian `u64`s (25 bytes).
    pub fn fingerprint(&self) -> u32 {
        self.fingerprint
    }

    /// The state of a key never seen: a full bucket, an empty window. It does not depend on the
    /// time, so every worker encodes it to the same bytes.
    pub fn initial(&self) -> State {
        match self.algorithm {
            Algorithm::TokenBucket => State::TokenBucket {
                level: self.full_level(),
                updated_at_ms: 0,
            },
            Algorithm::FixedWindow => State::FixedWindow {
                window_start_ms: 0,
                count: 0,
            },
        }
    }

    /// Applies a request of `weight` units at `now_ms` to `state`: the state to write back if
    /// the request is allowed (if refused, nothing needs writing) and the decision. A state of
    /// the other algorithm is treated as the initial state.
    pub fn apply(&self, state: State, now_ms: u64, weight: u64) -> (State, Decision) {
        match self.algorithm {
            Algorithm::TokenBucket => self.apply_token_bucket(state, now_ms, weight),
            Algorithm::FixedWindow => self.apply_fixed_window(state, now_ms, weight),
        }
    }

    /// Gives back `weight` units charged by `charged` (when a later limit of the same rule
    /// refused the request): the bucket gets them back up to its capacity; a window only if it is
    /// still the window charged.
    pub fn refund(&self, state: State, weight: u64, charged: &Decision) -> State {
        match state {
            State::TokenBucket {
                level,
                updated_at_ms,
            } if self.algorithm == Algorithm::TokenBucket => State::TokenBucket {
                level: level
                    .saturating_add(mul_saturating(weight, self.step()))
                    .min(self.full_level()),
                updated_at_ms,
            },
            State::FixedWindow {
                window_start_ms,
                count,
            } if self.algorithm == Algorithm::FixedWindow
                && window_start_ms == charged.window_start_ms =>
            {
                State::FixedWindow {
                    window_start_ms,
                    count: count.saturating_sub(weight),
                }
            }
            other => other,
        }
    }

    /// Level steps per unit: the period in milliseconds.
    fn step(&self) -> u64 {
        self.period.millis().get()
    }

    fn full_level(&self) -> u64 {
        mul_saturating(self.capacity.get(), self.step())
    }

    /// Milliseconds to refill `steps` level steps (rounded up).
    fn refill_ms(&self, steps: u64) -> u64 {
        steps.div_ceil(self.requests.get())
    }

    fn apply_token_bucket(&self, state: State, now: u64, weight: u64) -> (State, Decision) {
        let step = self.step();
        let full = self.full_level();
        let (level, updated) = match state {
            State::TokenBucket {
                level,
                updated_at_ms,
            } => (level.min(full), updated_at_ms),
            State::FixedWindow { .. } => (full, 0),
        };
        let (mut level, updated) = if now >= updated {
            let added = mul_saturating(now.saturating_sub(updated), self.requests.get());
            (level.saturating_add(added).min(full), now)
        } else if updated.saturating_sub(now) > CLOCK_TOLERANCE_MS {
            (level, now) // the clock was set back: re-anchor, grant nothing
        } else {
            (level, updated) // another worker's slightly later clock: no refill yet
        };
        // Refill counts from `updated`, which may be a little ahead of `now`.
        let lag = updated.saturating_sub(now);
        let cost = mul_saturating(weight, step);
        let allowed = level >= cost;
        let mut retry_after_ms = 0;
        if allowed {
            level = level.saturating_sub(cost);
        } else {
            retry_after_ms = lag.saturating_add(self.refill_ms(cost.saturating_sub(level)));
        }
        let remaining = level.checked_div(step).unwrap_or(0);
        let reset_after_ms = if level >= full {
            0
        } else {
            let next_unit = mul_saturating(remaining.saturating_add(1), step);
            lag.saturating_add(self.refill_ms(next_unit.saturating_sub(level)))
        };
        (
            State::TokenBucket {
                level,
                updated_at_ms: updated,
            },
            Decision {
                allowed,
                remaining,
                reset_after_ms,
                retry_after_ms,
                window_start_ms: 0,
            },
        )
    }

    fn apply_fixed_window(&self, state: State, now: u64, weight: u64) -> (State, Decision) {
        let period = self.step();
        let current = now.saturating_sub(now.checked_rem(period).unwrap_or(0));
        let (stored_start, stored_count) = match state {
            State::FixedWindow {
                window_start_ms,
                count,
            } => (window_start_ms, count),
            State::TokenBucket { .. } => (0, 0),
        };
        let (start, count) = if stored_start == current {
            (stored_start, stored_count)
        } else if stored_start < current {
            (current, 0) // a new window
        } else if stored_start.saturating_sub(now) <= CLOCK_TOLERANCE_MS {
            (stored_start, stored_count) // another worker already rolled over: count there
        } else {
            (current, stored_count) // the clock was set back: keep the count, re-anchor
        };
        let quota = self.requests.get();
        let after = count.saturating_add(weight);
        let allowed = after <= quota;
        let count = if allowed { after } else { count };
        let reset_after_ms = start.saturating_add(period).saturating_sub(now);
        (
            State::FixedWindow {
                window_start_ms: start,
                count,
            },
            Decision {
                allowed,
                remaining: quota.saturating_sub(count),
                reset_after_ms,
                retry_after_ms: if allowed { 0 } else { reset_after_ms },
                window_start_ms: start,
            },
        )
    }
}

fn units(n: u64) -> Option<NonZeroU64> {
    if n > MAX_UNITS {
        return None;
    }
    NonZeroU64::new(n)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // tests: an overflow panics, which fails the test
mod tests {
    use super::*;

    const T0: u64 = 1_700_006_400_000; // a Unix time in ms, a multiple of the day

    fn tb(capacity: u64, requests: u64, period: Period) -> Limit {
        Limit::token_bucket(capacity, requests, period).unwrap()
    }

    /// Runs `n` requests of `weight` at `now`, writing back allowed states; returns admissions.
    fn run(limit: &Limit, state: &mut State, now: u64, weight: u64, n: u32) -> u32 {
        let mut admitted = 0;
        for _ in 0..n {
            let (next, d) = limit.apply(*state, now, weight);
            if d.allowed {
                *state = next;
                admitted += 1;
            }
        }
        admitted
    }

    #[test]
    fn token_bucket_bursts_to_capacity_then_refills_at_the_rate() {
        let l = tb(20, 10, Period::Second);
        let mut s = l.initial();
        assert_eq!(run(&l, &mut s, T0, 1, 100), 20, "burst = capacity");
        let (_, d) = l.apply(s, T0, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_ms, 100, "one unit every 100 ms");
        assert_eq!(d.reset_after_ms, 100);
        assert_eq!(run(&l, &mut s, T0 + 99, 1, 5), 0);
        assert_eq!(run(&l, &mut s, T0 + 100, 1, 5), 1);
        assert_eq!(run(&l, &mut s, T0 + 1_100, 1, 100), 10, "10 per second");
        assert_eq!(
            run(&l, &mut s, T0 + 100_000, 1, 100),
            20,
            "refill stops at capacity"
        );
    }

    #[test]
    fn token_bucket_is_exact_at_slow_rates_under_constant_traffic() {
        // 1 per day, a request about every second for two days: one per day, not zero (a
        // milli-token bucket refilled per request would round every refill down to nothing).
        let l = tb(1, 1, Period::Day);
        let mut s = l.initial();
        assert_eq!(run(&l, &mut s, T0, 1, 1), 1);
        let mut admitted = 0;
        let mut now = T0;
        while now <= T0 + 2 * 86_400_000 + 10_000 {
            admitted += run(&l, &mut s, now, 1, 1);
            now += 997; // a prime step, so that refills are never aligned on whole units
        }
        assert_eq!(admitted, 2, "no drift, no starvation");
        // 3 per second, a request every millisecond for 1000 s: the burst of 3, then exactly
        // floor(999 999 ms x 3 / 1000 ms) = 2999 refilled units.
        let l = tb(3, 3, Period::Second);
        let mut s = l.initial();
        let mut admitted = 0;
        for ms in 0..1_000_000u64 {
            admitted += run(&l, &mut s, T0 + ms, 1, 1);
        }
        assert_eq!(admitted, 3 + 2_999);
    }

    #[test]
    fn token_bucket_weights() {
        let l = tb(10, 10, Period::Minute);
        let mut s = l.initial();
        assert_eq!(run(&l, &mut s, T0, 4, 1), 1);
        let (next, d) = l.apply(s, T0, 4);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
        s = next;
        let (_, d) = l.apply(s, T0, 4);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 2, "a refused request takes nothing");
        assert_eq!(d.retry_after_ms, 12_000, "2 units at 6 s each");
        assert!(d.retry_after_ms >= d.reset_after_ms);
        assert_eq!(run(&l, &mut s, T0, 2, 1), 1);
        assert!(!l.apply(s, T0, 1).1.allowed);
    }

    #[test]
    fn fixed_window_counts_per_epoch_aligned_window_and_rolls_over() {
        let l = Limit::fixed_window(3, Period::Minute).unwrap();
        let mut s = l.initial();
        let now = T0 + 15_000;
        let (next, d) = l.apply(s, now, 1);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after_ms), (2, 45_000));
        assert_eq!(d.window_start_ms, T0);
        s = next;
        assert_eq!(run(&l, &mut s, now + 1_000, 1, 10), 2);
        let (_, d) = l.apply(s, T0 + 59_999, 1);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_after_ms, d.reset_after_ms), (0, 1, 1));
        assert_eq!(run(&l, &mut s, T0 + 60_000, 1, 10), 3, "new window");
        assert_eq!(run(&l, &mut s, T0 + 120_000, 2, 10), 1, "weight 2 of 3");
        assert_eq!(run(&l, &mut s, T0 + 120_000, 1, 10), 1);
    }

    #[test]
    fn clock_going_backwards_neither_grants_nor_starves() {
        // A little behind (another worker's later clock): counted in the later window.
        let l = Limit::fixed_window(2, Period::Second).unwrap();
        let later = State::FixedWindow {
            window_start_ms: T0 + 1_000,
            count: 2,
        };
        let (_, d) = l.apply(later, T0 + 999, 1);
        assert!(!d.allowed, "the later window is full");
        assert_eq!(d.reset_after_ms, 1_001);
        // Far behind (the clock was set back an hour): re-anchored, count kept.
        let (s, d) = l.apply(later, T0 + 1_000 - 3_600_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.reset_after_ms, 1_000, "not starved for an hour");
        assert_eq!(run(&l, &mut s.clone(), T0 + 1_000 - 3_599_000, 1, 5), 2);

        let b = tb(2, 1, Period::Second);
        let ahead = State::TokenBucket {
            level: 0,
            updated_at_ms: T0 + 500,
        };
        let (_, d) = b.apply(ahead, T0, 1);
        assert!(!d.allowed);
        assert_eq!(
            d.retry_after_ms, 1_500,
            "refill counts from the later timestamp"
        );
        let (s, d) = b.apply(ahead, T0 - 3_600_000, 1);
        assert!(!d.allowed, "no tokens granted by a clock step");
        assert_eq!(d.retry_after_ms, 1_000);
        assert_eq!(
            s,
            State::TokenBucket {
                level: 0,
                updated_at_ms: T0 - 3_600_000
            }
        );
    }

    #[test]
    fn overflow_safety_at_the_extremes() {
        let big = tb(MAX_UNITS, MAX_UNITS, Period::Day);
        let s = big.initial();
        for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            for w in [0, 1, MAX_UNITS, u64::MAX] {
                let _ = big.apply(s, now, w);
                let _ = big.refund(s, w, &big.apply(s, now, w).1);
            }
        }
        let (_, d) = big.apply(s, u64::MAX, MAX_UNITS);
        assert!(d.allowed);
        let (_, d) = big.apply(s, u64::MAX, u64::MAX);
        assert!(!d.allowed, "an impossible weight is refused, not wrapped");
        let fw = Limit::fixed_window(MAX_UNITS, Period::Day).unwrap();
        let full = State::FixedWindow {
            window_start_ms: u64::MAX,
            count: u64::MAX,
        };
        let (_, d) = fw.apply(full, u64::MAX, u64::MAX);
        assert!(!d.allowed);
        let garbage = State::TokenBucket {
            level: u64::MAX,
            updated_at_ms: u64::MAX,
        };
        let (_, d) = big.apply(garbage, 0, 1);
        assert!(d.allowed, "a stored level above capacity is clamped");
        assert_eq!(d.remaining, MAX_UNITS - 1);
        assert!(Limit::token_bucket(0, 1, Period::Second).is_none());
        assert!(Limit::token_bucket(1, MAX_UNITS + 1, Period::Second).is_none());
        assert!(Limit::fixed_window(0, Period::Second).is_none());
    }

    #[test]
    fn refunds_restore_what_was_taken() {
        let b = tb(5, 1, Period::Second);
        let (taken, d) = b.apply(b.initial(), T0, 3);
        let back = b.refund(taken, 3, &d);
        assert!(b.apply(back, T0, 5).1.allowed);
        assert_eq!(
            b.refund(b.initial(), 3, &d),
            b.initial(),
            "capped at capacity"
        );
        let w = Limit::fixed_window(5, Period::Second).unwrap();
        let (taken, d) = w.apply(w.initial(), T0, 3);
        assert_eq!(
            w.refund(taken, 3, &d),
            State::FixedWindow {
                window_start_ms: T0,
                count: 0
            }
        );
        let (next_window, _) = w.apply(taken, T0 + 1_000, 1);
        assert_eq!(w.refund(next_window, 3, &d), next_window, "other window");
    }

    #[test]
    fn states_of_the_other_algorithm_read_as_initial() {
        let b = tb(2, 1, Period::Second);
        let w = Limit::fixed_window(2, Period::Second).unwrap();
        assert!(b.apply(w.initial(), T0, 2).1.allowed);
        assert!(w.apply(b.initial(), T0, 2).1.allowed);
        assert_ne!(b.fingerprint(), w.fingerprint());
        assert_ne!(
            tb(2, 1, Period::Second).fingerprint(),
            tb(2, 1, Period::Minute).fingerprint()
        );
        assert_eq!(b.fingerprint(), tb(2, 1, Period::Second).fingerprint());
    }

    #[test]
    fn fingerprints_are_the_stored_ones() {
        // Shared data keeps them, and workers of two builds share it during an upgrade: the
        // values are FNV-1a over (tag, requests, capacity, period ms), computed independently
        // (Python) and as the build before the fingerprint was kept in the limit computed them.
        assert_eq!(tb(2, 1, Period::Second).fingerprint(), 0x4c10_aac2);
        let w = Limit::fixed_window(2, Period::Second).unwrap();
        assert_eq!(w.fingerprint(), 0x2197_82dc);
        assert_eq!(
            tb(MAX_UNITS, MAX_UNITS, Period::Day).fingerprint(),
            0x9538_92e1
        );
    }
}
