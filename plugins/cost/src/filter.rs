//! proxy-wasm glue: the root context (configuration, counters, the ledger's records) and the
//! HTTP context (one request), a thin shell over the host-free modules.
//!
//! Host calls go through `tollgate_common::host` (the raw ABI, every status handled), never
//! through the SDK's helpers, which unwrap or panic on statuses they do not expect.
//!
//! Per request:
//! 1. Request headers: the tenant; one shared-data read of its spend (a tenant with a budget and
//!    no record yet gets one, see `ledger`); over budget → a local reply (402/429, JSON error,
//!    `x-tollgate-budget-reset`, `retry-after`) before the upstream. Then, unless disabled:
//!    `accept-encoding: identity` (the filter must read the response), and for a POST with a
//!    body the body is held (`max_request_body_bytes`) until it has been read; on an OpenAI
//!    completions path its `content-length` is removed, since the body may change size.
//! 2. Request body, whole: its `model` (a model without a price is refused before the upstream
//!    by `unknown_model`), and for a stream on an OpenAI completions path without
//!    `stream_options.include_usage`, the body rewritten to ask for it (`request`).
//! 3. Response headers: the status; `content-encoding` (decoded if gzip/deflate, `decode`);
//!    `text/event-stream` → an event stream (`sse`), JSON → a document scanned incrementally
//!    (`json_scan`): no size bound skips the count. Nothing is held (see the README on why Envoy
//!    cannot delay response headers until the body is known).
//! 4. Response body: chunks pass on as they come (`Continue`); only when the filter added
//!    `include_usage` is the usage event it caused removed from the stream, each event being
//!    held until it is complete. The spend is booked, and the signals set, when the body is
//!    complete as the client sees it, before the chunk that completes it is passed on: its
//!    `Content-Length` reached (`body_end`), a stream's final event (`sse`), or the host's end of
//!    stream, whichever comes first. A response that cannot be priced exactly is counted by
//!    reason and charged per `unpriced_charge` (`unpriced`).
//! 5. Log (the stream ended without reaching the above, e.g. reset): booked from what was seen.
//!
//! With `global` (`crate::global`), step 1 for a tenant with a budget is one `ShouldRateLimit`
//! check (the request paused until the reply, `on_error` when there is none; what this worker
//! has queued for the tenant and not sent is taken off the service's `limit_remaining`), and
//! each booking is also queued in the worker's outbox, which the root context sends: at once on
//! the reply of the booking call in flight (one per worker), else on a 1 ms tick that the
//! request queueing the booking asks for (back to 100 ms after it; nginx keeps the 100 ms tick,
//! see BOOKING_TICK_MILLIS); a failed batch goes to the
//! shared replay queue, replayed from ticks. Bookings are sent by the root context because the
//! Rust SDK delivers a call's reply only to the context that made it, and a request's context is
//! gone soon after its booking (see `Shared::wake_root`).
//!
//! With `remote_prices`, the root context refreshes the price table on ticks through
//! `tollgate_common::remote_fetch` (one fetch per `cache_duration_seconds` for the whole
//! gateway); a fetched table replaces the one in use only once it parsed whole and priced at
//! least one model. Requests use the table in use when they are priced.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType};
use tollgate_common::host::now_unix_secs;
use tollgate_common::host::{
    self as host, add_response_header, count, count_n, now_unix_millis, plugin_configuration,
    request_header_bytes, send_json_error, set_request_header,
};
use tollgate_common::identity::HostIdentityView;
use tollgate_common::log_every::LogEvery;
use tollgate_common::remote::TICK_MILLIS;
use tollgate_common::remote_fetch::RemoteDocument;
use tollgate_common::rls::{self, Admit, Breaker, CallFailure, OnError};
use tollgate_common::shared_data::{ensure_key, HostSharedData, StoreError};
use tollgate_common::signals;

use crate::body_end::BodyEnd;
use crate::config::{
    Config, StoreFullAction, UnknownModelAction, UnpricedCharge, PRICES_NAMESPACE,
};
use crate::counters::Counters;
use crate::decode::{Coding, DecodeError, Decoder};
use crate::global::{
    batch_request, check_request, decide, encode_queue, Booking, CostGlobal, Decision, Limits,
    Outbox, Period, QueueError, ReplayQueue, SendTicks, BATCH_MAX, OUTBOX_MAX, REPLAY_MAX,
};
use crate::json_scan::{JsonScan, ScanError};
use crate::ledger::{BookStats, Budget, Exceeded, Lookup, OpenError, Spend, Standing};
use crate::period::Periods;
use crate::price::cost_nano;
use crate::price_table::{IncrementalParse, Loaded, PriceTable, Step};
use crate::request::{stream_usage_on_request, RequestBody};
use crate::sse::StreamState;
use crate::unpriced::{estimate, Reason};
use crate::unreadable::{self, Unreadable};
use crate::usage::{scanned_body_usage, Usage};

/// How often a worker logs one kind of recurring problem (ms).
const LOG_INTERVAL_MS: u64 = 10_000;

/// Refusal header: seconds until the exhausted budget resets (delay-seconds, as Retry-After).
pub const BUDGET_RESET_HEADER: &str = "x-tollgate-budget-reset";

/// Tick period with `global` while nothing waits to be sent (ms): the replay queue and a booking
/// call never reported are looked at this often.
const GLOBAL_TICK_MILLIS: u32 = 100;
/// Tick period (ms) asked for by a request that queues a booking while no booking call is in
/// flight: the root context sends it on the next tick. In Envoy a new period re-arms the root
/// context's timer at once (`Wasm::setTimerPeriod`, source/extensions/common/wasm/wasm.cc), so
/// the booking leaves about 1 ms later with whatever else completed meanwhile; nginx's module
/// re-arms a tick timer only when it fires (nginx-compat/module/src/timers.rs, `tick_handler`),
/// so there it leaves on the pending tick (at most GLOBAL_TICK_MILLIS).
const BOOKING_TICK_MILLIS: u32 = 1;
/// A booking call not reported after its timeout plus this (ms) is taken as failed.
const BOOKING_GRACE_MS: u64 = 1_000;

proxy_wasm::main! {{
    tollgate_common::host::init_log(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(CostRoot::default()) });
}}

impl Counters {
    fn add(&self, stats: &BookStats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.tenants_created, u64::from(stats.created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
        count_n(self.store_full, u64::from(stats.store_full));
    }
}

/// When this worker last logged a recurring problem, one throttle per kind.
struct Logs {
    /// A ledger store failure.
    store: LogEvery,
    /// An unpriceable response.
    unpriced: LogEvery,
    /// A failed call to the rate limit service (check or booking).
    global: LogEvery,
    /// A booking dropped (outbox or replay queue full or unavailable).
    dropped: LogEvery,
    /// A request body refused because the filter cannot read it.
    unreadable: LogEvery,
}

/// Global mode's per-worker state.
struct GlobalState {
    config: CostGlobal,
    /// Shared by the checks (HTTP contexts) and the bookings (root context).
    breaker: Breaker,
    /// Bookings of this worker not yet sent (the root context sends them on ticks).
    outbox: RefCell<Outbox>,
    /// When the root context sends the outbox (the booking call in flight, the tick period).
    ticks: SendTicks,
    /// Bookings whose call failed, shared by every worker.
    queue: ReplayQueue,
}

struct Shared {
    config: Config,
    counters: Counters,
    logs: Logs,
    /// The table in use: `prices`, then each good remote table.
    prices: RefCell<Rc<PriceTable>>,
    global: Option<GlobalState>,
}

impl Shared {
    fn table(&self) -> Rc<PriceTable> {
        Rc::clone(&self.prices.borrow())
    }

    /// Logs a store failure (at most once per interval and worker).
    fn store_failed(&self, what: &str, status: u32) {
        if let Some(unlogged) = self.logs.store.due(now_unix_millis()) {
            log::warn!(
                "{what} (shared data: host status {status}, a full zone?); \
                 {unlogged} more since the last line"
            );
        }
    }

    /// A call to the rate limit service failed: counted, and the breaker told (logged when it
    /// opens); the failure itself is logged at most once per interval and worker.
    fn global_failed(&self, g: &GlobalState, failure: &CallFailure, what: &str) {
        let c = &self.counters;
        count(match failure {
            CallFailure::Dispatch(_) => c.global_error_dispatch,
            CallFailure::Grpc(_) => c.global_error_grpc_status,
            CallFailure::Reply(_) => c.global_error_reply,
            CallFailure::BreakerOpen => c.global_error_breaker_open,
        });
        let now = now_unix_millis();
        if *failure != CallFailure::BreakerOpen && g.breaker.failure(now) {
            count(c.global_breaker_opened);
            log::warn!(
                "the rate limit service {} failed repeatedly; this worker skips it for {} \
                 ms, then probes it",
                g.config.rls.service,
                g.config.rls.breaker_open_ms
            );
        }
        if let Some(unlogged) = self.logs.global.due(now) {
            log::warn!(
                "no answer from the rate limit service {} ({failure}): {what}; \
                 {unlogged} more since the last line",
                g.config.rls.service
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
    fn wake_root(&self, g: &GlobalState) {
        let Some(ms) = g.ticks.queued() else {
            return;
        };
        match host::set_tick_period_ms(ms) {
            Ok(()) => g.ticks.asked(ms),
            Err(status) => {
                if let Some(unlogged) = self.logs.global.due(now_unix_millis()) {
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
    fn settle_tick(&self, g: &GlobalState) {
        let Some(ms) = g.ticks.ticked() else {
            return;
        };
        match host::set_tick_period_ms(ms) {
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
    fn requeue(&self, g: &GlobalState, bookings: &[Booking]) {
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
    fn dropped(&self, what: &str) {
        if let Some(unlogged) = self.logs.dropped.due(now_unix_millis()) {
            log::warn!(
                "global budgets: {what}; the service under-counts that spend \
                 ({unlogged} more since the last line)"
            );
        }
    }
}

#[derive(Default)]
struct CostRoot {
    shared: Option<Rc<Shared>>,
    remote: Option<RemoteDocument>,
    /// A remote table being read, a slice per callback.
    pending: Option<Pending>,
    /// The booking call in flight (at most one per worker).
    booking: Option<InFlight>,
}

/// A batch of bookings sent to the rate limit service.
struct InFlight {
    token: u32,
    sent: Vec<Booking>,
    descriptors: usize,
    /// When it was sent (Unix ms): a call not reported by its timeout plus BOOKING_GRACE_MS is
    /// taken as failed.
    since: u64,
}

/// A remote price table being read over several callbacks (`price_table::IncrementalParse`):
/// nginx bounds each callback (`tollgate_guest_deadline`, 100 ms by default), and LiteLLM's
/// 3.2 MB file takes longer than that in one go there.
struct Pending {
    parse: IncrementalParse,
    /// For the log line.
    source: String,
    /// Fetched by this VM: stored in shared data for the others once it reads well.
    fetched_here: bool,
    started: Option<std::time::SystemTime>,
}

/// Bytes of a remote table read per step, and the time after which a callback stops stepping
/// (ms): a callback reads the table for about this long, far under nginx's 100 ms deadline.
const STEP_BYTES: usize = 128 << 10;
const STEP_MILLIS: f64 = 15.0;

/// Milliseconds of the host's clock since `start` (for the load log lines).
fn millis_since(start: Option<std::time::SystemTime>) -> f64 {
    let now = host::now();
    match (start, now) {
        (Some(a), Some(b)) => b.duration_since(a).map_or(0.0, |d| d.as_secs_f64() * 1e3),
        _ => 0.0,
    }
}

impl CostRoot {
    /// Reads the pending remote table for about STEP_MILLIS; puts it in use when it is read
    /// whole and prices at least one model (stored for every VM first if fetched here).
    fn advance(&mut self) {
        let began = host::now();
        let result = loop {
            let Some(pending) = self.pending.as_mut() else {
                return;
            };
            match pending.parse.step(STEP_BYTES) {
                Step::More if millis_since(began) < STEP_MILLIS => {}
                Step::More => return,
                Step::Done(result) => break result,
            }
        };
        let (Some(pending), Some(remote)) = (self.pending.take(), self.remote.as_mut()) else {
            return;
        };
        let now = now_unix_secs();
        let refused = match result {
            Ok(loaded) if loaded.table.is_empty() => Some("no model priced per token".to_string()),
            Ok(loaded) => {
                if pending.fetched_here && !remote.accept(now, pending.parse.document()) {
                    return;
                }
                let millis = millis_since(pending.started);
                install(&self.shared, loaded, &pending.source, millis);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = refused {
            if pending.fetched_here {
                remote.reject(now, &why);
            } else {
                log::warn!("prices from {} unusable here: {why}", pending.source);
            }
        }
    }
}

/// Puts a checked table in use (`millis`: what reading it took, for the log line).
fn install(shared: &Option<Rc<Shared>>, loaded: Loaded, source: &str, millis: f64) {
    log::info!("{} (read in {millis:.1} ms)", loaded.summary(source));
    if let Some(shared) = shared {
        *shared.prices.borrow_mut() = Rc::new(loaded.table);
    }
}

impl CostRoot {
    /// Sends the next batch of bookings, unless one is in flight: this worker's outbox first,
    /// else the shared replay queue.
    fn flush(&mut self) {
        self.send_next();
        if let Some(g) = self.shared.as_ref().and_then(|s| s.global.as_ref()) {
            g.ticks.set_in_flight(self.booking.is_some());
        }
    }

    fn send_next(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        let now_ms = now_unix_millis();
        if let Some(f) = &self.booking {
            let deadline = f
                .since
                .saturating_add(u64::from(g.config.rls.timeout_ms))
                .saturating_add(BOOKING_GRACE_MS);
            if now_ms < deadline {
                return;
            }
            // Never reported: taken as failed, replayed (it may also have been counted: see the
            // README).
            if let Some(f) = self.booking.take() {
                shared.global_failed(
                    g,
                    &CallFailure::Grpc(4),
                    "a booking call was never reported",
                );
                shared.requeue(g, &f.sent);
            }
        }
        if g.breaker.admit(now_ms) == Admit::Skip {
            return;
        }
        let mut batch = g.outbox.borrow_mut().take(BATCH_MAX);
        if batch.is_empty() {
            batch = match g.queue.take(&HostSharedData, BATCH_MAX) {
                Ok(b) => b,
                Err(_) => return,
            };
            if batch.is_empty() {
                return;
            }
            count(shared.counters.global_replays);
        }
        let config = &shared.config;
        let ledger = config.ledger.name();
        let now = Periods::at(now_ms / 1_000);
        let built = batch_request(&g.config.rls.domain, ledger, batch, &now, |t| {
            Limits::of(&g.config, &config.budget(t))
        });
        count_n(shared.counters.global_stale, u64::from(built.stale));
        let Some(request) = built.request else {
            return;
        };
        let descriptors = request.descriptors.len();
        let call = rls::host::should_rate_limit(self, &g.config.rls, &request);
        match call {
            Ok(token) => {
                self.booking = Some(InFlight {
                    token,
                    sent: built.sent,
                    descriptors,
                    since: now_ms,
                });
            }
            Err(status) => {
                shared.global_failed(
                    g,
                    &CallFailure::Dispatch(status as u32),
                    "bookings queued for replay",
                );
                shared.requeue(g, &built.sent);
            }
        }
    }
}

impl Context for CostRoot {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some(f) = self.booking.take_if(|f| f.token == token_id) else {
            return;
        };
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        g.ticks.set_in_flight(false);
        match rls::host::reply(status_code, response_size, f.descriptors) {
            Ok(_) => {
                g.breaker.success();
                count_n(
                    shared.counters.global_booked,
                    u64::try_from(f.sent.len()).unwrap_or(u64::MAX),
                );
                // The next batch at once: bookings wait at most one round trip per batch.
                self.flush();
            }
            Err(failure) => {
                shared.global_failed(g, &failure, "bookings queued for replay");
                shared.requeue(g, &f.sent);
            }
        }
    }

    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(remote) = self.remote.as_mut().filter(|r| r.owns(token_id)) else {
            return;
        };
        let Some(body) = remote.on_response(now_unix_secs(), body_size) else {
            return;
        };
        let source = format!("{}{}", remote.source.cluster, remote.source.path);
        self.pending = Some(Pending {
            parse: IncrementalParse::new(body, "remote_prices"),
            source,
            fetched_here: true,
            started: host::now(),
        });
        self.advance();
    }
}

impl RootContext for CostRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let started = host::now();
        let config = match Config::parse(&plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        if config.has_budgets()
            && !host::eviction_allowed(&config.ledger.key(""), config.allow_eviction)
        {
            return false;
        }
        if config.global.is_some() {
            if let Err(status) = rls::host::grpc_calls_supported() {
                log::error!(
                    "global budgets need gRPC calls, which this host does not implement \
                     (proxy_grpc_call answered status {status}); refusing the configuration"
                );
                return false;
            }
        }
        // The ledger's records exist before this worker serves a request, so that a zone that
        // fills up later still has them.
        if let Err((key, e)) = config.ledger.ensure(
            &HostSharedData,
            config.tenant_budgets.keys().map(String::as_str),
            now_unix_millis(),
        ) {
            log::error!(
                "cannot create the ledger record {key} in shared data ({e:?}); \
                 tenants with a budget follow store_full until it can be"
            );
        }
        log::info!(
            "{} (configuration read in {:.1} ms)",
            config.prices_loaded,
            millis_since(started)
        );
        self.remote = config
            .remote_prices
            .clone()
            .map(|source| RemoteDocument::new(source, PRICES_NAMESPACE, "prices"));
        let global = config.global.clone().map(|g| GlobalState {
            breaker: g.rls.breaker(),
            outbox: RefCell::new(Outbox::new(OUTBOX_MAX)),
            ticks: SendTicks::new(GLOBAL_TICK_MILLIS, BOOKING_TICK_MILLIS),
            queue: ReplayQueue::new(config.ledger.name(), REPLAY_MAX),
            config: g,
        });
        if let Some(g) = &global {
            // Created before any update, so that every update is a CAS (Envoy applies a write
            // to a missing key whatever its CAS token).
            if let Err(e) = ensure_key(&HostSharedData, &g.queue.key, &encode_queue(&[])) {
                log::error!(
                    "cannot create the replay queue {} in shared data ({e:?}); failed \
                     bookings are dropped until it can be",
                    g.queue.key
                );
            }
        }
        let tick = match (&global, &self.remote) {
            (Some(_), _) => Some(GLOBAL_TICK_MILLIS),
            (None, Some(_)) => Some(TICK_MILLIS),
            (None, None) => None,
        };
        self.shared = Some(Rc::new(Shared {
            prices: RefCell::new(Rc::clone(&config.prices)),
            config,
            counters: Counters::define(),
            logs: Logs {
                store: LogEvery::new(LOG_INTERVAL_MS),
                unpriced: LogEvery::new(LOG_INTERVAL_MS),
                global: LogEvery::new(LOG_INTERVAL_MS),
                dropped: LogEvery::new(LOG_INTERVAL_MS),
                unreadable: LogEvery::new(LOG_INTERVAL_MS),
            },
            global,
        }));
        if let Some(ms) = tick {
            if let Err(e) = host::set_tick_period_ms(ms) {
                log::error!(
                    "cannot set the tick period for remote_prices or global: host status {e}"
                );
                return false;
            }
        }
        true
    }

    fn on_tick(&mut self) {
        self.flush();
        if let Some(shared) = self.shared.clone() {
            if let Some(g) = shared.global.as_ref() {
                // Sent, or not sendable now (breaker open, dispatch refused): either way the
                // next batch leaves on the reply or on a regular tick.
                shared.settle_tick(g);
            }
        }
        let Some(remote) = self.remote.as_mut() else {
            return;
        };
        if let Some((fetched_at, body)) = remote.tick(now_unix_secs()) {
            let source = format!(
                "{}{} (fetched at {fetched_at})",
                remote.source.cluster, remote.source.path
            );
            self.pending = Some(Pending {
                parse: IncrementalParse::new(body, "remote_prices"),
                source,
                fetched_here: false,
                started: host::now(),
            });
        }
        self.advance();
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(CostHttp {
            shared: self.shared.clone(),
            tenant: String::new(),
            spend: None,
            ledger_key: None,
            budgeted: false,
            must_read: false,
            unreadable_headers: None,
            hold_request: false,
            completions_path: false,
            request_model: None,
            request_bytes: 0,
            strip_usage: false,
            success: false,
            mode: Mode::Off,
            decoder: None,
            undecodable: false,
            strip: None,
            body_end: BodyEnd::default(),
            response_bytes: 0,
            done: false,
            check: None,
        }))
    }
}

// The scanner (~200 bytes, fixed) lives in the context, itself one allocation: boxed, it cost an
// allocation and a free per JSON response.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// No response yet, or one whose content type carries no usage.
    Off,
    /// A JSON document, scanned as it passes.
    Json(JsonScan),
    /// Server-sent events.
    Stream(Box<StreamState>),
}

/// The bytes of the current event, held while the filter removes the usage event it caused.
struct Strip {
    held: Vec<u8>,
}

struct CostHttp {
    shared: Option<Rc<Shared>>,
    tenant: String,
    /// The tenant's spend read at the request headers.
    spend: Option<Spend>,
    /// The tenant's ledger key, made at the request headers (taken by the booking).
    ledger_key: Option<String>,
    /// Whether the tenant has a budget.
    budgeted: bool,
    /// Whether a request body this filter cannot read is refused (`CostHttp::admitted`).
    must_read: bool,
    /// Why the request headers make the body unreadable (`content-encoding`, `content-type`;
    /// only looked at when `must_read`): refused at the body's first bytes.
    unreadable_headers: Option<Unreadable>,
    /// The request body is being held to be read.
    hold_request: bool,
    /// The path is an OpenAI completions API (`request::stream_usage_on_request`).
    completions_path: bool,
    /// The request body's `model`.
    request_model: Option<String>,
    /// The request body's size (bytes).
    request_bytes: u64,
    /// The filter added `include_usage`: the usage event is removed from the response.
    strip_usage: bool,
    /// The response status is 2xx.
    success: bool,
    mode: Mode,
    decoder: Option<Decoder>,
    /// A content coding the filter cannot decode.
    undecodable: bool,
    strip: Option<Strip>,
    /// The response body's progress against its `Content-Length`.
    body_end: BodyEnd,
    /// Response body bytes read (decoded), for the estimate.
    response_bytes: u64,
    /// Signals set and spend booked (or the request refused).
    done: bool,
    /// The global check in flight, the request paused.
    check: Option<Check>,
}

/// A global check in flight.
struct Check {
    token: u32,
    /// The descriptors' periods, in order.
    periods: Vec<Period>,
    /// The tenant's budget (for `on_error: local`).
    budget: Budget,
    /// The request headers ended the stream.
    end_of_stream: bool,
}

fn header_value(map: MapType, name: &str) -> Option<Vec<u8>> {
    tollgate_common::host::header_bytes(map, name)
}

/// The proxy-wasm status of a store error.
fn status_of(e: StoreError) -> u32 {
    match e {
        StoreError::CasMismatch => tollgate_common::shared_data::status::CAS_MISMATCH,
        StoreError::Failed(status) => status,
    }
}

fn body_chunk(buffer: BufferType, size: usize) -> Vec<u8> {
    tollgate_common::host::buffer(buffer, size)
}

impl CostHttp {
    /// The response's usage, or why there is none (see `unpriced`).
    fn outcome(&self) -> Result<Usage, Reason> {
        if self.undecodable {
            return Err(Reason::Encoding);
        }
        match self.decoder.as_ref().and_then(Decoder::error) {
            Some(DecodeError::Corrupt) => return Err(Reason::Encoding),
            Some(DecodeError::TooLarge) => return Err(Reason::DecodeLimit),
            None => {}
        }
        let model = self.request_model.as_deref();
        match &self.mode {
            Mode::Off => Err(Reason::ContentType),
            Mode::Json(scan) => match scan.finished() {
                Ok(captured) => scanned_body_usage(captured, model).ok_or(Reason::NoUsage),
                Err(ScanError::Invalid) => Err(Reason::Malformed),
                Err(ScanError::Incomplete) => Err(Reason::Incomplete),
                Err(ScanError::TooLarge) => Err(Reason::TooLarge),
            },
            Mode::Stream(state) => state.finish(model).ok_or(if state.usage.poisoned() {
                Reason::Malformed
            } else if state.ended() {
                Reason::NoUsage
            } else {
                Reason::Incomplete
            }),
        }
    }

    /// Books and publishes the outcome of the response (once).
    fn finish(&mut self, shared: &Shared) {
        if self.done {
            return;
        }
        self.done = true;
        let config = &shared.config;
        signals::set(signals::COST_TENANT, &self.tenant);
        // What providers bill: a 2xx answer to a request that named a model.
        let llm_call = self.success && self.request_model.is_some();
        let outcome = self.outcome();
        let table = shared.table();
        let priced = outcome.and_then(|usage| {
            // The response's model, else the request's (a provider may answer with a dated
            // variant of the requested name), else the default price.
            let price = usage
                .model
                .as_deref()
                .and_then(|m| table.get(m))
                .or_else(|| config.price(&table, self.request_model.as_deref()))
                .or_else(|| config.price(&table, usage.model.as_deref()));
            let price = price.ok_or(Reason::UnknownModel)?;
            let nano = cost_nano(&usage, price).map_err(|_| Reason::Inconsistent)?;
            Ok((usage, nano))
        });
        let (nano, status) = match priced {
            Ok((usage, nano)) => {
                if let Some(model) = &usage.model {
                    signals::set(signals::COST_MODEL, model);
                }
                let mut digits = itoa::Buffer::new();
                signals::set(
                    signals::COST_INPUT_TOKENS,
                    digits.format(usage.input_tokens),
                );
                signals::set(
                    signals::COST_OUTPUT_TOKENS,
                    digits.format(usage.output_tokens),
                );
                count(shared.counters.priced);
                (nano, "priced")
            }
            Err(_) if !llm_call => {
                count(shared.counters.unpriced);
                signals::set(signals::COST_STATUS, "unpriced");
                return;
            }
            Err(reason) => {
                count(shared.counters.unpriced_reasons.id(reason));
                let charge = match config.unpriced_charge {
                    UnpricedCharge::Bytes => config
                        .price(&table, self.request_model.as_deref())
                        .and_then(|p| estimate(p, self.request_bytes, self.response_bytes)),
                    UnpricedCharge::None => None,
                };
                if let Some(unlogged) = shared.logs.unpriced.due(now_unix_millis()) {
                    log::warn!(
                        "tenant {}: a {} response could not be priced ({}); charged {} \
                         nano-USD ({unlogged} more since the last line)",
                        self.tenant,
                        self.request_model.as_deref().unwrap_or("?"),
                        reason.label(),
                        charge.map_or_else(|| "nothing".to_string(), |n| n.to_string()),
                    );
                }
                let Some(nano) = charge else {
                    count(shared.counters.unpriced);
                    signals::set(signals::COST_STATUS, "unpriced");
                    return;
                };
                count(shared.counters.estimated);
                (nano, "estimated")
            }
        };
        // The key read at the request headers (the tenant is the same).
        let key = self
            .ledger_key
            .take()
            .unwrap_or_else(|| config.ledger.key(&self.tenant));
        match config
            .ledger
            .book(&HostSharedData, &key, now_unix_millis(), nano)
        {
            Ok(stats) => shared.counters.add(&stats),
            Err(not) => {
                shared.counters.add(&not.stats);
                count(shared.counters.booking_failures);
                match not.failed {
                    Some(status) => shared.store_failed(
                        &format!("tenant {}: {nano} nano-USD not booked", self.tenant),
                        status,
                    ),
                    None => log::warn!(
                        "tenant {}: {nano} nano-USD not booked (CAS retries exhausted)",
                        self.tenant
                    ),
                }
            }
        }
        if let Some(g) = shared.global.as_ref().filter(|_| self.budgeted) {
            let budget = config.budget(&self.tenant);
            let limits = Limits::of(&g.config, &budget);
            let now = Periods::at(now_unix_millis() / 1_000);
            if let Some(b) = Booking::new(&g.config, &self.tenant, &limits, &now, nano) {
                // Sent by the root context (this stream may end before a reply).
                let queued = g.outbox.borrow_mut().push(b);
                if queued {
                    shared.wake_root(g);
                } else {
                    count(shared.counters.global_dropped);
                    shared.dropped(&format!(
                        "tenant {}: {nano} nano-USD dropped: this worker's outbox is full \
                         ({OUTBOX_MAX} bookings)",
                        self.tenant
                    ));
                }
            }
        }
        signals::set(signals::COST_NANO_USD, itoa::Buffer::new().format(nano));
        signals::set(signals::COST_STATUS, status);
    }

    /// The tenant's spend for the budget check. A tenant with a budget (`limited`) and no record
    /// yet gets one now, before its request goes upstream; `Err(status)` when its spend cannot be
    /// known or its record cannot be created and `store_full` says refuse. A tenant without a
    /// budget is never refused for the ledger (its spend then goes to the overflow record).
    fn read_spend(
        &self,
        shared: &Shared,
        key: &str,
        limited: bool,
        now_ms: u64,
        now: &Periods,
    ) -> Result<Spend, u32> {
        let ledger = &shared.config.ledger;
        let lookup = match ledger.spend(&HostSharedData, key, now) {
            Ok(lookup) => lookup,
            Err(_) if !limited => return Ok(Spend::default()),
            Err(e) => return Err(status_of(e)),
        };
        match lookup {
            Lookup {
                standing: Standing::New,
                ..
            } if limited => {}
            Lookup { spend, .. } => return Ok(spend),
        }
        let mut stats = BookStats::default();
        let opened = ledger.open(&HostSharedData, key, now_ms, &mut stats);
        shared.counters.add(&stats);
        // The tenant shares the overflow record: `max_tenants` reached, or its record refused
        // and `store_full` pools it.
        match opened {
            Ok(Standing::Pooled) => {}
            Ok(_) => return Ok(Spend::default()),
            Err(OpenError::StoreFull(_))
                if shared.config.store_full.action == StoreFullAction::Pool => {}
            Err(OpenError::StoreFull(status) | OpenError::Failed(status)) => return Err(status),
        }
        ledger.pooled(&HostSharedData, now).map_err(status_of)
    }

    fn spend_headers(&self, shared: &Shared) {
        if let (true, Some(s)) = (shared.config.spend_headers, self.spend) {
            add_response_header("x-tollgate-spend-day-nano-usd", &s.day.to_string());
            add_response_header("x-tollgate-spend-month-nano-usd", &s.month.to_string());
            add_response_header("x-tollgate-spend-total-nano-usd", &s.total.to_string());
        }
    }

    /// Refuses the request of a tenant whose budget is spent (either mode).
    fn over_budget(&mut self, shared: &Shared, exceeded: Exceeded) -> Action {
        let reset = exceeded.reset_secs.to_string();
        let message = format!(
            "the {} budget of tenant {} is spent; it resets in {reset} s",
            exceeded.period, self.tenant
        );
        self.refuse(
            shared.counters.budget_exceeded,
            "budget_exceeded",
            (
                shared.config.over_budget_status,
                &[(BUDGET_RESET_HEADER, &reset), ("retry-after", &reset)],
                "budget_exceeded",
                &message,
            ),
        )
    }

    /// An admitted request: asks for an identity response and holds its body to read it.
    ///
    /// A tenant whose requests must be read (`must_read`: it has a budget, or `unknown_model`
    /// refuses an unpriced model for every tenant) has every request body read, whatever the
    /// method (an upstream may serve an LLM call sent as a PUT, or a GET with a body) and
    /// whatever `max_request_body_bytes` (0: none fits, refused with 413); its
    /// `content-encoding` and `content-type` are checked here (`unreadable::headers`). Other
    /// tenants have a POST's body read, when `max_request_body_bytes` is not 0, as before.
    fn admitted(&mut self, shared: &Shared, end_of_stream: bool) {
        let config = &shared.config;
        if config.identity_encoding {
            // The filter reads the response: ask for it uncompressed (RFC 9110 section 12.5.3).
            set_request_header("accept-encoding", Some("identity"));
        }
        if end_of_stream {
            return;
        }
        self.must_read = self.budgeted
            || (config.unknown_model.action == UnknownModelAction::Refuse
                && config.unknown_model.default_price.is_none());
        if self.must_read {
            self.unreadable_headers = unreadable::headers(
                request_header_bytes("content-encoding").as_deref(),
                request_header_bytes("content-type").as_deref(),
            );
        } else if config.max_request_body_bytes == 0
            || request_header_bytes(":method").as_deref() != Some(b"POST")
        {
            return;
        }
        self.hold_request = true;
        self.completions_path = request_header_bytes(":path")
            .as_deref()
            .is_some_and(stream_usage_on_request);
        if config.add_stream_usage && self.completions_path {
            // The body may be rewritten: the host frames it anew (chunked in Envoy, from
            // the new length in nginx).
            set_request_header("content-length", None);
        }
    }

    /// A request body this filter cannot read (`reason`): counted; refused with
    /// `reason.status()` and `{"error":"unreadable_body"}` (logged at most once per interval and
    /// worker) when the tenant's requests must be read, else passed on unread.
    fn unreadable(&mut self, shared: &Shared, reason: Unreadable) -> Action {
        self.hold_request = false;
        count(shared.counters.unreadable_reasons.id(reason));
        if !self.must_read {
            return Action::Continue;
        }
        if let Some(unlogged) = shared.logs.unreadable.due(now_unix_millis()) {
            log::warn!(
                "tenant {}: request refused, its body cannot be read ({}): {} \
                 ({unlogged} more since the last line)",
                self.tenant,
                reason.label(),
                reason.message()
            );
        }
        let headers: &[(&str, &str)] = match reason {
            // RFC 9110 section 12.5.3: the codings the server accepts in a request.
            Unreadable::ContentEncoding => &[("accept-encoding", "identity")],
            _ => &[],
        };
        self.refuse(
            shared.counters.unreadable_body,
            "unreadable_body",
            (
                reason.status(),
                headers,
                "unreadable_body",
                reason.message(),
            ),
        )
    }

    /// The whole request body (`body_size` bytes, held by the host): read, its model checked
    /// against `unknown_model`, and rewritten to ask for a stream's usage (see `request`).
    fn read_body(&mut self, shared: &Shared, body_size: usize) -> Action {
        self.hold_request = false;
        let config = &shared.config;
        let body = body_chunk(BufferType::HttpRequestBody, body_size);
        if body.len() != body_size {
            return self.unreadable(shared, Unreadable::Host);
        }
        if body.is_empty() {
            // No body: nothing for the upstream to read either.
            return Action::Continue;
        }
        let mut request = match RequestBody::parse(&body) {
            Ok(request) => request,
            Err(reason) => return self.unreadable(shared, reason),
        };
        let model = request.take_model();
        if let Some(m) = model
            .as_deref()
            .filter(|m| config.refuses_model(&shared.table(), m, self.budgeted))
        {
            let message = format!("model {m} has no price at this gateway");
            signals::set(signals::COST_MODEL, m);
            return self.refuse(
                shared.counters.unknown_model,
                "unknown_model",
                (
                    config.unknown_model.status,
                    &[],
                    "model_not_priced",
                    &message,
                ),
            );
        }
        self.request_model = model;
        if config.add_stream_usage
            && self.completions_path
            && request.stream()
            && request.include_usage() != Some(true)
        {
            if let Some(rewritten) = request.with_stream_usage() {
                match host::replace_body(BufferType::HttpRequestBody, body_size, &rewritten) {
                    Ok(()) => {
                        self.strip_usage = true;
                        self.request_bytes = u64::try_from(rewritten.len()).unwrap_or(u64::MAX);
                    }
                    Err(e) => {
                        log::warn!("could not add stream_options.include_usage: host status {e}")
                    }
                }
            }
        }
        Action::Continue
    }

    /// Global mode: asks the rate limit service whether the tenant's budgets are spent, the
    /// request paused until the reply (`on_grpc_call_response`); `on_error` at once when the
    /// breaker is open or the host refuses the call.
    fn check_global(
        &mut self,
        shared: &Shared,
        g: &GlobalState,
        budget: Budget,
        now: &Periods,
        end_of_stream: bool,
    ) -> Action {
        let limits = Limits::of(&g.config, &budget);
        let Some(request) = check_request(
            &g.config.rls.domain,
            shared.config.ledger.name(),
            &self.tenant,
            &limits,
            now,
        ) else {
            self.admitted(shared, end_of_stream);
            return Action::Continue;
        };
        if g.breaker.admit(now_unix_millis()) == Admit::Skip {
            return self.global_fallback(
                shared,
                g,
                budget,
                end_of_stream,
                CallFailure::BreakerOpen,
            );
        }
        let call = rls::host::should_rate_limit(self, &g.config.rls, &request);
        match call {
            Ok(token) => {
                self.check = Some(Check {
                    token,
                    periods: limits.periods(),
                    budget,
                    end_of_stream,
                });
                Action::Pause
            }
            Err(status) => self.global_fallback(
                shared,
                g,
                budget,
                end_of_stream,
                CallFailure::Dispatch(status as u32),
            ),
        }
    }

    /// The check gave no verdict: counted, logged once per interval, then `on_error`: `local`
    /// (the local ledger's spend read at the request headers decides), `allow`, or `deny` (503,
    /// `retry-after: 1`, `{"error":"budget_unavailable"}`).
    fn global_fallback(
        &mut self,
        shared: &Shared,
        g: &GlobalState,
        budget: Budget,
        end_of_stream: bool,
        failure: CallFailure,
    ) -> Action {
        let policy = g.config.rls.on_error;
        shared.global_failed(g, &failure, &format!("requests get on_error {policy:?}"));
        let c = &shared.counters;
        match policy {
            OnError::Local => {
                count(c.global_fallback_local);
                let now = Periods::at(now_unix_millis() / 1_000);
                let spend = self.spend.unwrap_or_default();
                if let Some(exceeded) = budget.check(&spend, &now) {
                    return self.over_budget(shared, exceeded);
                }
            }
            OnError::Allow => count(c.global_fallback_allow),
            OnError::Deny => {
                count(c.global_fallback_deny);
                return self.refuse(
                    c.global_unavailable,
                    "global_unavailable",
                    (
                        503,
                        &[("retry-after", "1")],
                        "budget_unavailable",
                        "the budget service is unavailable; retry later",
                    ),
                );
            }
        }
        self.admitted(shared, end_of_stream);
        Action::Continue
    }

    /// Refuses the request before the upstream (the stream ends here).
    fn refuse(
        &mut self,
        counter: Option<u32>,
        status: &str,
        reply: (u32, &[(&str, &str)], &str, &str),
    ) -> Action {
        self.done = true;
        count(counter);
        signals::set(signals::COST_TENANT, &self.tenant);
        signals::set(signals::COST_STATUS, status);
        let (code, headers, error, message) = reply;
        send_json_error(code, headers, error, message);
        Action::Pause
    }

    /// Feeds decoded response bytes to the parser of the response's content type.
    fn inspect(mode: &mut Mode, seen: &mut u64, bytes: &[u8]) {
        *seen = seen.saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        match mode {
            Mode::Off => {}
            Mode::Json(scan) => scan.feed(bytes),
            Mode::Stream(state) => state.feed(bytes),
        }
    }

    /// Streams with the usage event this filter caused: the chunk as it goes on (events
    /// complete, the usage-only one removed, an incomplete last event held for the next chunk).
    fn strip_chunk(&mut self, chunk: &[u8], end: bool, max_held: usize) -> Vec<u8> {
        let (Mode::Stream(state), Some(strip)) = (&mut self.mode, self.strip.as_mut()) else {
            return chunk.to_vec();
        };
        let mut out = Vec::with_capacity(chunk.len().saturating_add(strip.held.len()));
        let mut from = 0usize;
        let held = &mut strip.held;
        state.feed_events(chunk, &mut |at, usage_only| {
            let piece = chunk.get(from..at).unwrap_or_default();
            if usage_only {
                held.clear();
            } else {
                out.append(held);
                out.extend_from_slice(piece);
            }
            from = at;
        });
        held.extend_from_slice(chunk.get(from..).unwrap_or_default());
        // The end of the body or of the stream (nothing after the final event is read), or an
        // event too large to hold: what is held goes on, and everything after it as it comes.
        if end || state.ended() || held.len() > max_held {
            out.append(held);
            self.strip = None;
        }
        out
    }
}

impl Context for CostHttp {
    /// The reply (or failure) of the global check: refuse, or resume the request.
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some(check) = self.check.take_if(|c| c.token == token_id) else {
            return;
        };
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        let reply = rls::host::reply(status_code, response_size, check.periods.len());
        let action = match reply {
            Ok(verdict) => {
                g.breaker.success();
                let now = Periods::at(now_unix_millis() / 1_000);
                // This worker's bookings of the tenant the service has not counted yet.
                let pending = g.outbox.borrow().pending(&self.tenant, &now);
                match decide(&check.periods, &verdict, &now, 0, &pending) {
                    Decision::Admit => {
                        count(shared.counters.global_admitted);
                        self.admitted(&shared, check.end_of_stream);
                        Action::Continue
                    }
                    Decision::Refuse(exceeded) => {
                        count(shared.counters.global_refused);
                        self.over_budget(&shared, exceeded)
                    }
                }
            }
            Err(failure) => {
                self.global_fallback(&shared, g, check.budget, check.end_of_stream, failure)
            }
        };
        if matches!(action, Action::Continue) {
            if let Err(status) = rls::host::resume_request() {
                log::warn!(
                    "cannot resume the request after the global check: host status {status}"
                );
            }
        }
    }
}

impl HttpContext for CostHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            log::error!("no configuration; refusing the request");
            send_json_error(500, &[], "internal_error", "cost is not configured");
            self.done = true;
            return Action::Pause;
        };
        let config = &shared.config;
        self.tenant = match config.tenant(&HostIdentityView) {
            Ok(tenant) => tenant,
            Err(e) => {
                log::info!("401 invalid_api_key: {e}");
                return self.refuse(
                    shared.counters.invalid_credential,
                    "invalid_credential",
                    (401, &[], "invalid_api_key", e.description()),
                );
            }
        };
        let now_ms = now_unix_millis();
        let now = Periods::at(now_ms / 1_000);
        let budget = config.budget(&self.tenant);
        self.budgeted = budget.is_limited();
        let key = config.ledger.key(&self.tenant);
        let spend = self.read_spend(&shared, &key, self.budgeted, now_ms, &now);
        self.ledger_key = Some(key);
        let spend = match spend {
            Ok(spend) => spend,
            Err(status) => {
                shared.store_failed(
                    &format!(
                        "tenant {}: ledger unavailable, request refused",
                        self.tenant
                    ),
                    status,
                );
                return self.refuse(
                    shared.counters.store_failure,
                    "store_failure",
                    (
                        config.store_full.status,
                        &[("retry-after", "1")],
                        "budget_unavailable",
                        "the spend of this tenant cannot be read or stored; retry later",
                    ),
                );
            }
        };
        self.spend = Some(spend);
        if let Some(g) = shared.global.as_ref().filter(|_| self.budgeted) {
            return self.check_global(&shared, g, budget, &now, end_of_stream);
        }
        if let Some(exceeded) = budget.check(&spend, &now) {
            return self.over_budget(&shared, exceeded);
        }
        self.admitted(&shared, end_of_stream);
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !self.hold_request || self.done {
            return Action::Continue;
        }
        if let Some(reason) = self.unreadable_headers {
            // Refused at the first bytes: the rest of the body is never read.
            return self.unreadable(&shared, reason);
        }
        let config = &shared.config;
        self.request_bytes = u64::try_from(body_size).unwrap_or(u64::MAX);
        if body_size > config.max_request_body_bytes {
            self.hold_request = false;
            if self.must_read {
                let message = format!(
                    "request bodies over {} bytes cannot be read here, and this tenant's \
                     requests must be read (it has a budget)",
                    config.max_request_body_bytes
                );
                return self.refuse(
                    shared.counters.request_too_large,
                    "request_too_large",
                    (413, &[], "request_too_large", &message),
                );
            }
            count(shared.counters.request_too_large);
            return Action::Continue;
        }
        if !end_of_stream {
            // Held (buffered by the host) until the whole body is here: its end, or trailers.
            return Action::Pause;
        }
        self.read_body(&shared, body_size)
    }

    /// A body followed by trailers (HTTP/2, or HTTP/1.1 chunked where the host passes them on)
    /// never reaches the body callback with `end_of_stream`: Envoy calls this instead, the body
    /// held, and would otherwise send it upstream unread. The body is read here, its size being
    /// the last body callback's.
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !self.hold_request || self.done {
            return Action::Continue;
        }
        let body_size = usize::try_from(self.request_bytes).unwrap_or(usize::MAX);
        self.read_body(&shared, body_size)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if self.done {
            return Action::Continue;
        }
        let config = &shared.config;
        self.spend_headers(&shared);
        use MapType::HttpResponseHeaders as H;
        let status = header_value(H, ":status").unwrap_or_default();
        self.success = status.len() == 3 && status.first() == Some(&b'2');
        if end_of_stream {
            self.finish(&shared);
            return Action::Continue;
        }
        let length_header = header_value(H, "content-length");
        self.body_end = BodyEnd::new(length_header.as_deref());
        let coding = Coding::of(header_value(H, "content-encoding").as_deref());
        self.undecodable = coding == Coding::Unsupported;
        self.decoder = Decoder::new(coding, config.max_decoded_bytes);
        let content_type = header_value(H, "content-type").unwrap_or_default();
        let media = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        // Media types are case-insensitive (RFC 9110 section 8.3.1).
        let json = media.eq_ignore_ascii_case(b"application/json")
            || media
                .len()
                .checked_sub(5)
                .and_then(|at| media.get(at..))
                .is_some_and(|suffix| suffix.eq_ignore_ascii_case(b"+json"));
        if media.eq_ignore_ascii_case(b"text/event-stream") {
            self.mode = Mode::Stream(Box::new(StreamState::new(config.max_event_bytes)));
            if self.strip_usage && coding == Coding::Identity {
                self.strip = Some(Strip { held: Vec::new() });
                // The stream changes size: the host frames it anew.
                if length_header.is_some() {
                    host::set_header(H, "content-length", None);
                }
            }
        } else if json {
            self.mode = Mode::Json(JsonScan::new(config.max_event_bytes));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if self.done {
            return Action::Continue;
        }
        // The body is complete for the client once this chunk is passed on: book first.
        let complete = self.body_end.feed(body_size) || end_of_stream;
        let chunk = body_chunk(BufferType::HttpResponseBody, body_size);
        if self.strip.is_some() {
            let out = self.strip_chunk(&chunk, complete, shared.config.max_event_bytes);
            // (`strip_chunk` fed the stream parser.)
            self.response_bytes = self
                .response_bytes
                .saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
            if out != chunk {
                if let Err(e) = host::replace_body(BufferType::HttpResponseBody, body_size, &out) {
                    log::warn!("could not remove the usage event: host status {e}");
                }
            }
        } else if let Some(decoder) = self.decoder.as_mut() {
            let (mode, seen) = (&mut self.mode, &mut self.response_bytes);
            decoder.feed(&chunk, &mut |b| Self::inspect(mode, seen, b));
            if complete {
                decoder.finish(&mut |b| Self::inspect(mode, seen, b));
            }
        } else if self.undecodable {
            // Not readable: only its size counts (for the estimate).
            self.response_bytes = self
                .response_bytes
                .saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        } else {
            Self::inspect(&mut self.mode, &mut self.response_bytes, &chunk);
        }
        let ended = matches!(&self.mode, Mode::Stream(state) if state.ended());
        if complete || ended {
            self.finish(&shared);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // A response that never reached its end (reset, upstream failure): booked from what
        // was seen (a stream's usage if it came, else per `unpriced_charge`).
        if let Some(shared) = self.shared.clone() {
            self.finish(&shared);
        }
    }
}
