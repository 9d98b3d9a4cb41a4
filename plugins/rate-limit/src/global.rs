//! Global mode, host-free: a rule's `ShouldRateLimit` request and the reply as a limiter verdict.
//!
//! A global rule (`global` block, fixed windows only) asks Envoy's rate limit service
//! (`tollgate_common::rls`) instead of shared data. One call per request, one descriptor per
//! limit of the rule, in order:
//!
//! - entries `("rule", <len>:<zone>/<rule>/<limit index>)` and, for a rule with key parts,
//!   `("key", <client key>)`: the rule's key parts joined and bounded exactly as in local mode
//!   (`crate::key`: netstring-style framing, SHA-256 beyond 128 bytes or for non-printable
//!   bytes), `~missing` for `missing_key: shared`;
//! - the `limit` override: the limit's `requests` per its `per` (SECOND, MINUTE, HOUR, DAY), so
//!   the service's own configuration needs only the domain;
//! - the request's `hits_addend` is the request's weight (1 without a weight header).
//!
//! Why one framed `rule` entry and one `key` entry rather than an entry per key part: the
//! reference server (envoyproxy/ratelimit `src/limiter/cache_key.go`, `GenerateCacheKey`) keys
//! Redis by `<domain>_<key>_<value>_..._<window start>`, joining with `_`, which values may
//! contain. With several client-chosen values, two different descriptors could then share a
//! counter (`a_x`+`y` and `a`+`x_y`); here the only client-chosen value is last and the `rule`
//! value starts with its own length, so distinct descriptors give distinct Redis keys. The limit
//! index is in the descriptor because the window start alone does not separate two limits of a
//! rule (a minute window and an hour window start at the same second on the hour).
//!
//! The reply's `limit_remaining` and `duration_until_reset` become the limiter's
//! [`Decision`]s, so RateLimit headers and the 429 are those of local mode. Unlike local mode,
//! the reference server charges every descriptor of a request even when one is over limit (its
//! Redis pipeline increments all of them, `src/redis/fixed_cache_impl.go`), so a refused request
//! consumes its weight in the rule's other windows.

use tollgate_common::rls::{
    self, Entry, LimitOverride, RateLimitDescriptor, RateLimitRequest, Unit,
};

use crate::algorithm::{Decision, Period};
use crate::config::Rule;
use crate::key::MISSING_BUCKET;
use crate::limiter::Verdict;

/// The key of the descriptor entry naming the rule and limit.
pub const RULE_ENTRY: &str = "rule";
/// The key of the descriptor entry carrying the client key.
pub const KEY_ENTRY: &str = "key";

pub use crate::config::descriptor_rule;

/// The service's unit for a period (`envoy.type.v3.RateLimitUnit`).
pub fn unit(period: Period) -> Unit {
    match period {
        Period::Second => Unit::Second,
        Period::Minute => Unit::Minute,
        Period::Hour => Unit::Hour,
        Period::Day => Unit::Day,
    }
}

/// The `ShouldRateLimit` request of a request of `weight` units (1 to `rule.max_weight`) by
/// `client` (the client key; `None`: the request lacks it and the rule shares one bucket for
/// those) under `rule` with `domain`.
pub fn request(rule: &Rule, domain: &str, client: Option<&str>, weight: u64) -> RateLimitRequest {
    let key = match client {
        Some("") => None,
        Some(c) => Some(c),
        None => Some(MISSING_BUCKET),
    };
    let descriptors = rule
        .limits
        .iter()
        .map(|l| {
            let mut entries = vec![Entry {
                key: RULE_ENTRY.to_string(),
                value: l.descriptor_rule.clone(),
            }];
            if let Some(k) = key {
                entries.push(Entry {
                    key: KEY_ENTRY.to_string(),
                    value: k.to_string(),
                });
            }
            RateLimitDescriptor {
                entries,
                limit: Some(LimitOverride {
                    // At most MAX_UNITS (10^9): fits.
                    requests_per_unit: u32::try_from(l.limit.requests()).unwrap_or(u32::MAX),
                    unit: unit(l.limit.period()) as i32,
                }),
                hits_addend: None,
            }
        })
        .collect();
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        // At most max_weight <= MAX_UNITS (10^9): fits.
        hits_addend: u32::try_from(weight).unwrap_or(u32::MAX),
    }
}

/// The service's verdict as the limiter's: every status as a [`Decision`] (`remaining` =
/// `limit_remaining`, `reset_after_ms` = `duration_until_reset`); over limit: the first status
/// over limit refuses (the first limit if only the overall code said so), its Retry-After the
/// end of its window.
pub fn verdict(reply: &rls::Verdict) -> Verdict {
    let decision = |s: &rls::Status, allowed: bool| Decision {
        allowed,
        remaining: u64::from(s.limit_remaining),
        reset_after_ms: s.reset_ms,
        retry_after_ms: if allowed { 0 } else { s.reset_ms },
        window_start_ms: 0,
    };
    if !reply.over_limit {
        return Verdict::Allowed(reply.statuses.iter().map(|s| decision(s, true)).collect());
    }
    let index = reply
        .statuses
        .iter()
        .position(|s| s.over_limit)
        .unwrap_or(0);
    let refusing = reply.statuses.get(index).copied().unwrap_or(rls::Status {
        over_limit: true,
        limit_remaining: 0,
        reset_ms: 0,
    });
    Verdict::Limited {
        index,
        decision: decision(&refusing, false),
    }
}
