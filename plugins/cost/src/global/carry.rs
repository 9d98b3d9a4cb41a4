//! The claims of month carries (`crate::month_windows`): the call that claims one, what its
//! reply says, and the claims a worker has asked.

use std::collections::{BTreeSet, VecDeque};

use tollgate_common::rls::{RateLimitRequest, Verdict};

use super::descriptors::descriptor;
use super::outbox::{Booking, BookingKey};
use crate::month_windows::{self, Carry, Counter};
use crate::period::Periods;

/// The carries a worker has asked the service to claim (`month_windows`): each (tenant, month,
/// counter, window) at most once while remembered, at most `max` remembered (when full, all are
/// forgotten: a carry asked again is claimed again, and the service answers that claim over, so
/// nothing is carried twice). Also the budgeted tenants this worker checked in a month that
/// holds a YEAR boundary (at most `max`), whose carries its root context asks once the carry is
/// due ([`Claims::sweep`]), so that a tenant silent during the carry's interval is carried too.
#[derive(Debug, Default)]
pub struct Claims {
    asked: BTreeSet<(String, u32, Counter, u64)>,
    queued: VecDeque<Claim>,
    /// Month (`yyyymm`) and tenants seen in it.
    seen: (u32, BTreeSet<String>),
    /// The last carry swept: (month, start of `to`'s window).
    swept: Option<(u32, u64)>,
    max: usize,
}

impl Claims {
    /// No claim asked, at most `max` remembered.
    pub fn new(max: usize) -> Claims {
        Claims {
            max,
            ..Claims::default()
        }
    }

    /// Queues `claim` unless it was asked already; whether it was queued.
    pub fn ask(&mut self, claim: Claim) -> bool {
        let id = Self::id(&claim);
        if self.asked.contains(&id) {
            return false;
        }
        if self.asked.len() >= self.max {
            self.asked.clear();
            self.queued.clear();
        }
        self.asked.insert(id);
        self.queued.push_back(claim);
        true
    }

    /// `tenant`, with a month budget, was checked in `month` (`yyyymm`), a month that holds a
    /// YEAR boundary (others are not kept). Beyond `max` tenants in the month, not kept.
    pub fn seen(&mut self, tenant: &str, month: u32) {
        if month_windows::counters(month).len() < 2 {
            return;
        }
        if self.seen.0 != month {
            self.seen = (month, BTreeSet::new());
        }
        if self.seen.1.len() < self.max && !self.seen.1.contains(tenant) {
            self.seen.1.insert(tenant.to_string());
        }
    }

    /// From the root context's tick at `now`: when a carry is due that was not swept yet, asks
    /// it for every tenant seen this month; how many were queued.
    pub fn sweep(&mut self, now: &Periods) -> usize {
        let Some(carry) = month_windows::carry_due(now.month, now.secs) else {
            return 0;
        };
        if self.swept == Some((now.month, carry.start)) || self.seen.0 != now.month {
            return 0;
        }
        self.swept = Some((now.month, carry.start));
        let tenants: Vec<String> = self.seen.1.iter().cloned().collect();
        tenants
            .into_iter()
            .filter(|tenant| {
                self.ask(Claim {
                    tenant: tenant.clone(),
                    month: now.month,
                    carry,
                })
            })
            .count()
    }

    /// The next claim to send.
    pub fn take_next(&mut self) -> Option<Claim> {
        self.queued.pop_front()
    }

    /// `claim` got no answer: forgotten, so that a later check asks it again.
    pub fn failed(&mut self, claim: &Claim) {
        self.asked.remove(&Self::id(claim));
    }

    fn id(c: &Claim) -> (String, u32, Counter, u64) {
        (c.tenant.clone(), c.month, c.carry.to, c.carry.start)
    }
}

/// A carry this worker asks the service to claim for `tenant` in month `month` (`yyyymm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The tenant (1 to 128 visible ASCII bytes).
    pub tenant: String,
    /// `yyyymm`.
    pub month: u32,
    /// What to carry.
    pub carry: Carry,
}

impl Claim {
    /// The booking of a won claim: `units` into the carry's `to` counter of the month.
    pub fn booking(&self, units: u32) -> Booking {
        Booking {
            key: BookingKey {
                tenant: self.tenant.clone(),
                day: 0,
                month: self.month,
                into: Some(self.carry.to),
                tokens: None,
            },
            units,
        }
    }
}

/// The claim call of `claim`, whose month budget is `limit` units: `[claim, from, to]`: the
/// claim descriptor (`<ledger>/month-carry/<yyyymm>` or `month-bridge-carry`, limit 1 in `to`'s
/// windows, `hits_addend` 1: the service counts 1 for the first claim of the window, over for
/// every later one), then both counters read (`hits_addend` 0) in the same call.
pub fn claim_request(domain: &str, ledger: &str, claim: &Claim, limit: u32) -> RateLimitRequest {
    let (to, from) = (claim.carry.to, claim.carry.from);
    let id = claim.month;
    let t = claim.tenant.as_str();
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![
            descriptor(ledger, t, (to.claim_name(), Some(id)), to.unit(), 1, 1),
            descriptor(ledger, t, (from.name(), Some(id)), from.unit(), limit, 0),
            descriptor(ledger, t, (to.name(), Some(id)), to.unit(), limit, 0),
        ],
        hits_addend: 0,
    }
}

/// What the reply to [`claim_request`] says: `Some(units)` to book into the carry's `to`
/// counter when this call won the claim (the `from` count minus the `to` count, 0 when
/// nothing is missing), `None` when another call had claimed it or the reply has not three
/// statuses. A count is the limit minus `limit_remaining`, or the limit plus one when the status
/// is over it (the reference server is over only above the limit).
pub fn claim_outcome(verdict: &Verdict, limit: u32) -> Option<u32> {
    let [claim, from, to] = verdict.statuses.as_slice() else {
        return None;
    };
    if claim.over_limit {
        return None;
    }
    let missing = from.counted(limit).saturating_sub(to.counted(limit));
    Some(u32::try_from(missing).unwrap_or(u32::MAX))
}
