//! cost on the filters' skeleton (`tollgate_common::skeleton`): the configuration made ready
//! (the ledger's records, the replay queue, the ticks), and each callback handed to its place:
//! the request's phases to `crate::pipeline`, the root context's work to
//! `crate::bookings_sender` (global mode) and `crate::remote_prices`. A thin shell over those
//! and the host-free modules.
//!
//! Host calls go through `tollgate_common::host_calls` (the raw ABI, every status handled), never
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

use proxy_wasm::types::Action;
use tollgate_common::clock::UnixNanos;
use tollgate_common::config::ConfigError;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::host_calls::{self as host_calls, now_unix_millis};
use tollgate_common::remote::TICK_MILLIS;
use tollgate_common::remote_fetch::RemoteDocument;
use tollgate_common::rls;
use tollgate_common::shared_data::{ensure_key, HostSharedData};
use tollgate_common::skeleton::global_call::GlobalCall;
use tollgate_common::skeleton::{Filter, FilterConfig};

use crate::bookings_sender::BookingSender;
use crate::config::{Config, PRICES_NAMESPACE};
use crate::counters::Counters;
use crate::global::{Claims, Outbox, SendTicks, OUTBOX_MAX, REPLAY_MAX};
use crate::period::Periods;
use crate::pipeline::Request;
use crate::remote_prices::{millis_since, PriceRefresh};
use crate::replay_queue::{encode_queue, ReplayQueue};
use crate::worker::{
    GlobalState, Logs, PhaseReads, Shared, BOOKING_TICK_MILLIS, GLOBAL_TICK_MILLIS,
};

proxy_wasm::main! {{
    tollgate_common::skeleton::contexts::main::<Cost>();
}}

/// The filter, for the skeleton.
struct Cost;

impl FilterConfig for Config {
    fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse(bytes)
    }

    fn error_format(&self) -> ErrorFormat {
        self.error_format
    }
}

/// The root context's own work.
#[derive(Default)]
struct Root {
    /// `remote_prices`.
    prices: PriceRefresh,
    /// Global mode's bookings.
    bookings: BookingSender,
}

impl Filter for Cost {
    const NAME: &'static str = "cost";
    const KEEPS_REQUEST_TARGET: bool = true;
    type Config = Config;
    type Shared = Shared;
    type Root = Root;
    type Request = Request;

    fn configure(config: Config, root: &mut Root, started: Option<UnixNanos>) -> Option<Shared> {
        if config.enforces()
            && !host_calls::eviction_allowed(&config.ledger.key(""), config.allow_eviction)
        {
            return None;
        }
        if config.global.is_some() {
            if let Err(status) = rls::host_calls::grpc_calls_supported() {
                log::error!(
                    "global budgets need gRPC calls, which this host does not implement \
                     (proxy_grpc_call answered status {status}); refusing the configuration"
                );
                return None;
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
        if config.token_limits.any() {
            if let Err((key, e)) = config.token_store.ensure(&HostSharedData) {
                log::error!(
                    "cannot create the token-limit record {key} in shared data ({e:?}); \
                     tokens that would overflow into it are not counted until it exists"
                );
            }
        }
        log::info!(
            "{} (configuration read in {:.1} ms)",
            config.prices_loaded,
            millis_since(started)
        );
        // The root's state changes only with a configuration that loads (see below).
        let remote = config
            .remote_prices
            .clone()
            .map(|source| RemoteDocument::new(source, PRICES_NAMESPACE, "prices"));
        let counters = Counters::define();
        let global = config.global.clone().map(|g| GlobalState {
            call: GlobalCall::new(g.rls.clone(), counters.calls(), String::new()),
            outbox: RefCell::new(Outbox::new(OUTBOX_MAX)),
            claims: RefCell::new(Claims::new(OUTBOX_MAX)),
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
        let tick = match (&global, &remote) {
            (Some(_), _) => Some(GLOBAL_TICK_MILLIS),
            (None, Some(_)) => Some(TICK_MILLIS),
            (None, None) => None,
        };
        let shared = Shared {
            prices: RefCell::new(Rc::clone(&config.prices)),
            reads: PhaseReads::new(&config),
            config,
            counters,
            logs: Logs::new(),
            global,
        };
        if let Some(ms) = tick {
            if let Err(e) = host_calls::set_tick_period_ms(ms) {
                log::error!(
                    "cannot set the tick period for remote_prices or global: host status {e}"
                );
                return None;
            }
        }
        root.prices.remote = remote;
        Some(shared)
    }

    fn request_headers(request: &mut Request, shared: &Rc<Shared>, end_of_stream: bool) -> Action {
        request.request_headers(shared, end_of_stream)
    }

    fn request_body(
        request: &mut Request,
        shared: &Rc<Shared>,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        request.request_body(shared, body_size, end_of_stream)
    }

    /// A body followed by trailers is read here (see `Request::request_trailers`).
    fn request_trailers(request: &mut Request, shared: &Rc<Shared>) -> Action {
        request.request_trailers(shared)
    }

    fn response_headers(request: &mut Request, shared: &Rc<Shared>, end_of_stream: bool) -> Action {
        request.response_headers(shared, end_of_stream)
    }

    fn response_body(
        request: &mut Request,
        shared: &Rc<Shared>,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        request.response_body(shared, body_size, end_of_stream)
    }

    /// A response that never reached its end (reset, upstream failure): booked from what was
    /// seen (a stream's usage if it came, else per `unpriced_charge`).
    fn log(request: &mut Request, shared: &Rc<Shared>) {
        request.finish(shared);
    }

    fn request_grpc_reply(
        request: &mut Request,
        shared: &Rc<Shared>,
        token: u32,
        status_code: u32,
        response_size: usize,
    ) {
        request.check_reply(shared, token, status_code, response_size);
    }

    fn tick(root: &mut Root, shared: &Rc<Shared>) {
        if let Some(g) = shared.global.as_ref() {
            // A month carry now due for tenants this worker checked earlier in the month.
            let now = Periods::at(now_unix_millis() / 1_000);
            g.claims.borrow_mut().sweep(&now);
        }
        root.bookings.flush(shared);
        if let Some(g) = shared.global.as_ref() {
            // Sent, or not sendable now (breaker open, dispatch refused): either way the next
            // batch leaves on the reply or on a regular tick.
            shared.settle_tick(g);
        }
        root.prices.tick(shared);
    }

    fn root_http_reply(root: &mut Root, shared: &Rc<Shared>, token: u32, body_size: usize) {
        root.prices.on_reply(shared, token, body_size);
    }

    fn root_grpc_reply(
        root: &mut Root,
        shared: &Rc<Shared>,
        token: u32,
        status_code: u32,
        response_size: usize,
    ) {
        root.bookings
            .on_reply(shared, token, status_code, response_size);
    }
}
