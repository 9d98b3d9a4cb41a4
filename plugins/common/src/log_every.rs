//! At most one log line per interval for a recurring condition (a full store, a refused key),
//! so that an attacker who triggers it on every request cannot flood the proxy's log. Per VM
//! (one per worker): each worker logs at most once per interval. The condition is counted in a
//! metric on every occurrence; the log line says how many were not logged since the last one.

use std::cell::Cell;

/// A log throttle: [`LogEvery::due`] says when to write the next line.
#[derive(Debug)]
pub struct LogEvery {
    interval_ms: u64,
    /// Unix ms before which nothing is logged (0: log the first occurrence).
    next_ms: Cell<u64>,
    /// Occurrences since the last line.
    suppressed: Cell<u64>,
}

impl LogEvery {
    /// A throttle allowing one line per `interval_ms` milliseconds.
    pub const fn new(interval_ms: u64) -> LogEvery {
        LogEvery {
            interval_ms,
            next_ms: Cell::new(0),
            suppressed: Cell::new(0),
        }
    }

    /// Records one occurrence at Unix time `now_ms`: `Some(n)` when a line is due now, `n` being
    /// the occurrences not logged since the previous line; `None` otherwise.
    pub fn due(&self, now_ms: u64) -> Option<u64> {
        if now_ms < self.next_ms.get() {
            self.suppressed.set(self.suppressed.get().saturating_add(1));
            return None;
        }
        self.next_ms.set(now_ms.saturating_add(self.interval_ms));
        Some(self.suppressed.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_others() {
        let log = LogEvery::new(10_000);
        assert_eq!(log.due(1_000), Some(0));
        assert_eq!(log.due(1_001), None);
        assert_eq!(log.due(10_999), None);
        assert_eq!(log.due(11_000), Some(2));
        assert_eq!(log.due(11_000), None);
        assert_eq!(log.due(u64::MAX), Some(1));
    }
}
