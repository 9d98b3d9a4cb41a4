//! The `global` block: where and how to call the rate limit service, and the booking unit
//! (budgets and costs in units of `unit_nano_usd` nano-USD: the protocol counts in `uint32`).

use tollgate_common::config::ConfigError;
use tollgate_common::rls::GlobalConfig;

use crate::ledger::Budget;

/// Default `global.unit_nano_usd`: 10^-4 USD.
pub const DEFAULT_UNIT_NANO_USD: u64 = 100_000;

/// Largest `global.unit_nano_usd`: 1 USD.
pub const MAX_UNIT_NANO_USD: u64 = 1_000_000_000;

/// The cost filter's `global` block: `tollgate_common::rls::GlobalConfig`'s members plus
/// `unit_nano_usd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostGlobal {
    /// Where and how to call the service.
    pub rls: GlobalConfig,
    /// Nano-USD per booking unit (1 to 10^9).
    pub unit_nano_usd: u64,
}

impl CostGlobal {
    /// Parses the `global` block, its JSON text (errors name `global.<member>`).
    pub fn parse(json: &str) -> Result<CostGlobal, ConfigError> {
        let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("global", format!("must be an object: {e}")))?;
        let unit_nano_usd = match map.remove("unit_nano_usd") {
            None => DEFAULT_UNIT_NANO_USD,
            Some(v) => v
                .as_u64()
                .filter(|u| (1..=MAX_UNIT_NANO_USD).contains(u))
                .ok_or_else(|| {
                    ConfigError::new(
                        "global.unit_nano_usd",
                        format!("{v} must be an integer from 1 to {MAX_UNIT_NANO_USD}"),
                    )
                })?,
        };
        let rest = serde_json::to_vec(&map)
            .map_err(|e| ConfigError::new("global", format!("cannot be read: {e}")))?;
        let rls = GlobalConfig::parse(&rest, "global")?;
        Ok(CostGlobal { rls, unit_nano_usd })
    }

    /// A budget in booking units, rounded down; `field` names it in the error when it does not
    /// fit the protocol's `uint32`.
    pub fn limit_units(&self, nano: u64, field: &str) -> Result<u32, ConfigError> {
        let units = nano.checked_div(self.unit_nano_usd).unwrap_or(u64::MAX);
        u32::try_from(units).map_err(|_| {
            ConfigError::new(
                field,
                format!(
                    "{nano} nano-USD is {units} booking units of global.unit_nano_usd \
                     ({} nano-USD), more than the rate limit protocol's uint32 \
                     requests_per_unit ({}); raise global.unit_nano_usd",
                    self.unit_nano_usd,
                    u32::MAX
                ),
            )
        })
    }

    /// A cost in booking units, rounded up, at most `u32::MAX`.
    pub fn cost_units(&self, nano: u64) -> u32 {
        let units = nano.div_ceil(self.unit_nano_usd.max(1));
        u32::try_from(units).unwrap_or(u32::MAX)
    }

    /// Checks that every budget fits (`budgets.default.*`, `budgets.tenants.<name>.*`).
    pub fn check_budgets<'a>(
        &self,
        budgets: impl Iterator<Item = (String, &'a Budget)>,
    ) -> Result<(), ConfigError> {
        for (at, b) in budgets {
            if let Some(d) = b.day {
                self.limit_units(d, &format!("{at}.day_nano_usd"))?;
            }
            if let Some(m) = b.month {
                self.limit_units(m, &format!("{at}.month_nano_usd"))?;
            }
        }
        Ok(())
    }
}
