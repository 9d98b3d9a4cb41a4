//! The RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-10 and Retry-After.
//!
//! - `RateLimit-Policy` (draft section 3): a Structured Fields List of quota policy items, the
//!   policy name as an sf-string with `q` (quota, units per window) and `w` (window, seconds):
//!   `"per-user";q=10;w=1`. A token bucket whose capacity differs from its refill quota adds the
//!   vendor parameter `tollgate-burst` (section 3.1 allows prefixed extension parameters).
//!   The quota unit `qu` is not sent: it defaults to `requests`; with a weight header the units
//!   are the rule's cost units, which the registry has no name for.
//! - `RateLimit` (section 4): a List of service limit items with `r` (remaining units) and `t`
//!   (seconds until more quota is available; omitted for a full token bucket, where nothing is
//!   pending): `"per-user";r=9;t=1`.
//! - `Retry-After` (RFC 9110 section 10.2.3): delay-seconds, rounded up and at least 1, never
//!   earlier than the `t` of the limit that refused (draft section 6).
//!
//! No partition key (`pk`) is sent: client keys can carry identifying data (draft section 8.2).
//! Names are restricted by the configuration to `[A-Za-z0-9._-]`, so the sf-strings need no
//! escaping.

use std::fmt::Write as _;

use crate::algorithm::{Algorithm, Decision, Limit};

/// Header names, lower case as HTTP/2 requires.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// See [`RATELIMIT_POLICY`].
pub const RATELIMIT: &str = "ratelimit";
/// See [`RATELIMIT_POLICY`].
pub const RETRY_AFTER: &str = "retry-after";

/// A quota policy item: `"name";q=<requests>;w=<period seconds>[;tollgate-burst=<capacity>]`.
pub fn policy_item(name: &str, limit: &Limit) -> String {
    let mut item = format!(
        "\"{name}\";q={};w={}",
        limit.requests(),
        limit.period().seconds()
    );
    if limit.algorithm() == Algorithm::TokenBucket && limit.capacity() != limit.requests() {
        let _ = write!(item, ";tollgate-burst={}", limit.capacity());
    }
    item
}

/// Appends a service limit item `"name";r=<remaining>[;t=<seconds>]` to a RateLimit value
/// (with the `, ` separator when `out` is not empty).
pub fn push_service_limit(out: &mut String, name: &str, decision: &Decision) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    let _ = write!(out, "\"{name}\";r={}", decision.remaining);
    if decision.reset_after_ms > 0 {
        let _ = write!(out, ";t={}", delay_seconds(decision.reset_after_ms));
    }
}

/// Milliseconds as delay-seconds, rounded up.
pub fn delay_seconds(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

/// The Retry-After value for a refusal: delay-seconds, at least 1.
pub fn retry_after_seconds(ms: u64) -> u64 {
    delay_seconds(ms).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Period;

    #[test]
    fn policy_items() {
        let fw = Limit::fixed_window(1000, Period::Day).unwrap();
        assert_eq!(policy_item("daily", &fw), r#""daily";q=1000;w=86400"#);
        let tb = Limit::token_bucket(20, 10, Period::Second).unwrap();
        assert_eq!(
            policy_item("per-user", &tb),
            r#""per-user";q=10;w=1;tollgate-burst=20"#
        );
        let tb = Limit::token_bucket(10, 10, Period::Minute).unwrap();
        assert_eq!(policy_item("m", &tb), r#""m";q=10;w=60"#);
    }

    #[test]
    fn service_limits_and_retry_after() {
        let d = |remaining, reset_after_ms| Decision {
            allowed: true,
            remaining,
            reset_after_ms,
            retry_after_ms: 0,
            window_start_ms: 0,
        };
        let mut v = String::new();
        push_service_limit(&mut v, "a", &d(9, 1));
        push_service_limit(&mut v, "b", &d(999, 3_600_000));
        push_service_limit(&mut v, "c", &d(20, 0));
        assert_eq!(v, r#""a";r=9;t=1, "b";r=999;t=3600, "c";r=20"#);
        assert_eq!(delay_seconds(1_001), 2);
        assert_eq!(delay_seconds(1_000), 1);
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(12_000), 12);
    }
}
