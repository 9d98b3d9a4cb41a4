//! cost's per-worker state (wasm32): what the root context shares with the requests
//! ([`Shared`]: configuration, counters, log throttles, the price table in use, and global mode's
//! outbox, calls and replay queue), and what both sides do with it: throttled log lines, the
//! tick the requests ask the root context for, bookings handed to the replay queue.

use std::cell::RefCell;
use std::rc::Rc;

use tollgate_common::host_calls::{self as host_calls, count_n, now_unix_millis};
use tollgate_common::log_every::LogEvery;
use tollgate_common::prefetch::{Read, ReadList};
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::skeleton::global_call::{CallCounters, GlobalCall};

use crate::config::{Config, TenantSource};
use crate::counters::Counters;
use crate::global::{Booking, Claims, CostGlobal, Outbox, SendTicks, REPLAY_MAX};
use crate::ledger::BookStats;
use crate::price_table::PriceTable;
use crate::replay_queue::{QueueError, ReplayQueue};

/// How often a worker logs one kind of recurring problem (ms).
pub(crate) const LOG_INTERVAL_MS: u64 = 10_000;
/// Tick period with `global` while nothing waits to be sent (ms): the replay queue and a booking
/// call never reported are looked at this often.
pub(crate) const GLOBAL_TICK_MILLIS: u32 = 100;
/// Tick period (ms) asked for by a request that queues a booking while no booking call is in
/// flight: the root context sends it on the next tick. In Envoy a new period re-arms the root
/// context's timer at once (`Wasm::setTimerPeriod`, source/extensions/common/wasm/wasm.cc), so
/// the booking leaves about 1 ms later with whatever else completed meanwhile; nginx's module
/// re-arms a tick timer only when it fires (nginx-compat/module/src/timers.rs, `tick_handler`),
/// so there it leaves on the pending tick (at most GLOBAL_TICK_MILLIS).
pub(crate) const BOOKING_TICK_MILLIS: u32 = 1;

impl Counters {
    /// Adds a ledger operation's statistics.
    pub(crate) fn add(&self, stats: &BookStats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.tenants_created, u64::from(stats.created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
        count_n(self.store_full, u64::from(stats.store_full));
    }

    /// The ids the skeleton's `GlobalCall` counts the calls with.
    pub(crate) fn calls(&self) -> CallCounters {
        CallCounters {
            error_dispatch: self.global_error_dispatch,
            error_grpc_status: self.global_error_grpc_status,
            error_reply: self.global_error_reply,
            error_breaker_open: self.global_error_breaker_open,
            fallback_local: self.global_fallback_local,
            fallback_allow: self.global_fallback_allow,
            fallback_deny: self.global_fallback_deny,
            breaker_opened: self.global_breaker_opened,
        }
    }
}

/// When this worker last logged a recurring problem, one throttle per kind.
pub(crate) struct Logs {
    /// A ledger store failure.
    pub(crate) store: LogEvery,
    /// An unpriceable response.
    pub(crate) unpriced: LogEvery,
    /// A booking dropped (outbox or replay queue full or unavailable).
    pub(crate) dropped: LogEvery,
    /// A request body refused because the filter cannot read it.
    pub(crate) unreadable: LogEvery,
    /// The tick that sends a booking could not be shortened.
    pub(crate) tick: LogEvery,
    /// A call starting billable work the filter cannot price, refused or allowed.
    pub(crate) unpriced_call: LogEvery,
}

impl Logs {
    pub(crate) fn new() -> Logs {
        Logs {
            store: LogEvery::new(LOG_INTERVAL_MS),
            unpriced: LogEvery::new(LOG_INTERVAL_MS),
            dropped: LogEvery::new(LOG_INTERVAL_MS),
            unreadable: LogEvery::new(LOG_INTERVAL_MS),
            tick: LogEvery::new(LOG_INTERVAL_MS),
            unpriced_call: LogEvery::new(LOG_INTERVAL_MS),
        }
    }
}

/// Global mode's per-worker state.
pub(crate) struct GlobalState {
    pub(crate) config: CostGlobal,
    /// The calls to the service, shared by the checks (requests) and the bookings (root
    /// context): one breaker.
    pub(crate) call: GlobalCall,
    /// Bookings of this worker not yet sent (the root context sends them on ticks).
    pub(crate) outbox: RefCell<Outbox>,
    /// Carries of month spend this worker asked for (`crate::month_windows`), sent by the root
    /// context before its bookings.
    pub(crate) claims: RefCell<Claims>,
    /// When the root context sends the outbox (the booking call in flight, the tick period).
    pub(crate) ticks: SendTicks,
    /// Bookings whose call failed, shared by every worker.
    pub(crate) queue: ReplayQueue,
}

/// What the root context shares with the requests.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// What the request headers and response headers phases read, in one host call each where
    /// the host offers it (`tollgate_common::prefetch`).
    pub(crate) reads: PhaseReads,
    pub(crate) counters: Counters,
    pub(crate) logs: Logs,
    /// The table in use: `prices`, then each good remote table.
    pub(crate) prices: RefCell<Rc<PriceTable>>,
    pub(crate) global: Option<GlobalState>,
}

/// The header reads of two phases (`crate::pipeline`'s admission and response).
pub(crate) struct PhaseReads {
    /// The tenant's identity, `content-encoding`, `content-type`, `:path` (`:method`, read
    /// only for some requests, by its own call), the clock.
    pub(crate) request: ReadList<5>,
    /// `:status`, `content-length`, `content-encoding`, `content-type`.
    pub(crate) response: ReadList<4>,
}

impl PhaseReads {
    /// Where each value of [`PhaseReads::request`] is.
    pub(crate) const CONTENT_ENCODING: usize = 1;
    pub(crate) const CONTENT_TYPE: usize = 2;
    pub(crate) const PATH: usize = 3;
    pub(crate) const CLOCK: usize = 4;
    /// Where each value of [`PhaseReads::response`] is.
    pub(crate) const STATUS: usize = 0;
    pub(crate) const CONTENT_LENGTH: usize = 1;
    pub(crate) const RESPONSE_ENCODING: usize = 2;
    pub(crate) const MEDIA_TYPE: usize = 3;

    pub(crate) fn new(config: &Config) -> PhaseReads {
        let (TenantSource::Identity(identity) | TenantSource::ApiKey(identity)) = &config.tenant;
        PhaseReads {
            request: ReadList::new([
                Read::of_identity(identity),
                Read::RequestHeader("content-encoding"),
                Read::RequestHeader("content-type"),
                Read::RequestHeader(":path"),
                Read::Clock,
            ]),
            response: ReadList::new([
                Read::ResponseHeader(":status"),
                Read::ResponseHeader("content-length"),
                Read::ResponseHeader("content-encoding"),
                Read::ResponseHeader("content-type"),
            ]),
        }
    }
}

impl Shared {
    /// The price table in use.
    pub(crate) fn table(&self) -> Rc<PriceTable> {
        Rc::clone(&self.prices.borrow())
    }

    /// Logs a store failure (at most once per interval and worker).
    pub(crate) fn store_failed(&self, what: &str, status: u32) {
        if let Some(unlogged) = self.logs.store.due(now_unix_millis()) {
            log::warn!(
                "{what} (shared data: host status {status}, a full zone?); \
                 {unlogged} more since the last line"
            );
        }
    }

    /// Asks the root context for a tick in BOOKING_TICK_MILLIS, unless one is already asked for
    /// or a booking call is in flight. Called from a request's context: the tick period is the
    /// root context's whichever context sets it (proxy-wasm-cpp-host `ContextBase::setTimerPeriod`
    /// uses `root_context()->id()`; nginx-compat's `proxy_set_tick_period_milliseconds` sets the
    /// current root's). A request's context cannot send the booking itself: the Rust SDK
    /// delivers a call's reply to the context that made it and drops it once that context is gone
    /// (proxy-wasm 0.2.5 `dispatcher.rs`, `register_grpc_callout`, `on_grpc_receive`).
    pub(crate) fn wake_root(&self, g: &GlobalState) {
        let Some(ms) = g.ticks.queued() else {
            return;
        };
        match host_calls::set_tick_period_ms(ms) {
            Ok(()) => g.ticks.asked(ms),
            Err(status) => {
                if let Some(unlogged) = self.logs.tick.due(now_unix_millis()) {
                    log::warn!(
                        "cannot shorten the tick to send a booking (host status {status}); \
                         it leaves on the next {GLOBAL_TICK_MILLIS} ms tick ({unlogged} more \
                         since the last line)"
                    );
                }
            }
        }
    }

    /// Back to GLOBAL_TICK_MILLIS after a short tick (from the root context).
    pub(crate) fn settle_tick(&self, g: &GlobalState) {
        let Some(ms) = g.ticks.ticked() else {
            return;
        };
        match host_calls::set_tick_period_ms(ms) {
            Ok(()) => g.ticks.asked(ms),
            Err(status) => log::error!(
                "cannot set the tick period back to {ms} ms (it stays {} ms): host status \
                 {status}",
                g.ticks.period_ms()
            ),
        }
    }

    /// Bookings that could not be sent go to the replay queue; those it cannot take are dropped
    /// (counted, logged).
    pub(crate) fn requeue(&self, g: &GlobalState, bookings: &[Booking]) {
        if bookings.is_empty() {
            return;
        }
        let n = u64::try_from(bookings.len()).unwrap_or(u64::MAX);
        match g.queue.push(&HostSharedData, bookings) {
            Ok(q) => {
                count_n(self.counters.global_queued, u64::from(q.kept));
                if q.dropped > 0 || q.corrupt {
                    count_n(self.counters.global_dropped, u64::from(q.dropped));
                    self.dropped(&format!(
                        "{} bookings dropped: the replay queue is full ({REPLAY_MAX}){}",
                        q.dropped,
                        if q.corrupt {
                            "; an unreadable queue was replaced"
                        } else {
                            ""
                        }
                    ));
                }
            }
            Err(e) => {
                count_n(self.counters.global_dropped, n);
                let why = match e {
                    QueueError::Failed(s) => format!("shared data status {s}"),
                    QueueError::Contended => "CAS attempts exhausted".to_string(),
                };
                self.dropped(&format!(
                    "{n} bookings dropped: the replay queue cannot be written ({why})"
                ));
            }
        }
    }

    /// Logs dropped bookings (at most once per interval and worker).
    pub(crate) fn dropped(&self, what: &str) {
        if let Some(unlogged) = self.logs.dropped.due(now_unix_millis()) {
            log::warn!(
                "global budgets: {what}; the service under-counts that spend \
                 ({unlogged} more since the last line)"
            );
        }
    }
}
