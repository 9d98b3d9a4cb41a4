//! Fixed windows of one minute, hour or day, aligned to multiples of their length since the Unix
//! epoch (UTC), as envoyproxy/ratelimit's fixed windows are (`src/limiter/base_limiter.go`,
//! `GenerateCacheKeys`: `now / unit * unit`), so that a local and a global count of the same
//! limit cover the same windows; and the record a window's count is kept in.
//!
//! Record (shared data): 25 bytes, version `2`, window index (`unix_seconds / length`, u64 LE),
//! weighted tokens counted in it (u64 LE), weighted tokens reserved in it by requests admitted
//! and not yet booked (u64 LE; `crate::pipeline` reserves at admission, the booking releases).
//! Version 1 (17 bytes, without `reserved`) is read as reserving nothing. One key per (tenant,
//! limit) is reused: a count read or written in a later window starts that window from 0
//! (counted and reserved), so keys never multiply with time and a reservation never outlives its
//! window.

use serde::Deserialize;

/// Encoded [`WindowCount`] size (bytes).
pub const RECORD_LEN: usize = 25;
const VERSION: u8 = 2;
/// Version 1's size (bytes), still read.
const RECORD_V1_LEN: usize = 17;

/// A window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86400 s (a UTC day).
    Day,
}

impl Per {
    /// Every length, in order.
    pub const ALL: [Per; 3] = [Per::Minute, Per::Hour, Per::Day];

    /// The length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Per::Minute => 60,
            Per::Hour => 3_600,
            Per::Day => 86_400,
        }
    }

    /// As written in the configuration.
    pub fn label(self) -> &'static str {
        match self {
            Per::Minute => "minute",
            Per::Hour => "hour",
            Per::Day => "day",
        }
    }
}

/// The window a moment falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// `unix_seconds / length`.
    pub index: u64,
    /// Seconds until it ends, rounded up (1 to the length): Retry-After and RateLimit's `t`.
    pub reset_secs: u64,
}

impl Window {
    /// The window of length `per` holding Unix time `now_ms` (milliseconds).
    pub fn at(per: Per, now_ms: u64) -> Window {
        let length_ms = per.seconds().saturating_mul(1_000);
        // Whole windows since the epoch.
        let index = now_ms.checked_div(length_ms).unwrap_or(0);
        let end_ms = index.saturating_add(1).saturating_mul(length_ms);
        Window {
            index,
            reset_secs: end_ms.saturating_sub(now_ms).div_ceil(1_000).max(1),
        }
    }
}

/// The tokens counted and reserved in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// The window's index.
    pub index: u64,
    /// Weighted tokens counted in it.
    pub tokens: u64,
    /// Weighted tokens reserved in it by requests not yet booked.
    pub reserved: u64,
}

/// A reservation held by a request: what its booking releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenHold {
    /// The window it was made in (released only while the record is still in it).
    pub index: u64,
    /// Weighted tokens reserved.
    pub tokens: u64,
}

impl WindowCount {
    /// The 25-byte record (see the module documentation).
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        let bytes = std::iter::once(VERSION)
            .chain(self.index.to_le_bytes())
            .chain(self.tokens.to_le_bytes())
            .chain(self.reserved.to_le_bytes());
        for (dst, b) in out.iter_mut().zip(bytes) {
            *dst = b;
        }
        out
    }

    /// Decodes [`WindowCount::encode`]'s output, or a version-1 record (nothing reserved);
    /// `None` for anything else (the count is then taken as a fresh window's, as for a missing
    /// key).
    pub fn decode(bytes: &[u8]) -> Option<WindowCount> {
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
            ))
        };
        let reserved = match (bytes.first(), bytes.len()) {
            (Some(&VERSION), RECORD_LEN) => u64_at(17)?,
            (Some(1), RECORD_V1_LEN) => 0,
            _ => return None,
        };
        Some(WindowCount {
            index: u64_at(1)?,
            tokens: u64_at(9)?,
            reserved,
        })
    }

    /// The tokens counted in `window` (0 when this record is an earlier window's).
    pub fn in_window(&self, window: &Window) -> u64 {
        if self.index == window.index {
            self.tokens
        } else {
            0
        }
    }

    /// The tokens reserved in `window` (0 when this record is an earlier window's).
    pub fn reserved_in(&self, window: &Window) -> u64 {
        if self.index == window.index {
            self.reserved
        } else {
            0
        }
    }

    /// This count with `tokens` added in `window` and `hold` released when it was made in that
    /// window (a record of an earlier window starts from 0; saturating).
    pub fn add(&self, window: &Window, tokens: u64, hold: Option<TokenHold>) -> WindowCount {
        let release = hold
            .filter(|h| h.index == window.index)
            .map_or(0, |h| h.tokens);
        WindowCount {
            index: window.index,
            tokens: self.in_window(window).saturating_add(tokens),
            reserved: self.reserved_in(window).saturating_sub(release),
        }
    }

    /// This count with `tokens` reserved in `window`.
    pub fn reserve(&self, window: &Window, tokens: u64) -> WindowCount {
        WindowCount {
            index: window.index,
            tokens: self.in_window(window),
            reserved: self.reserved_in(window).saturating_add(tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        // 2026-11-29T02:00:42.250Z.
        let now_ms = 1_795_917_642_250;
        let m = Window::at(Per::Minute, now_ms);
        assert_eq!(m.index, 1_795_917_642 / 60);
        assert_eq!(m.index * 60, 1_795_917_600, "starts at 02:00:00");
        assert_eq!(m.reset_secs, 18, "17.75 s left, rounded up");
        let h = Window::at(Per::Hour, now_ms);
        assert_eq!(h.index * 3_600, 1_795_917_600, "02:00:00 is also an hour");
        assert_eq!(h.reset_secs, 3_600 - 42);
        let d = Window::at(Per::Day, now_ms);
        assert_eq!(d.index * 86_400, 1_795_910_400, "midnight UTC");
        assert_eq!(d.reset_secs, 86_400 - 7_242);
        // At the first millisecond of a window, the whole window is left.
        assert_eq!(Window::at(Per::Minute, 1_795_917_600_000).reset_secs, 60);
        assert_eq!(Window::at(Per::Minute, 1_795_917_659_999).reset_secs, 1);
        assert_eq!(
            Window::at(Per::Minute, 1_795_917_660_000).index,
            m.index + 1
        );
        // The extremes of the clock never trap.
        assert_eq!(Window::at(Per::Day, 0).reset_secs, 86_400);
        assert!(Window::at(Per::Day, u64::MAX).reset_secs >= 1);
    }

    #[test]
    fn records_round_trip_and_refuse_other_layouts() {
        let c = WindowCount {
            index: 29_931_960,
            tokens: u64::MAX,
            reserved: 7,
        };
        assert_eq!(WindowCount::decode(&c.encode()), Some(c));
        let mut other = c.encode();
        other[0] = 3;
        assert_eq!(WindowCount::decode(&other), None);
        assert_eq!(WindowCount::decode(&c.encode()[..24]), None);
        assert_eq!(WindowCount::decode(&[]), None);
        // Version 1 (17 bytes, written before reservations) is read as reserving nothing.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&c.index.to_le_bytes());
        v1.extend_from_slice(&c.tokens.to_le_bytes());
        assert_eq!(
            WindowCount::decode(&v1),
            Some(WindowCount { reserved: 0, ..c })
        );
        let mut v1_long = v1.clone();
        v1_long.push(0);
        assert_eq!(WindowCount::decode(&v1_long), None);
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let w = Window::at(Per::Minute, 120_000);
        let old = WindowCount {
            index: w.index - 1,
            tokens: 500,
            reserved: 90,
        };
        assert_eq!(old.in_window(&w), 0);
        assert_eq!(
            old.add(&w, 7, None),
            WindowCount {
                index: w.index,
                tokens: 7,
                reserved: 0
            }
        );
        let now = WindowCount {
            index: w.index,
            tokens: u64::MAX - 1,
            reserved: 0,
        };
        assert_eq!(now.add(&w, 5, None).tokens, u64::MAX);
    }

    #[test]
    fn a_hold_is_released_by_its_booking_only_in_its_window() {
        let w = Window::at(Per::Minute, 120_000);
        let held = WindowCount::default().reserve(&w, 300).reserve(&w, 200);
        assert_eq!((held.tokens, held.reserved), (0, 500));
        let hold = TokenHold {
            index: w.index,
            tokens: 300,
        };
        let booked = held.add(&w, 120, Some(hold));
        assert_eq!((booked.tokens, booked.reserved), (120, 200));
        // Released twice, or more than held: never below 0.
        assert_eq!(booked.add(&w, 0, Some(hold)).reserved, 0);
        // In the next window the hold is gone with its window: nothing to release.
        let next = Window::at(Per::Minute, 180_000);
        let later = held.add(&next, 50, Some(hold));
        assert_eq!((later.tokens, later.reserved), (50, 0));
    }
}
