//! What every test file uses: a configuration with one priced model, a `global` block, a fixed
//! clock time and booking keys.

use tollgate_cost::config::Config;
use tollgate_cost::global::{BatchLimits, BookingKey, CostGlobal, Limits};
use tollgate_cost::token_limits::window::Per;

const PRICES: &str =
    r#""prices": {"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}}"#;

pub(crate) fn config(rest: &str) -> Result<Config, tollgate_common::config::ConfigError> {
    let json = format!(r#"{{{PRICES}, "tenant": {{"header": "x-jwt-sub"}}, {rest}}}"#);
    Config::parse(json.as_bytes())
}

pub(crate) fn global(unit: u64) -> CostGlobal {
    let json = format!(r#"{{"service":"ratelimit","domain":"tollgate","unit_nano_usd":{unit}}}"#);
    CostGlobal::parse(&json).unwrap()
}

/// 2025-01-31T12:00:00Z.
pub(crate) const JAN31_NOON: u64 = 1_738_324_800;

pub(crate) fn key(tenant: &str, day: u32, month: u32) -> BookingKey {
    BookingKey {
        tenant: tenant.into(),
        day,
        month,
        into: None,
        tokens: None,
    }
}

/// Batch limits of one budget for every tenant, and no token limit.
pub(crate) fn budget_only(
    limits: Limits,
) -> BatchLimits<impl Fn(&str) -> Limits, impl Fn(&str, &str, Per) -> Option<u32>> {
    BatchLimits {
        budget: move |_: &str| limits,
        tokens: |_: &str, _: &str, _: Per| None,
    }
}
