//! Readings of the host's wall clock (`proxy_get_current_time_nanoseconds`, the proxy-wasm ABI)
//! as u64 nanoseconds since the Unix epoch, and the figures the filters take from them.
//! `std::time::SystemTime` and `Duration` on wasm32 normalise seconds and nanoseconds and
//! detect overflow in 128 bits (a `__multi3` call), a few hundred instructions a conversion on
//! the request path; this is plain u64 arithmetic. Host-free: `crate::host_calls::now` and
//! `crate::prefetch` read the clock.

/// A reading of the host's wall clock: nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnixNanos(pub u64);

impl UnixNanos {
    /// Milliseconds since the Unix epoch (rounded down).
    pub fn millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Seconds since the Unix epoch (rounded down).
    pub fn secs(self) -> u64 {
        self.0 / 1_000_000_000
    }
}

/// Microseconds from `start` to `end`, both host clock readings (`None`: either unknown, or the
/// clock went back).
pub fn micros(start: Option<UnixNanos>, end: Option<UnixNanos>) -> Option<u64> {
    Some(end?.0.checked_sub(start?.0)? / 1_000)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{micros, UnixNanos};

    /// The u64 arithmetic against `Duration`'s own u128 figures, across second and sub-second
    /// boundaries and at the ends of the range.
    #[test]
    fn secs_millis_and_micros_match_durations_own_figures() {
        let points = [
            0u64,
            1,
            999,
            1_000,
            999_999,
            1_000_000,
            999_999_999,
            1_000_000_000,
            1_764_460_800_123_456_789,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &start in &points {
            for &end in &points {
                let d = Duration::from_nanos(end);
                assert_eq!(u128::from(UnixNanos(end).millis()), d.as_millis());
                assert_eq!(UnixNanos(end).secs(), d.as_secs());
                let us = micros(Some(UnixNanos(start)), Some(UnixNanos(end)));
                match end.checked_sub(start) {
                    Some(e) => {
                        assert_eq!(
                            us.map(u128::from),
                            Some(Duration::from_nanos(e).as_micros())
                        )
                    }
                    None => assert_eq!(us, None, "the clock went back: {start} > {end}"),
                }
            }
        }
        assert_eq!(micros(None, Some(UnixNanos(5))), None);
    }
}
