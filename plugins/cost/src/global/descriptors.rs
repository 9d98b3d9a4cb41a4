//! The descriptors of every counter on the service: a budget's periods (the month's counters,
//! `crate::month_windows`, then the day's), the claims of month carries and token limits'
//! windows. Each is `("cost", "<len>:<ledger>/<counter>[/<id>]")` then `("tenant", <tenant>)`.

use tollgate_common::rls::{Entry, LimitOverride, RateLimitDescriptor, Unit};

use super::block::CostGlobal;
use crate::ledger::Budget;
use crate::month_windows;
use crate::period::Periods;
use crate::token_limits::window::Per;

/// The descriptor entry naming the ledger, period and period id.
pub const COST_ENTRY: &str = "cost";

/// The descriptor entry carrying the tenant.
pub const TENANT_ENTRY: &str = "tenant";

/// A budgeted period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    /// The UTC calendar month (`yyyymm`).
    Month,
    /// The UTC day (`yyyymmdd`).
    Day,
}

/// The `cost` entry's value: `<len>:<ledger>/<period>/<id>`.
pub fn cost_entry(ledger: &str, period: Period, id: u32) -> String {
    let name = match period {
        Period::Month => "month",
        Period::Day => "day",
    };
    entry_value(ledger, name, Some(id))
}

/// `<len>:<ledger>/<name>/<id>`, or `<len>:<ledger>/<name>` without an id: the `cost` entry's
/// value of counter `name` (of period `id`).
fn entry_value(ledger: &str, name: &str, id: Option<u32>) -> String {
    let body = match id {
        Some(id) => format!("{ledger}/{name}/{id}"),
        None => format!("{ledger}/{name}"),
    };
    format!("{}:{body}", body.len())
}

/// The descriptor of `tenant`'s counter `name` (`month`, `day`, ...) of period `id`, in `unit`
/// windows.
pub(super) fn descriptor(
    ledger: &str,
    tenant: &str,
    (name, id): (&str, Option<u32>),
    unit: Unit,
    limit: u32,
    hits: u32,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![
            Entry {
                key: COST_ENTRY.to_string(),
                value: entry_value(ledger, name, id),
            },
            Entry {
                key: TENANT_ENTRY.to_string(),
                value: tenant.to_string(),
            },
        ],
        limit: Some(LimitOverride {
            requests_per_unit: limit,
            unit: unit as i32,
        }),
        hits_addend: Some(u64::from(hits)),
    }
}

/// The descriptors of a booking of `hits` (0: a check) on `tenant`'s budgeted periods at `now`:
/// the month's counters (`month_windows::counters`), then the day's.
pub(super) fn period_descriptors(
    ledger: &str,
    tenant: &str,
    limits: &Limits,
    now: &Periods,
    hits: (u32, u32),
    out: &mut Vec<RateLimitDescriptor>,
) {
    if let Some(m) = limits.month {
        for c in month_windows::counters(now.month) {
            out.push(descriptor(
                ledger,
                tenant,
                (c.name(), Some(now.month)),
                c.unit(),
                m,
                hits.0,
            ));
        }
    }
    if let Some(d) = limits.day {
        out.push(descriptor(
            ledger,
            tenant,
            ("day", Some(now.day)),
            Unit::Day,
            d,
            hits.1,
        ));
    }
}

/// A tenant's budget in booking units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Per UTC day.
    pub day: Option<u32>,
    /// Per UTC month.
    pub month: Option<u32>,
}

impl Limits {
    /// `budget` in units of `global` (a budget too large for a `uint32`, refused when the
    /// configuration loads, is `u32::MAX` here).
    pub fn of(global: &CostGlobal, budget: &Budget) -> Limits {
        let units = |nano: u64| global.limit_units(nano, "").unwrap_or(u32::MAX);
        Limits {
            day: budget.day.map(units),
            month: budget.month.map(units),
        }
    }

    /// The periods limited, one per descriptor of [`check_request`] in month `month`
    /// (`yyyymm`): the month once per counter (`month_windows::counters`), then the day.
    pub fn periods(&self, month: u32) -> Vec<Period> {
        let mut out = Vec::with_capacity(3);
        if self.month.is_some() {
            for _ in month_windows::counters(month) {
                out.push(Period::Month);
            }
        }
        if self.day.is_some() {
            out.push(Period::Day);
        }
        out
    }
}

/// The limit override's unit of a token limit's window length `per`.
pub fn token_unit(per: Per) -> Unit {
    match per {
        Per::Minute => Unit::Minute,
        Per::Hour => Unit::Hour,
        Per::Day => Unit::Day,
    }
}

/// The descriptor of `tenant`'s token limit `name` (per `per`, at most `tokens`) with `hits`:
/// `("cost", "<len>:<ledger>/tokens/<per>/<name>")`, `("tenant", <tenant>)`, `{tokens, unit}`
/// (`crate::token_limits::global`).
pub fn token_descriptor(
    ledger: &str,
    tenant: &str,
    (name, per): (&str, Per),
    tokens: u32,
    hits: u32,
) -> RateLimitDescriptor {
    let counter = format!("tokens/{}/{name}", per.label());
    descriptor(
        ledger,
        tenant,
        (&counter, None),
        token_unit(per),
        tokens,
        hits,
    )
}
