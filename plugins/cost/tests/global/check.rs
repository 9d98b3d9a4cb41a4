//! The check: one call of pure checks (the month first), descriptors that never share a counter
//! across tenants and ledgers, and the month whose counter straddles a year window.

use std::collections::HashMap;

use prost::Message;
use tollgate_common::rls::{self, RateLimitDescriptor, RateLimitRequest, Unit};
use tollgate_cost::global::{check_request, cost_entry, Limits, Period};
use tollgate_cost::ledger::Budget;
use tollgate_cost::month_windows::year_boundary_in_month;
use tollgate_cost::period::Periods;

use crate::reference::engine_key;
use crate::support::{global, JAN31_NOON};

#[test]
fn the_check_is_one_call_of_pure_checks_month_first() {
    let g = global(100_000);
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(1_000_000_000),
            month: Some(20_000_000_000),
        },
    );
    let now = Periods::at(JAN31_NOON);
    let req = check_request("tollgate", "default", "alice", &limits, &now).unwrap();
    assert_eq!(req.domain, "tollgate");
    assert_eq!(req.hits_addend, 0);
    let d = &req.descriptors;
    assert_eq!(d.len(), 2);
    let entries = |d: &RateLimitDescriptor| {
        d.entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        entries(&d[0]),
        vec![
            ("cost".into(), "20:default/month/202501".into()),
            ("tenant".into(), "alice".into())
        ]
    );
    assert_eq!(
        entries(&d[1]),
        vec![
            ("cost".into(), "20:default/day/20250131".into()),
            ("tenant".into(), "alice".into())
        ]
    );
    let limit = |d: &RateLimitDescriptor| d.limit.clone().map(|l| (l.requests_per_unit, l.unit));
    assert_eq!(limit(&d[0]), Some((200_000, Unit::Year as i32)));
    assert_eq!(limit(&d[1]), Some((10_000, Unit::Day as i32)));
    assert!(d.iter().all(|d| d.hits_addend == Some(0)), "a pure check");
    // The wrapper makes 0 explicit on the wire (absent would be the request's hits_addend, and
    // 0 there counts 1).
    let bytes = rls::encode_request(&req);
    assert_eq!(RateLimitRequest::decode(&*bytes).unwrap(), req);
    assert!(check_request("tollgate", "default", "alice", &Limits::default(), &now).is_none());
}

#[test]
fn descriptors_of_distinct_tenants_and_ledgers_never_share_a_counter() {
    // Abuse: the server joins entries with `_` unescaped; tenants may contain `_` and `/`-free
    // punctuation. The framed cost entry and the tenant last keep keys distinct.
    let g = global(1);
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(10),
            month: Some(10),
        },
    );
    let now = Periods::at(JAN31_NOON);
    let cases = [
        ("a", "b_tenant_c"),
        ("a_tenant_b", "c"),
        ("a", "b"),
        ("a_b", "c"),
        ("a", "b_c"),
        ("x/day/20250131", "t"),
        ("x", "t"),
        ("a", "21:default_day_20250131"),
    ];
    let mut seen = HashMap::new();
    for (ledger, tenant) in cases {
        let req = check_request("tollgate", ledger, tenant, &limits, &now).unwrap();
        for d in &req.descriptors {
            let k = engine_key("tollgate", d);
            if let Some(prev) = seen.insert(k.clone(), (ledger, tenant)) {
                panic!("{prev:?} and {:?} share {k}", (ledger, tenant));
            }
        }
    }
    // Never a rate-limit descriptor's key: its first entry is `rule`.
    assert!(seen.keys().all(|k| k.starts_with("tollgate_cost_")));
    assert_eq!(cost_entry("l", Period::Day, 20250131), "14:l/day/20250131");
}

#[test]
fn the_month_that_straddles_a_year_window_is_known() {
    // Epoch + 56 * 365 days = 2025-12-18T00:00:00Z, + 57 * 365 = 2026-12-18, + 59 * 365 =
    // 2028-12-17 (2028 is a leap year).
    assert_eq!(year_boundary_in_month(202512), Some(56 * 365 * 86_400));
    assert_eq!(Periods::at(56 * 365 * 86_400).day, 20251218);
    assert_eq!(year_boundary_in_month(202612), Some(57 * 365 * 86_400));
    assert_eq!(Periods::at(59 * 365 * 86_400).day, 20281217);
    let straddling: Vec<u32> = (2025..=2028)
        .flat_map(|y| (1..=12).map(move |m| y * 100 + m))
        .filter(|&m| year_boundary_in_month(m).is_some())
        .collect();
    assert_eq!(straddling, vec![202512, 202612, 202712, 202812]);
    assert_eq!(year_boundary_in_month(202513), None);
    assert_eq!(year_boundary_in_month(196912), None);
}
