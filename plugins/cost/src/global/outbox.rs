//! Bookings waiting to be sent: their keys (spend, a month carry, or a token limit's window), a
//! worker's outbox, when its root context sends it, and the batch request that does.

use std::cell::Cell;
use std::collections::BTreeMap;

use tollgate_common::rls::RateLimitRequest;

use super::block::CostGlobal;
use super::check::Pending;
use super::descriptors::{descriptor, period_descriptors, token_descriptor, Limits};
use crate::month_windows::{self, Counter};
use crate::period::Periods;
use crate::token_limits::window::{Per, Window};

/// Where a token booking counts: a limit's window (`crate::token_limits::global`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenTarget {
    /// The limit's name.
    pub limit: String,
    /// Its window length.
    pub per: Per,
    /// The window's index (`unix_seconds / length`).
    pub window: u64,
}

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
    /// Tokens of a token limit's window (`token_limits::global`), not spend; `None` for spend.
    pub tokens: Option<TokenTarget>,
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
            tokens: None,
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
            tokens: None,
        };
        let mut out = Pending::default();
        for (key, units) in self.queued.range(from..) {
            if key.tenant != tenant {
                break;
            }
            if key.into.is_some() || key.tokens.is_some() {
                continue; // a carry (its spend is counted already), or tokens
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

/// The limits a batch's bookings are sent with, looked up when it is sent (a booking whose
/// limit is no longer configured is dropped as stale).
pub struct BatchLimits<B, T>
where
    B: Fn(&str) -> Limits,
    T: Fn(&str, &str, Per) -> Option<u32>,
{
    /// The tenant's budget in units.
    pub budget: B,
    /// The tokens of the tenant's global token limit of that name and window length.
    pub tokens: T,
}

/// The request booking `batch` at `now`: per booking, a descriptor per period still current
/// with `limits.budget(tenant)`'s limit (a period no longer budgeted is skipped) and the
/// booking's units as `hits_addend`: the month's counters (`month_windows::counters`), then the
/// day's. A carry goes to its counter only, and only during its interval
/// (`month_windows::carry_due`); tokens to their limit's window while it is current. A period or
/// window that has ended is dropped (its counter no longer matters).
pub fn batch_request<B, T>(
    domain: &str,
    ledger: &str,
    batch: Vec<Booking>,
    now: &Periods,
    limits: &BatchLimits<B, T>,
) -> BatchRequest
where
    B: Fn(&str) -> Limits,
    T: Fn(&str, &str, Per) -> Option<u32>,
{
    let mut descriptors = Vec::with_capacity(batch.len().saturating_mul(2));
    let mut sent = Vec::with_capacity(batch.len());
    let mut stale = 0u32;
    let now_ms = now.secs.saturating_mul(1_000);
    for b in batch {
        let before = descriptors.len();
        let tenant = b.key.tenant.as_str();
        match (&b.key.into, &b.key.tokens) {
            (_, Some(t)) => {
                let current = Window::at(t.per, now_ms).index == t.window;
                if let Some(tokens) = (limits.tokens)(tenant, &t.limit, t.per).filter(|_| current) {
                    let limit = (t.limit.as_str(), t.per);
                    let d = token_descriptor(ledger, tenant, limit, tokens, b.units);
                    descriptors.push(d);
                }
            }
            (None, None) => {
                let budget = (limits.budget)(tenant);
                let current = Limits {
                    month: budget.month.filter(|_| b.key.month == now.month),
                    day: budget.day.filter(|_| b.key.day == now.day),
                };
                let hits = (b.units, b.units);
                period_descriptors(ledger, tenant, &current, now, hits, &mut descriptors);
            }
            (Some(to), None) => {
                let due = month_windows::carry_due(now.month, now.secs).filter(|c| c.to == *to);
                let month = (limits.budget)(tenant).month;
                if let (Some(m), Some(c), true) = (month, due, b.key.month == now.month) {
                    let name = (c.to.name(), Some(now.month));
                    let unit = c.to.unit();
                    descriptors.push(descriptor(ledger, tenant, name, unit, m, b.units));
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
