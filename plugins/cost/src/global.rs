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
//! - in a month that holds a YEAR boundary, the bridge: `("cost",
//!   "<len>:<ledger>/month-bridge/<yyyymm>")`, `("tenant", <tenant>)`, `{month units, MONTH}`
//!   (`crate::month_windows`);
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
//! (epoch + k·365 days: 2026-12-18, 2027-12-18, 2028-12-17 at 00:00 UTC...): there the month is
//! also counted by a bridge in MONTH windows, and the spend before a window's start is carried
//! into it once (`crate::month_windows`).
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
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tollgate_common::config::ConfigError;
use tollgate_common::rls::{
    Entry, GlobalConfig, LimitOverride, RateLimitDescriptor, RateLimitRequest, Unit, Verdict,
};

use crate::ledger::{Budget, Exceeded};
use crate::month_windows::{self, Carry, Counter};
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
    entry_value(ledger, name, id)
}

/// `<len>:<ledger>/<name>/<id>`: the `cost` entry's value of counter `name` of period `id`.
fn entry_value(ledger: &str, name: &str, id: u32) -> String {
    let body = format!("{ledger}/{name}/{id}");
    format!("{}:{body}", body.len())
}

/// The descriptor of `tenant`'s counter `name` (`month`, `day`, ...) of period `id`, in `unit`
/// windows.
fn descriptor(
    ledger: &str,
    tenant: &str,
    (name, id): (&str, u32),
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
fn period_descriptors(
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
                (c.name(), now.month),
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
            ("day", now.day),
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
    /// A carry into this month counter ([`claim_outcome`]): booked there only, in the carry's
    /// interval; `None` for spend.
    pub into: Option<Counter>,
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
            into: None,
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
            into: None,
        };
        let mut out = Pending::default();
        for (key, units) in self.queued.range(from..) {
            if key.tenant != tenant {
                break;
            }
            if key.into.is_some() {
                continue; // a carry: the spend it carries is counted already
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

/// The carries a worker has asked the service to claim (`month_windows`): each (tenant, month,
/// counter, window) at most once while remembered, at most `max` remembered (when full, all are
/// forgotten: a carry asked again is claimed again, and the service answers that claim over, so
/// nothing is carried twice).
#[derive(Debug, Default)]
pub struct Claims {
    asked: BTreeSet<(String, u32, Counter, u64)>,
    queued: VecDeque<Claim>,
    max: usize,
}

impl Claims {
    /// No claim asked, at most `max` remembered.
    pub fn new(max: usize) -> Claims {
        Claims {
            asked: BTreeSet::new(),
            queued: VecDeque::new(),
            max,
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
/// units as `hits_addend`: the month's counters (`month_windows::counters`), then the day's. A
/// carry goes to its counter only, and only during its interval (`month_windows::carry_due`). A
/// period that has ended is dropped (its counter no longer matters).
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
        match b.key.into {
            None => {
                let current = Limits {
                    month: limits.month.filter(|_| b.key.month == now.month),
                    day: limits.day.filter(|_| b.key.day == now.day),
                };
                let hits = (b.units, b.units);
                period_descriptors(ledger, &b.key.tenant, &current, now, hits, &mut descriptors);
            }
            Some(to) => {
                let due = month_windows::carry_due(now.month, now.secs).filter(|c| c.to == to);
                if let (Some(m), Some(c), true) = (limits.month, due, b.key.month == now.month) {
                    let name = (c.to.name(), now.month);
                    let unit = c.to.unit();
                    descriptors.push(descriptor(ledger, &b.key.tenant, name, unit, m, b.units));
                }
            }
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
            descriptor(ledger, t, (to.claim_name(), id), to.unit(), 1, 1),
            descriptor(ledger, t, (from.name(), id), from.unit(), limit, 0),
            descriptor(ledger, t, (to.name(), id), to.unit(), limit, 0),
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
    let count = |s: &tollgate_common::rls::Status| {
        if s.over_limit {
            limit.saturating_add(1)
        } else {
            limit.saturating_sub(s.limit_remaining)
        }
    };
    Some(count(from).saturating_sub(count(to)))
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
