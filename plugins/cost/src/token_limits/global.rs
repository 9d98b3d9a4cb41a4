//! Token limits in global mode (`token_limits.global: true`), host-free: a tenant's windows
//! counted by Envoy's rate limit service (`ShouldRateLimit`), shared by every gateway, with the
//! budgets' `global` block, calls, breaker, outbox and replay queue (`crate::global`).
//!
//! **Descriptors.** One per limit that applies to the request: entries `("cost",
//! "<len>:<ledger>/tokens/<per>/<name>")` and `("tenant", <tenant>)`, the limit override
//! `{tokens, MINUTE | HOUR | DAY}`. The reference server's windows of those units are the local
//! mode's (`window.rs`: aligned on the epoch, the UTC day), so the service counts the same
//! windows; its key appends the window's start (`src/limiter/cache_key.go`).
//!
//! **The check** (end of the request body, the model known; the request paused until the
//! reply): every descriptor with `hits_addend` 0. A window is spent when its status is over the
//! limit or has `limit_remaining` 0 (the counter is at the limit: the local rule used ≥ tokens),
//! read as a [`Reading`] so that the refusal and the RateLimit fields are the local mode's.
//!
//! **The booking** (the response complete): the weighted tokens of each limit as the
//! descriptor's `hits_addend` ([`booking`]), queued in the worker's outbox, sent in batches by
//! the root context; a window that has ended when it is sent is dropped (stale).
//!
//! The protocol counts in `uint32`: a global limit's `tokens` must fit one (the configuration is
//! refused naming the field), and one booking sends at most `u32::MAX` tokens.

use tollgate_common::rls::{RateLimitDescriptor, RateLimitRequest, Verdict};

use super::config::Limit;
use super::gate::Reading;
use super::window::Window;
pub use crate::global::TokenTarget;
use crate::global::{token_descriptor, Booking, BookingKey};

/// A limit's `tokens` as the protocol's `uint32` (checked at configuration; `u32::MAX` here
/// otherwise).
pub fn tokens_u32(limit: &Limit) -> u32 {
    u32::try_from(limit.tokens).unwrap_or(u32::MAX)
}

/// The check of `limits` (those that apply to the request) for `tenant`: `hits_addend` 0 on
/// each; `None` when there is none.
pub fn check_request(
    domain: &str,
    ledger: &str,
    tenant: &str,
    limits: &[&Limit],
) -> Option<RateLimitRequest> {
    let descriptors: Vec<RateLimitDescriptor> = limits
        .iter()
        .map(|l| token_descriptor(ledger, tenant, (&l.name, l.per), tokens_u32(l), 0))
        .collect();
    (!descriptors.is_empty()).then(|| RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    })
}

/// The windows the service counted, from a check's verdict (one status per limit, in order) at
/// `now_ms`: a status over the limit reads as one token past it, else `tokens -
/// limit_remaining`.
pub fn readings<'a>(limits: &[&'a Limit], verdict: &Verdict, now_ms: u64) -> Vec<Reading<'a>> {
    limits
        .iter()
        .zip(&verdict.statuses)
        .map(|(limit, status)| Reading {
            limit,
            used: status.counted(tokens_u32(limit)),
            window: Window::at(limit.per, now_ms),
        })
        .collect()
}

/// The booking of `tokens` weighted tokens in `limit`'s window at `now_ms` for `tenant`
/// (`None` for 0 tokens); at most `u32::MAX` tokens.
pub fn booking(tenant: &str, limit: &Limit, now_ms: u64, tokens: u64) -> Option<Booking> {
    let units = u32::try_from(tokens).unwrap_or(u32::MAX);
    (units > 0).then(|| Booking {
        key: BookingKey {
            tenant: tenant.to_string(),
            day: 0,
            month: 0,
            into: None,
            tokens: Some(TokenTarget {
                limit: limit.name.clone(),
                per: limit.per,
                window: Window::at(limit.per, now_ms).index,
            }),
        },
        units,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::token_limits::gate::decide;
    use crate::token_limits::window::Per;
    use tollgate_common::rls::{Status, Unit};

    fn limit(name: &str, tokens: u64, per: Per) -> Limit {
        Limit::total(name, tokens, per)
    }

    fn status(over: bool, remaining: u32) -> Status {
        Status {
            over_limit: over,
            limit_remaining: remaining,
            reset_ms: 0,
        }
    }

    #[test]
    fn descriptors_name_the_limit_and_its_window_length() {
        let (tpm, tpd) = (limit("tpm", 1000, Per::Minute), limit("tpd", 9, Per::Day));
        let r = check_request("d", "l", "alice", &[&tpm, &tpd]).unwrap();
        let values: Vec<_> = r
            .descriptors
            .iter()
            .map(|d| d.entries[0].value.clone())
            .collect();
        assert_eq!(values, ["19:l/tokens/minute/tpm", "16:l/tokens/day/tpd"]);
        assert_eq!(r.descriptors[0].entries[1].value, "alice");
        let o = r.descriptors[1].limit.clone().unwrap();
        assert_eq!((o.requests_per_unit, o.unit), (9, Unit::Day as i32));
        assert!(r.descriptors.iter().all(|d| d.hits_addend == Some(0)));
        assert!(check_request("d", "l", "alice", &[]).is_none());
    }

    #[test]
    fn a_window_is_spent_at_its_limit_or_over_it() {
        let tpm = limit("tpm", 1000, Per::Minute);
        let now = 1_738_324_800_000 + 15_000;
        let verdict = |s| Verdict {
            over_limit: false,
            statuses: vec![s],
        };
        let r = readings(&[&tpm], &verdict(status(false, 1)), now);
        assert_eq!(r[0].used, 999);
        assert_eq!(decide(&r), None);
        let r = readings(&[&tpm], &verdict(status(false, 0)), now);
        let refused = decide(&r).unwrap();
        assert_eq!(refused.retry_after, "45");
        assert!(refused.ratelimit.contains("r=0"), "{}", refused.ratelimit);
        let r = readings(&[&tpm], &verdict(status(true, 0)), now);
        assert_eq!(r[0].used, 1001);
        assert!(decide(&r).is_some());
    }

    #[test]
    fn bookings_name_the_window_and_cap_at_u32() {
        let tph = limit("tph", 10, Per::Hour);
        let b = booking("a", &tph, 7_200_500, u64::MAX).unwrap();
        assert_eq!(b.units, u32::MAX);
        let t = b.key.tokens.unwrap();
        assert_eq!((t.limit.as_str(), t.per, t.window), ("tph", Per::Hour, 2));
        assert!(booking("a", &tph, 0, 0).is_none());
    }
}
