//! A month budget across the reference server's YEAR boundary (2026-12-18): 3 gateways
//! simulated on the reference server's model with its windows and an injected clock, each with
//! its own outbox and claims, as the filter's root context sends them.

use tollgate_cost::global::{
    batch_request, check_request, claim_outcome, claim_request, decide, Booking, BookingKey,
    Claims, Decision, Limits, Outbox,
};
use tollgate_cost::ledger::Budget;
use tollgate_cost::month_windows::{self, Counter};
use tollgate_cost::period::{days_from_civil, Periods};

use crate::reference::{verdict_of, Engine};
use crate::support::{budget_only, global};

/// Unix seconds of y-m-d at `hour`:00 UTC.
fn at(y: u64, m: u64, d: u64, hour: u64) -> u64 {
    days_from_civil(y, m, d) * 86_400 + hour * 3_600
}

struct Gateway {
    outbox: Outbox,
    claims: Claims,
}

/// The fleet: 3 gateways on one service, a tenant with a month budget of 100 units, requests
/// of 10 units each.
struct Fleet {
    engine: Engine,
    gateways: Vec<Gateway>,
    limits: Limits,
    /// Units admitted per calendar month (`yyyymm`).
    admitted: std::collections::BTreeMap<u32, u32>,
}

const COST_UNITS: u64 = 10;

impl Fleet {
    fn new() -> Fleet {
        let g = global(1);
        let budget = Budget {
            day: None,
            month: Some(100),
        };
        Fleet {
            engine: Engine::default(),
            gateways: (0..3)
                .map(|_| Gateway {
                    outbox: Outbox::new(64),
                    claims: Claims::new(64),
                })
                .collect(),
            limits: Limits::of(&g, &budget),
            admitted: Default::default(),
        }
    }

    /// A request of the tenant on gateway `i` at `secs`, as the filter serves it: the check
    /// (asking a carry when one is due), the booking when admitted, then the root context's
    /// send (claims first, then the outbox). Whether it was admitted.
    fn request(&mut self, i: usize, secs: u64) -> bool {
        self.engine.now = secs;
        let now = Periods::at(secs);
        let req = check_request("d", "l", "acme", &self.limits, &now).unwrap();
        let n = req.descriptors.len();
        let verdict = verdict_of(&self.engine.call(&req), n).unwrap();
        let gw = &mut self.gateways[i];
        gw.claims.seen("acme", now.month);
        if let Some(carry) = month_windows::carry_due(now.month, secs) {
            gw.claims.ask(tollgate_cost::global::Claim {
                tenant: "acme".into(),
                month: now.month,
                carry,
            });
        }
        let pending = gw.outbox.pending("acme", &now);
        let admit =
            decide(&self.limits.periods(now.month), &verdict, &now, 0, &pending) == Decision::Admit;
        if admit {
            let b = Booking::new(&global(1), "acme", &self.limits, &now, COST_UNITS).unwrap();
            assert!(gw.outbox.push(b));
            *self.admitted.entry(now.month).or_default() += COST_UNITS as u32;
        }
        self.send(i, secs);
        admit
    }

    /// Gateway `i`'s root context's tick: the carries due for the tenants it checked, then what
    /// it sends.
    fn tick(&mut self, i: usize, secs: u64) {
        self.gateways[i].claims.sweep(&Periods::at(secs));
        self.send(i, secs);
    }

    /// The worker of gateway `i` restarts: its outbox and what it remembered are gone.
    fn restart(&mut self, i: usize) {
        self.gateways[i] = Gateway {
            outbox: Outbox::new(64),
            claims: Claims::new(64),
        };
    }

    /// Gateway `i`'s root context: its claims, then its outbox.
    fn send(&mut self, i: usize, secs: u64) {
        self.engine.now = secs;
        let now = Periods::at(secs);
        let limit = self.limits.month.unwrap();
        let gw = &mut self.gateways[i];
        while let Some(claim) = gw.claims.take_next() {
            let req = claim_request("d", "l", &claim, limit);
            let verdict = verdict_of(&self.engine.call(&req), 3).unwrap();
            if let Some(units) = claim_outcome(&verdict, limit).filter(|u| *u > 0) {
                assert!(gw.outbox.push(claim.booking(units)));
            }
        }
        let limits = self.limits;
        let built = batch_request("d", "l", gw.outbox.take(64), &now, &budget_only(limits));
        if let Some(r) = built.request {
            self.engine.call(&r);
        }
    }

    /// The service's count of the month's counter `c` at `secs`.
    fn count(&mut self, c: Counter, secs: u64) -> u64 {
        self.engine.now = secs;
        let now = Periods::at(secs);
        let req = check_request("d", "l", "acme", &self.limits, &now).unwrap();
        let d = req
            .descriptors
            .iter()
            .find(|d| d.entries[0].value.contains(&format!("/{}/", c.name())))
            .unwrap();
        self.engine.counter("d", d)
    }
}

#[test]
fn december_2026_holds_one_budget_across_the_year_boundary() {
    let mut f = Fleet::new();
    // Dec 1-2: the budget is spent across the 3 gateways, then refused.
    let mut admitted = 0;
    for k in 0..15 {
        admitted += u32::from(f.request(k % 3, at(2026, 12, 1, 10) + k as u64 * 60));
    }
    assert_eq!(admitted, 10);
    assert!(!f.request(0, at(2026, 12, 2, 9)));
    // Dec 10: every gateway sees a request (refused) and asks the carry; one wins it.
    for i in 0..3 {
        assert!(!f.request(i, at(2026, 12, 10, 12)));
    }
    assert_eq!(f.count(Counter::Year, at(2026, 12, 10, 13)), 100);
    assert_eq!(
        f.count(Counter::Bridge, at(2026, 12, 10, 13)),
        100,
        "the spend of Dec 1-2 carried into the bridge once, not once per gateway"
    );
    // Dec 18 onwards: the YEAR counter restarted, the bridge still counts the month.
    assert_eq!(f.count(Counter::Year, at(2026, 12, 18, 0)), 0);
    for (day, i) in [(18, 0), (20, 1), (31, 2)] {
        assert!(!f.request(i, at(2026, 12, day, 8)), "Dec {day}");
    }
    assert_eq!(f.admitted[&202612], 100, "the month's spend is its budget");
    // January: a new month, a new budget.
    assert!(f.request(0, at(2027, 1, 1, 0)));
}

#[test]
fn the_bridge_counts_what_the_year_counter_forgets_at_the_boundary() {
    // What the counters alone say (the behaviour before the bridge): the YEAR counter after the
    // boundary has none of the month's spend before it.
    let mut f = Fleet::new();
    for k in 0..10 {
        assert!(f.request(k % 3, at(2026, 12, 5, 10) + k as u64));
    }
    assert_eq!(f.count(Counter::Year, at(2026, 12, 17, 23)), 100);
    assert_eq!(f.count(Counter::Year, at(2026, 12, 18, 0)), 0);
    assert!(!f.request(1, at(2026, 12, 19, 0)));
    // The bridge counted Dec 5 itself (its window started Dec 3): nothing to carry.
    assert_eq!(f.count(Counter::Bridge, at(2026, 12, 19, 0)), 100);
}

#[test]
fn december_2027_carries_the_bridge_into_the_new_year_window() {
    // 2027: the bridge (2027-11-28 .. 12-28) holds the month's start, YEAR restarts on Dec 18,
    // the bridge on Dec 28: the carry goes from the bridge into the new YEAR window.
    let mut f = Fleet::new();
    for k in 0..5 {
        assert!(f.request(k % 3, at(2027, 12, 5, 10) + k as u64));
    }
    for k in 0..5 {
        assert!(
            f.request(k % 3, at(2027, 12, 20, 10) + k as u64),
            "Dec 20, {k}"
        );
    }
    assert!(!f.request(0, at(2027, 12, 20, 11)));
    assert_eq!(f.count(Counter::Year, at(2027, 12, 27, 0)), 100);
    for (day, i) in [(28, 1), (30, 2)] {
        assert!(!f.request(i, at(2027, 12, day, 8)), "Dec {day}");
    }
    assert_eq!(f.admitted[&202712], 100);
}

#[test]
fn a_tenant_silent_through_the_carry_interval_is_carried_by_the_ticks() {
    // No request of the tenant after Dec 1: the gateways that checked it claim its carry from
    // their ticks once it is due (Dec 3), one of them wins, and Dec 18 is refused.
    let mut f = Fleet::new();
    for k in 0..10 {
        assert!(f.request(k % 3, at(2026, 12, 1, 10) + k as u64));
    }
    for i in 0..3 {
        f.tick(i, at(2026, 12, 2, 23)); // not due yet: nothing claimed
    }
    // The bridge's window of Dec 3 - Jan 2 has nothing yet (that of Nov 3 - Dec 3 had Dec 1).
    assert_eq!(f.count(Counter::Bridge, at(2026, 12, 2, 23)), 100);
    assert_eq!(f.count(Counter::Bridge, at(2026, 12, 3, 0)), 0);
    for i in 0..3 {
        f.tick(i, at(2026, 12, 3, 0) + 1);
    }
    assert_eq!(f.count(Counter::Bridge, at(2026, 12, 3, 1)), 100);
    assert!(!f.request(0, at(2026, 12, 18, 1)));
    assert_eq!(f.admitted[&202612], 100);
}

#[test]
fn a_tenant_not_carried_when_every_worker_that_checked_it_restarted() {
    // The documented limit: the workers that checked the tenant restarted before the carry was
    // due, and no request of it came during the interval: its spend of Dec 1-2 is not counted
    // after Dec 18.
    let mut f = Fleet::new();
    for k in 0..10 {
        assert!(f.request(k % 3, at(2026, 12, 1, 10) + k as u64));
    }
    for i in 0..3 {
        f.restart(i);
        f.tick(i, at(2026, 12, 3, 0) + 1);
    }
    assert!(f.request(0, at(2026, 12, 18, 1)));
    assert_eq!(f.admitted[&202612], 110);
}

#[test]
fn a_claim_answered_over_carries_nothing_and_a_lost_carry_is_not_resent() {
    let mut f = Fleet::new();
    for k in 0..4 {
        assert!(f.request(k % 3, at(2026, 12, 2, 10) + k as u64));
    }
    // Two claims of the same carry: the second is answered over.
    let claim = tollgate_cost::global::Claim {
        tenant: "acme".into(),
        month: 202612,
        carry: month_windows::carry_due(202612, at(2026, 12, 4, 0)).unwrap(),
    };
    f.engine.now = at(2026, 12, 4, 0);
    let req = claim_request("d", "l", &claim, 100);
    let first = verdict_of(&f.engine.call(&req), 3).unwrap();
    let second = verdict_of(&f.engine.call(&req), 3).unwrap();
    assert_eq!(claim_outcome(&first, 100), Some(40));
    assert_eq!(claim_outcome(&second, 100), None);
    // A carry booking sent after its interval is stale (dropped), never booked late.
    let late = Booking {
        key: BookingKey {
            tenant: "acme".into(),
            day: 0,
            month: 202612,
            into: Some(Counter::Bridge),
            tokens: None,
        },
        units: 40,
    };
    let limits = f.limits;
    let built = batch_request(
        "d",
        "l",
        vec![late],
        &Periods::at(at(2026, 12, 18, 0)),
        &budget_only(limits),
    );
    assert_eq!((built.request, built.stale), (None, 1));
}

#[test]
fn claims_remember_tenants_only_in_boundary_months_bounded_and_sweep_once_per_carry() {
    let mut c = Claims::new(2);
    c.seen("nov", 202611);
    for t in ["a", "b", "c"] {
        c.seen(t, 202612);
    }
    let dec4 = Periods::at(at(2026, 12, 4, 0));
    assert_eq!(
        c.sweep(&Periods::at(at(2026, 12, 2, 0))),
        0,
        "no carry due yet"
    );
    assert_eq!(
        c.sweep(&dec4),
        2,
        "at most 2 tenants remembered, November's not among them"
    );
    let mut asked = Vec::new();
    while let Some(claim) = c.take_next() {
        asked.push(claim.tenant);
    }
    assert_eq!(asked, ["a", "b"]);
    assert_eq!(
        c.sweep(&Periods::at(at(2026, 12, 5, 0))),
        0,
        "swept once per carry"
    );
}
