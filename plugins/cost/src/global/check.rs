//! The check before the upstream (every budgeted period's counters with `hits_addend` 0), the
//! decision from its verdict, and the overspend bound.

use tollgate_common::rls::{RateLimitRequest, Verdict};

use super::descriptors::{period_descriptors, Limits, Period};
use crate::ledger::Exceeded;
use crate::period::Periods;

/// The check before the upstream: `hits_addend` 0 on each budgeted period of `tenant` at `now`
/// (`None` when the tenant has no budget: no call).
pub fn check_request(
    domain: &str,
    ledger: &str,
    tenant: &str,
    limits: &Limits,
    now: &Periods,
) -> Option<RateLimitRequest> {
    let mut descriptors = Vec::with_capacity(3);
    period_descriptors(ledger, tenant, limits, now, (0, 0), &mut descriptors);
    (!descriptors.is_empty()).then(|| RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    })
}

/// What the check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Under every budget.
    Admit,
    /// A budget is spent (or has less left than the request needs): refused as in local mode.
    Refuse(Exceeded),
}

/// Booking units of a tenant that this worker knows are spent but the service has not counted
/// yet (its [`Outbox`]), per period: subtracted from the service's `limit_remaining` by
/// [`decide`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// Units booked in the current calendar month.
    pub month: u32,
    /// Units booked in the current UTC day.
    pub day: u32,
}

impl Pending {
    fn of(&self, period: Period) -> u32 {
        match period {
            Period::Month => self.month,
            Period::Day => self.day,
        }
    }
}

/// The decision from a check's verdict (its statuses in [`Limits::periods`]' order). What is
/// left of a period is the status's `limit_remaining` minus `pending`'s units of that period
/// (spend this worker has queued and the service has not counted; 0 when it is at least the
/// remaining). Refused when a status is over limit, nothing is left (the counter plus the
/// pending spend is at the limit: spend ≥ budget, the local rule), or less than `needed` units
/// are left (the request's cost when known in advance, else 0). The month wins when both are
/// spent; the reset is the calendar period's (`now`), as in local mode.
pub fn decide(
    periods: &[Period],
    verdict: &Verdict,
    now: &Periods,
    needed: u32,
    pending: &Pending,
) -> Decision {
    let mut spent: Option<Period> = None;
    for (period, status) in periods.iter().zip(&verdict.statuses) {
        let left = status.limit_remaining.saturating_sub(pending.of(*period));
        if status.over_limit || left == 0 || left < needed {
            spent = Some(spent.map_or(*period, |p| p.min(*period)));
        }
    }
    match spent {
        None => Decision::Admit,
        Some(Period::Month) => Decision::Refuse(Exceeded {
            period: "month",
            reset_secs: now.month_reset_secs,
        }),
        Some(Period::Day) => Decision::Refuse(Exceeded {
            period: "day",
            reset_secs: now.day_reset_secs,
        }),
    }
}

/// The overspend bound of global mode, per tenant and period (nano-USD): what can be spent
/// beyond the budget, given the cost of the tenant's requests admitted and not yet counted by the
/// service when the last one was admitted, on every instance: those in flight (`in_flight`,
/// nano-USD each) and the bookings waiting in outboxes or the replay queue (`unsent`). A request
/// is admitted only while the service's counter is below the limit, the counter is the
/// bookings rounded **up** to units and the limit the budget rounded **down**, so the spend
/// counted when it was admitted was below the budget and rounding adds nothing:
/// `spend ≤ budget + Σ in_flight + Σ unsent`. Requests admitted under `on_error` `local` or
/// `allow` while the service gave no verdict are outside it (see the README).
pub fn overspend_bound(in_flight: &[u64], unsent: &[u64]) -> u64 {
    in_flight
        .iter()
        .chain(unsent)
        .fold(0u64, |acc, c| acc.saturating_add(*c))
}

/// `(period, status)` pairs of a check, for logs.
pub fn describe(periods: &[Period], verdict: &Verdict) -> String {
    periods
        .iter()
        .zip(&verdict.statuses)
        .map(|(p, s)| {
            format!(
                "{p:?}: over {} remaining {}",
                s.over_limit, s.limit_remaining
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
