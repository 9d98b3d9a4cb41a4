//! Fixed windows of one minute, hour or day, aligned to multiples of their length since the Unix
//! epoch (UTC), as envoyproxy/ratelimit's fixed windows are (`src/limiter/base_limiter.go`,
//! `GenerateCacheKeys`: `now / unit * unit`), so that a local and a global count of the same
//! limit cover the same windows; and the record a window's count is kept in.
//!
//! Record (shared data): 17 bytes, version `1`, window index (`unix_seconds / length`, u64 LE),
//! weighted tokens counted in it (u64 LE). One key per (tenant, limit) is reused: a count read or
//! written in a later window starts that window from 0, so keys never multiply with time.

use serde::Deserialize;

/// Encoded [`WindowCount`] size (bytes).
pub const RECORD_LEN: usize = 17;
const VERSION: u8 = 1;

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

/// The tokens counted in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// The window's index.
    pub index: u64,
    /// Weighted tokens counted in it.
    pub tokens: u64,
}

impl WindowCount {
    /// The 17-byte record (see the module documentation).
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        let bytes = std::iter::once(VERSION)
            .chain(self.index.to_le_bytes())
            .chain(self.tokens.to_le_bytes());
        for (dst, b) in out.iter_mut().zip(bytes) {
            *dst = b;
        }
        out
    }

    /// Decodes [`WindowCount::encode`]'s output; `None` for anything else (another size or
    /// version: the count is then taken as a fresh window's, as for a missing key).
    pub fn decode(bytes: &[u8]) -> Option<WindowCount> {
        if bytes.len() != RECORD_LEN || bytes.first() != Some(&VERSION) {
            return None;
        }
        let index: [u8; 8] = bytes.get(1..9)?.try_into().ok()?;
        let tokens: [u8; 8] = bytes.get(9..17)?.try_into().ok()?;
        Some(WindowCount {
            index: u64::from_le_bytes(index),
            tokens: u64::from_le_bytes(tokens),
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

    /// This count with `tokens` added in `window` (a record of an earlier window starts from 0;
    /// saturating).
    pub fn add(&self, window: &Window, tokens: u64) -> WindowCount {
        WindowCount {
            index: window.index,
            tokens: self.in_window(window).saturating_add(tokens),
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
        };
        assert_eq!(WindowCount::decode(&c.encode()), Some(c));
        let mut other = c.encode();
        other[0] = 2;
        assert_eq!(WindowCount::decode(&other), None);
        assert_eq!(WindowCount::decode(&c.encode()[..16]), None);
        assert_eq!(WindowCount::decode(&[]), None);
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let w = Window::at(Per::Minute, 120_000);
        let old = WindowCount {
            index: w.index - 1,
            tokens: 500,
        };
        assert_eq!(old.in_window(&w), 0);
        assert_eq!(
            old.add(&w, 7),
            WindowCount {
                index: w.index,
                tokens: 7
            }
        );
        let now = WindowCount {
            index: w.index,
            tokens: u64::MAX - 1,
        };
        assert_eq!(now.add(&w, 5).tokens, u64::MAX);
    }
}
