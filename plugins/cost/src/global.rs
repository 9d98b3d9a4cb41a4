//! Global budgets, host-free: a tenant's day and month spend counted by Envoy's rate limit
//! service (`ShouldRateLimit`, `tollgate_common::rls`) shared by every gateway instead of per
//! instance; the local ledger (`crate::ledger`) keeps booking and is what `on_error: local`
//! decides with.
//!
//! # Units
//!
//! The protocol counts hits in `uint32` (`requests_per_unit`), so spend is counted in **booking
//! units** of `unit_nano_usd` nano-USD (default 100,000 = 10^-4 USD: a budget up to about
//! 429,496 USD fits). A budget is `floor(budget / unit)` units (refused sooner, never later);
//! one that does not fit in a `uint32` refuses the configuration naming its field. A booking is
//! `ceil(cost / unit)` units (never under-counted), at most `u32::MAX` per booking (the reference
//! server passes a descriptor's `uint64` hits to Redis' signed `INCRBY`: values past 2^63 refund
//! or poison a counter, `src/redis/fixed_cache_impl.go`, so nothing past `u32::MAX` is sent).
//!
//! # Descriptors
//!
//! One per budgeted period of the tenant, in this order: the month's (if it has a month budget),
//! then the day's:
//! - entries `("cost", "<len>:<ledger>/month/<yyyymm>")` and `("tenant", <tenant>)`, the limit
//!   override `{month units, YEAR}`;
//! - entries `("cost", "<len>:<ledger>/day/<yyyymmdd>")` and `("tenant", <tenant>)`, the limit
//!   override `{day units, DAY}`.
//!
//! The reference server keys Redis by `<domain>_<key>_<value>_..._<window start>` joined with `_`
//! without escaping (`src/limiter/cache_key.go`, `GenerateCacheKey`); here the only value a
//! client chooses (the tenant) is last and the `cost` value starts with its own length, so
//! distinct descriptors give distinct keys, and none equals rate-limit's (whose first entry is
//! `rule`).
//!
//! **Windows.** The reference server's windows are aligned on the Unix epoch (`[now - now %
//! length, + length)`, `src/utils/utilities.go` `UnitToDivider`, `CalculateReset`): DAY is the
//! UTC day, MONTH is 30 days and YEAR 365 days from the epoch, not calendar months or years.
//! The day's descriptor names the day it counts, the month's the calendar month (`period.rs`), so
//! a counter never spans two periods. The month's counter lives in a YEAR window, which holds
//! the whole month except in the one calendar month per year that contains a YEAR boundary
//! (epoch + k·365 days: 2025-12-18, 2026-12-18, 2027-12-18, 2028-12-17 at 00:00 UTC...): there
//! the count restarts at that boundary, and the month's budget can be spent once before it and
//! once after. [`year_boundary_in_month`] says which month that is.
//!
//! # The check and the booking
//!
//! Before the upstream: one call with every descriptor's `hits_addend` 0, a pure check in the
//! reference server (`src/utils/utilities.go` `GetHitsAddends`: a descriptor's own hits_addend
//! wins, 0 included; `INCRBY key 0`). It answers OK with `limit_remaining` 0 when the counter is
//! exactly at the limit (over means counter > limit: `src/limiter/base_limiter.go`
//! `GetResponseDescriptorStatus`), so a budget is spent when a status is over limit **or** has
//! `limit_remaining` 0, the local rule `spend >= budget`. What this worker has queued for the
//! tenant and not sent yet ([`Outbox::pending`]) is taken off `limit_remaining` first
//! ([`decide`]'s `pending`), and a cost known in advance must fit in what is left (`needed`).
//!
//! After the priced response: the spend in units as the descriptors' `hits_addend`
//! ([`Booking`]). Bookings wait in a per-worker [`Outbox`] (merged per tenant and period,
//! bounded) that the root context sends in batches, one call in flight per worker; a batch that
//! fails goes to the [`ReplayQueue`](crate::replay_queue::ReplayQueue) in shared data (bounded), which any worker's tick replays.
//! A booking for a day or month that has ended by the time it is sent drops that period (its
//! counter no longer matters).

use std::cell::Cell;
use std::collections::BTreeMap;

use tollgate_common::config::ConfigError;
use tollgate_common::rls::{
    Entry, GlobalConfig, LimitOverride, RateLimitDescriptor, RateLimitRequest, Unit, Verdict,
};

use crate::ledger::{Budget, Exceeded};
use crate::period::Periods;

/// Default `global.unit_nano_usd`: 10^-4 USD.
pub const DEFAULT_UNIT_NANO_USD: u64 = 100_000;
/// Largest `global.unit_nano_usd`: 1 USD.
pub const MAX_UNIT_NANO_USD: u64 = 1_000_000_000;
/// Bookings (distinct tenant, day and month) a worker's [`Outbox`] holds; beyond, a booking is
/// dropped (counted, logged).
pub const OUTBOX_MAX: usize = 4096;
/// Bookings sent in one call (two descriptors each, at most).
pub const BATCH_MAX: usize = 64;
/// Bookings the shared [`ReplayQueue`](crate::replay_queue::ReplayQueue) holds; beyond, a failed booking is dropped (counted,
/// logged). About 140 bytes each at most (128-byte tenant): under 36 KiB.
pub const REPLAY_MAX: usize = 256;
/// CAS attempts of one replay-queue update.
pub const REPLAY_CAS_ATTEMPTS: u32 = 16;
/// The descriptor entry naming the ledger, period and period id.
pub const COST_ENTRY: &str = "cost";
/// The descriptor entry carrying the tenant.
pub const TENANT_ENTRY: &str = "tenant";

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
    let body = format!("{ledger}/{name}/{id}");
    format!("{}:{body}", body.len())
}

fn descriptor(
    ledger: &str,
    tenant: &str,
    period: Period,
    id: u32,
    limit: u32,
    hits: u32,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![
            Entry {
                key: COST_ENTRY.to_string(),
                value: cost_entry(ledger, period, id),
            },
            Entry {
                key: TENANT_ENTRY.to_string(),
                value: tenant.to_string(),
            },
        ],
        limit: Some(LimitOverride {
            requests_per_unit: limit,
            unit: match period {
                Period::Month => Unit::Year as i32,
                Period::Day => Unit::Day as i32,
            },
        }),
        hits_addend: Some(u64::from(hits)),
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

    /// The periods limited, in descriptor order (month first).
    pub fn periods(&self) -> Vec<Period> {
        let mut out = Vec::with_capacity(2);
        if self.month.is_some() {
            out.push(Period::Month);
        }
        if self.day.is_some() {
            out.push(Period::Day);
        }
        out
    }
}

/// The check before the upstream: `hits_addend` 0 on each budgeted period of `tenant` at `now`
/// (`None` when the tenant has no budget: no call).
pub fn check_request(
    domain: &str,
    ledger: &str,
    tenant: &str,
    limits: &Limits,
    now: &Periods,
) -> Option<RateLimitRequest> {
    let mut descriptors = Vec::with_capacity(2);
    if let Some(m) = limits.month {
        descriptors.push(descriptor(ledger, tenant, Period::Month, now.month, m, 0));
    }
    if let Some(d) = limits.day {
        descriptors.push(descriptor(ledger, tenant, Period::Day, now.day, d, 0));
    }
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

/// Where a booking counts: the tenant and the period ids it was made in (0: the period is not
/// budgeted).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BookingKey {
    /// The tenant (1 to 128 visible ASCII bytes: `config::valid_tenant`).
    pub tenant: String,
    /// `yyyymmdd`, or 0.
    pub day: u32,
    /// `yyyymm`, or 0.
    pub month: u32,
}

/// Spend to add to the service's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    /// Where.
    pub key: BookingKey,
    /// Booking units (≥ 1).
    pub units: u32,
}

impl Booking {
    /// The booking of `nano` nano-USD by `tenant` (with `limits`) at `now`; `None` when there is
    /// nothing to book (no cost, or no budgeted period).
    pub fn new(
        global: &CostGlobal,
        tenant: &str,
        limits: &Limits,
        now: &Periods,
        nano: u64,
    ) -> Option<Booking> {
        let units = global.cost_units(nano);
        let key = BookingKey {
            tenant: tenant.to_string(),
            day: if limits.day.is_some() { now.day } else { 0 },
            month: if limits.month.is_some() { now.month } else { 0 },
        };
        (units > 0 && (key.day != 0 || key.month != 0)).then_some(Booking { key, units })
    }
}

/// Adds `units` to the booking of `key` in `map` (saturating), or inserts it if `map` has fewer
/// than `max` entries; `false` when it is full.
pub(crate) fn merge(
    map: &mut BTreeMap<BookingKey, u32>,
    key: BookingKey,
    units: u32,
    max: usize,
) -> bool {
    if let Some(u) = map.get_mut(&key) {
        *u = u.saturating_add(units);
        return true;
    }
    if map.len() >= max {
        return false;
    }
    map.insert(key, units);
    true
}

/// A worker's bookings not yet sent, merged per [`BookingKey`], at most `max` of them.
#[derive(Debug, Default)]
pub struct Outbox {
    queued: BTreeMap<BookingKey, u32>,
    max: usize,
}

impl Outbox {
    /// An empty outbox of at most `max` bookings.
    pub fn new(max: usize) -> Outbox {
        Outbox {
            queued: BTreeMap::new(),
            max,
        }
    }

    /// Queues `b`; `false` when the outbox is full and `b` is a new key (dropped).
    pub fn push(&mut self, b: Booking) -> bool {
        merge(&mut self.queued, b.key, b.units, self.max)
    }

    /// Takes up to `n` bookings.
    pub fn take(&mut self, n: usize) -> Vec<Booking> {
        let mut out = Vec::with_capacity(n.min(self.queued.len()));
        while out.len() < n {
            let Some((key, units)) = self.queued.pop_first() else {
                break;
            };
            out.push(Booking { key, units });
        }
        out
    }

    /// The units queued for `tenant` in `now`'s day and month (saturating): what the service
    /// will count once they are sent. One range scan over the tenant's keys (at most one per
    /// day and month it booked in while they wait).
    pub fn pending(&self, tenant: &str, now: &Periods) -> Pending {
        let from = BookingKey {
            tenant: tenant.to_string(),
            day: 0,
            month: 0,
        };
        let mut out = Pending::default();
        for (key, units) in self.queued.range(from..) {
            if key.tenant != tenant {
                break;
            }
            if key.month != 0 && key.month == now.month {
                out.month = out.month.saturating_add(*units);
            }
            if key.day != 0 && key.day == now.day {
                out.day = out.day.saturating_add(*units);
            }
        }
        out
    }

    /// Bookings queued.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

/// When a worker's root context sends its bookings: on the reply of the booking call in flight
/// (at most one per worker), else on a tick. A request that queues a booking while no call is in
/// flight asks for a short tick (`booking_ms`) instead of leaving it for the regular one
/// (`idle_ms`); the tick that follows asks for `idle_ms` again. Host-free: the filter asks the
/// host for the periods this returns (`proxy_set_tick_period_milliseconds`) and tells it which
/// one the host took ([`SendTicks::asked`]; a period the host refused is asked again on the next
/// booking).
#[derive(Debug)]
pub struct SendTicks {
    idle_ms: u32,
    booking_ms: u32,
    asked_ms: Cell<u32>,
    in_flight: Cell<bool>,
}

impl SendTicks {
    /// Ticks of `idle_ms` (the period in use at the start), `booking_ms` while a booking waits.
    pub fn new(idle_ms: u32, booking_ms: u32) -> SendTicks {
        SendTicks {
            idle_ms,
            booking_ms,
            asked_ms: Cell::new(idle_ms),
            in_flight: Cell::new(false),
        }
    }

    /// A booking was queued: the tick period to ask for now, if any (none while a call is in
    /// flight, whose reply sends it, or when the short tick is already asked for).
    pub fn queued(&self) -> Option<u32> {
        (!self.in_flight.get() && self.asked_ms.get() != self.booking_ms).then_some(self.booking_ms)
    }

    /// A tick has sent what it could: the tick period to ask for now, if any.
    pub fn ticked(&self) -> Option<u32> {
        (self.asked_ms.get() != self.idle_ms).then_some(self.idle_ms)
    }

    /// The host took `ms` as the tick period.
    pub fn asked(&self, ms: u32) {
        self.asked_ms.set(ms);
    }

    /// Whether a booking call is in flight.
    pub fn set_in_flight(&self, in_flight: bool) {
        self.in_flight.set(in_flight);
    }

    /// The tick period last taken by the host (ms).
    pub fn period_ms(&self) -> u32 {
        self.asked_ms.get()
    }
}

/// A batch of bookings as one `ShouldRateLimit` request at `now`, and what was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    /// The request (`None`: nothing left to send).
    pub request: Option<RateLimitRequest>,
    /// The bookings it carries (to replay if it fails).
    pub sent: Vec<Booking>,
    /// Bookings whose every period has ended (dropped, counted).
    pub stale: u32,
}

/// The request booking `batch` at `now`: per booking, a descriptor per period still current
/// with `limits_of(tenant)`'s limit (a period no longer budgeted is skipped) and the booking's
/// units as `hits_addend`. A period that has ended is dropped (its counter no longer matters).
pub fn batch_request(
    domain: &str,
    ledger: &str,
    batch: Vec<Booking>,
    now: &Periods,
    limits_of: impl Fn(&str) -> Limits,
) -> BatchRequest {
    let mut descriptors = Vec::with_capacity(batch.len().saturating_mul(2));
    let mut sent = Vec::with_capacity(batch.len());
    let mut stale = 0u32;
    for b in batch {
        let limits = limits_of(&b.key.tenant);
        let before = descriptors.len();
        if let Some(m) = limits.month.filter(|_| b.key.month == now.month) {
            descriptors.push(descriptor(
                ledger,
                &b.key.tenant,
                Period::Month,
                now.month,
                m,
                b.units,
            ));
        }
        if let Some(d) = limits.day.filter(|_| b.key.day == now.day) {
            descriptors.push(descriptor(
                ledger,
                &b.key.tenant,
                Period::Day,
                now.day,
                d,
                b.units,
            ));
        }
        if descriptors.len() == before {
            stale = stale.saturating_add(1);
        } else {
            sent.push(b);
        }
    }
    BatchRequest {
        request: (!descriptors.is_empty()).then(|| RateLimitRequest {
            domain: domain.to_string(),
            descriptors,
            hits_addend: 0,
        }),
        sent,
        stale,
    }
}

/// The first YEAR-window boundary of the reference server (a multiple of 365 days after the
/// epoch) strictly inside calendar month `month` (`yyyymm`), as Unix seconds: the month whose
/// global count restarts there (see the module documentation). `None` for most months.
pub fn year_boundary_in_month(month: u32) -> Option<u64> {
    const YEAR: u64 = 365 * 86_400;
    let (y, m) = (u64::from(month / 100), u64::from(month % 100));
    let start = month_start(y, m)?;
    let (ny, nm) = if m == 12 {
        (y.checked_add(1)?, 1)
    } else {
        (y, m.checked_add(1)?)
    };
    let end = month_start(ny, nm)?;
    let next = start.div_ceil(YEAR).checked_mul(YEAR)?;
    (next > start && next < end).then_some(next)
}

/// Unix seconds of 00:00 UTC on the first of month `m` (1-12) of year `y` (1970-9999).
fn month_start(y: u64, m: u64) -> Option<u64> {
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    crate::period::days_from_civil(y, m, 1).checked_mul(86_400)
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
