//! The `global` block: its defaults and units, errors naming the field, and budgets rounded down
//! and costs rounded up to units.

use tollgate_common::rls::OnError;
use tollgate_cost::global::{Booking, Limits, Period, DEFAULT_UNIT_NANO_USD};
use tollgate_cost::ledger::Budget;
use tollgate_cost::period::Periods;

use crate::support::{config, global, JAN31_NOON};

#[test]
fn the_global_block_defaults_and_units() {
    let c = config(
        r#""budgets": {"default": {"day_nano_usd": 1000000000}},
           "global": {"service": "ratelimit", "domain": "tollgate"}"#,
    )
    .unwrap();
    let g = c.global.unwrap();
    assert_eq!(g.unit_nano_usd, DEFAULT_UNIT_NANO_USD);
    assert_eq!(g.rls.on_error, OnError::Local);
    assert_eq!(
        (g.rls.timeout_ms, g.rls.service.as_str()),
        (50, "ratelimit")
    );
    let c = config(
        r#""global": {"service": "rl", "domain": "d", "on_error": "deny", "unit_nano_usd": 1}"#,
    )
    .unwrap();
    let g = c.global.unwrap();
    assert_eq!((g.unit_nano_usd, g.rls.on_error), (1, OnError::Deny));
    assert!(config(r#""budgets": {}"#).unwrap().global.is_none());
}

#[test]
fn global_errors_name_the_field() {
    let max_units = u64::from(u32::MAX);
    let cases = [
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 0}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 1000000001}"#
                .to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 1.5}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": "1"}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (r#""global": {"domain": "d"}"#.to_string(), "global"),
        (
            r#""global": {"service": "rl", "domain": "d", "units": 1}"#.to_string(),
            "global.units",
        ),
        (
            r#""global": {"service": "a b", "domain": "d"}"#.to_string(),
            "global.service",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "timeout_ms": 0}"#.to_string(),
            "global.timeout_ms",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "on_error": "open"}"#.to_string(),
            "global.on_error",
        ),
        (r#""global": [1]"#.to_string(), "global"),
        // Budgets beyond u32::MAX units of the unit refuse, naming the budget.
        (
            format!(
                r#""budgets": {{"tenants": {{"alice": {{"day_nano_usd": {}}}}}}},
                   "global": {{"service": "rl", "domain": "d"}}"#,
                (max_units + 1) * DEFAULT_UNIT_NANO_USD
            ),
            "budgets.tenants.alice.day_nano_usd",
        ),
        (
            format!(
                r#""budgets": {{"default": {{"month_nano_usd": {}}}}},
                   "global": {{"service": "rl", "domain": "d", "unit_nano_usd": 1}}"#,
                max_units + 1
            ),
            "budgets.default.month_nano_usd",
        ),
    ];
    for (rest, field) in cases {
        let err = config(&rest).unwrap_err();
        assert_eq!(err.field, field, "{rest}: {err}");
    }
    // Exactly u32::MAX units fits; the same budget without `global` is fine whatever its size.
    config(&format!(
        r#""budgets": {{"default": {{"month_nano_usd": {}}}}},
           "global": {{"service": "rl", "domain": "d", "unit_nano_usd": 1}}"#,
        max_units
    ))
    .unwrap();
    config(r#""budgets": {"default": {"month_nano_usd": 18446744073709551615}}"#).unwrap();
}

#[test]
fn rounding_budgets_down_and_costs_up() {
    let g = global(100_000);
    assert_eq!(g.limit_units(1_000_000_000, "f").unwrap(), 10_000);
    assert_eq!(
        g.limit_units(199_999, "f").unwrap(),
        1,
        "refused sooner, never later"
    );
    assert_eq!(
        g.limit_units(99_999, "f").unwrap(),
        0,
        "below one unit: always spent"
    );
    assert_eq!(g.cost_units(0), 0);
    assert_eq!(g.cost_units(1), 1, "never under-counted");
    assert_eq!(g.cost_units(100_000), 1);
    assert_eq!(g.cost_units(100_001), 2);
    assert_eq!(
        g.cost_units(u64::MAX),
        u32::MAX,
        "bounded: never past the uint32 range"
    );
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(250_000),
            month: None,
        },
    );
    assert_eq!(
        limits,
        Limits {
            day: Some(2),
            month: None
        }
    );
    assert_eq!(limits.periods(202601), vec![Period::Day]);
    let now = Periods::at(JAN31_NOON);
    assert_eq!(
        Booking::new(&g, "t", &limits, &now, 0),
        None,
        "nothing to book"
    );
    assert_eq!(
        Booking::new(&g, "t", &Limits::default(), &now, 5),
        None,
        "no budgeted period"
    );
    let b = Booking::new(&g, "t", &limits, &now, 150_000).unwrap();
    assert_eq!((b.units, b.key.day, b.key.month), (2, 20250131, 0));
}
