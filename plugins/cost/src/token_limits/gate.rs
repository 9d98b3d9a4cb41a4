//! The admission decision: whether a request may go upstream given the tokens counted in each
//! window of the limits that apply to it, and the refusal's RateLimit header fields
//! (draft-ietf-httpapi-ratelimit-headers-10, as the rate-limit filter sends them):
//!
//! - `RateLimit-Policy` (section 3): one item per limit that applies, `"<name>";q=<tokens>;w=<window
//!   seconds>`. The quota unit `qu` is not sent: its registered values are requests, bytes and
//!   concurrent requests, none of them tokens (the limit's name says what it counts).
//! - `RateLimit` (section 4): `"<name>";r=<tokens left>;t=<seconds until the window ends>`.
//! - `Retry-After` (RFC 9110 section 10.2.3): delay-seconds until the last of the spent windows
//!   ends (the earliest moment the request can be admitted), at least 1.

use super::config::Limit;
use super::window::Window;

/// One limit that applies to a request, and its count in the current window.
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    /// The limit.
    pub limit: &'a Limit,
    /// Weighted tokens counted in `window` (own or pooled).
    pub used: u64,
    /// The current window.
    pub window: Window,
}

impl Reading<'_> {
    /// Tokens left in the window (0 once it is spent).
    pub fn remaining(&self) -> u64 {
        self.limit.tokens.saturating_sub(self.used)
    }

    /// Whether this window refuses a request: it is spent (nothing left; `used` counts the
    /// other requests' reservations).
    pub fn refuses(&self) -> bool {
        self.remaining() == 0
    }
}

/// A refusal: its header values and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Retry-After (delay-seconds).
    pub retry_after: String,
    /// RateLimit-Policy.
    pub policy: String,
    /// RateLimit.
    pub ratelimit: String,
    /// The name of the first limit that refused.
    pub limit: String,
    /// The JSON error's message.
    pub message: String,
}

/// The `RateLimit-Policy` and `RateLimit` values of `readings` (one item each, in order), as
/// read at admission: also sent on the admitted request's response (the draft allows them on
/// any response), `r` then being what was left before that request's own usage.
pub fn fields(readings: &[Reading<'_>]) -> (String, String) {
    // Without `core::fmt` (a third of this module's cost per request in the instruction counts):
    // each item is pushed with itoa's digits into a string sized for it.
    let bytes: usize = readings
        .iter()
        .map(|r| r.limit.name.len().saturating_add(56))
        .sum();
    let mut policy = String::with_capacity(bytes);
    let mut ratelimit = String::with_capacity(bytes);
    let mut digits = itoa::Buffer::new();
    let mut item = |out: &mut String, name: &str, params: [(&str, u64); 2]| {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(name);
        out.push('"');
        for (param, value) in params {
            out.push_str(param);
            out.push_str(digits.format(value));
        }
    };
    for r in readings {
        let l = r.limit;
        item(
            &mut policy,
            &l.name,
            [(";q=", l.tokens), (";w=", l.per.seconds())],
        );
        item(
            &mut ratelimit,
            &l.name,
            [(";r=", r.remaining()), (";t=", r.window.reset_secs)],
        );
    }
    (policy, ratelimit)
}

/// Whether the request is refused: `None` when no window is spent; else the refusal, naming
/// every limit that applies in its headers.
pub fn decide(readings: &[Reading<'_>]) -> Option<Refusal> {
    let refusing = readings.iter().filter(|r| r.refuses());
    let first = refusing.clone().next()?;
    let retry_after = refusing
        .map(|r| r.window.reset_secs)
        .max()
        .unwrap_or(1)
        .max(1);
    let (policy, ratelimit) = fields(readings);
    let message = format!(
        "token limit {} ({} tokens per {}) is spent; retry in {retry_after} s",
        first.limit.name,
        first.limit.tokens,
        first.limit.per.label()
    );
    Some(Refusal {
        retry_after: retry_after.to_string(),
        policy,
        ratelimit,
        limit: first.limit.name.clone(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token_limits::window::Per;

    fn limit(name: &str, tokens: u64, per: Per) -> Limit {
        Limit::total(name, tokens, per)
    }

    fn window(reset_secs: u64) -> Window {
        Window {
            index: 1,
            reset_secs,
        }
    }

    #[test]
    fn a_window_with_tokens_left_admits() {
        let l = limit("tpm", 100, Per::Minute);
        let r = [Reading {
            limit: &l,
            used: 99,
            window: window(30),
        }];
        assert_eq!(decide(&r), None);
    }

    #[test]
    fn a_spent_window_refuses_with_the_ratelimit_fields() {
        let tpm = limit("tpm", 100, Per::Minute);
        let tpd = limit("tpd", 5_000, Per::Day);
        let r = [
            Reading {
                limit: &tpm,
                used: 100,
                window: window(12),
            },
            Reading {
                limit: &tpd,
                used: 4_000,
                window: window(7_000),
            },
        ];
        let got = decide(&r).expect("refused");
        assert_eq!(got.policy, r#""tpm";q=100;w=60, "tpd";q=5000;w=86400"#);
        assert_eq!(got.ratelimit, r#""tpm";r=0;t=12, "tpd";r=1000;t=7000"#);
        assert_eq!(got.retry_after, "12", "only the spent window's end counts");
        assert_eq!(got.limit, "tpm");
        // Overspent (a response larger than what was left): still 0 left, never negative.
        let over = [Reading {
            limit: &tpm,
            used: u64::MAX,
            window: window(1),
        }];
        assert!(decide(&over).expect("refused").ratelimit.contains("r=0"));
    }

    #[test]
    fn retry_after_waits_for_the_last_spent_window() {
        let tpm = limit("tpm", 1, Per::Minute);
        let tph = limit("tph", 1, Per::Hour);
        let r = [
            Reading {
                limit: &tpm,
                used: 1,
                window: window(5),
            },
            Reading {
                limit: &tph,
                used: 3,
                window: window(900),
            },
        ];
        assert_eq!(decide(&r).expect("refused").retry_after, "900");
        assert_eq!(decide(&[]), None);
    }
}
