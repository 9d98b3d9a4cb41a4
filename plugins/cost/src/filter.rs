//! proxy-wasm glue: the root context (configuration, counters, the ledger's records) and the
//! HTTP context (one request), a thin shell over the host-free modules.
//!
//! Host calls go through `tollgate_common::host` and `proxy_wasm::hostcalls` with their errors
//! handled, never through the SDK's trait helpers that unwrap (a non-UTF-8 header traps there).
//!
//! Per request:
//! 1. Request headers: the tenant; one shared-data read of its spend; over budget → a local
//!    reply (402/429, JSON error, `x-tollgate-budget-reset`, `retry-after`) before the upstream.
//! 2. Request body (POST only): a copy of at most `max_request_body_bytes`, for `model` when the
//!    response lacks it. The body itself passes on untouched (`Continue`).
//! 3. Response headers: `content-encoding` other than `identity` → not inspected (unpriced);
//!    `text/event-stream` → streaming; `application/json` (or `+json`) with a `content-length`
//!    of at most `max_body_bytes` (or none) → non-streaming: chunks are copied as they pass, up to
//!    `max_body_bytes` (beyond: unpriced). Nothing is held: see the README on why Envoy cannot
//!    delay response headers until the body is known (no token/cost response headers).
//! 4. Response body: streaming chunks always `Continue` (only inspected, never held); the spend
//!    is booked, and the signals are set, when the body is complete as the client sees it,
//!    before the chunk that completes it is passed on: its `Content-Length` reached
//!    (`body_end`), a stream's final event (`sse`), or the host's end of stream, whichever comes
//!    first. A client that has its whole reply can therefore not get ahead of its booking.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel};
use tollgate_common::host::{
    add_response_header, count, count_n, define_counter, now_unix_millis, plugin_configuration,
    request_header_bytes, send_json_error,
};
use tollgate_common::log_every::LogEvery;
use tollgate_common::metrics::metric_name;
use tollgate_common::shared_data::{HostSharedData, StoreError};
use tollgate_common::signals;

use crate::body_end::{content_length, BodyEnd};
use crate::config::{Config, StoreFullAction};
use crate::ledger::{BookStats, Lookup, OpenError, Spend, Standing};
use crate::period::Periods;
use crate::price::cost_nano;
use crate::sse::StreamState;
use crate::usage::{parse_json_body, request_model, Usage};

const REQUESTS: &str = "tollgate_cost_requests_total";
const CAS_RETRIES: &str = "tollgate_cost_cas_retries_total";
const BOOKING_FAILURES: &str = "tollgate_cost_booking_failures_total";
const TENANTS_CREATED: &str = "tollgate_cost_tenants_created_total";
const OVERFLOWED: &str = "tollgate_cost_overflow_total";
const LOCKS_LOST: &str = "tollgate_cost_creation_locks_lost_total";
const STORE_FULL: &str = "tollgate_cost_store_full_total";

/// How often a worker logs a ledger that cannot be stored or read (ms).
const STORE_LOG_INTERVAL_MS: u64 = 10_000;

/// Refusal header: seconds until the exhausted budget resets (delay-seconds, as Retry-After).
pub const BUDGET_RESET_HEADER: &str = "x-tollgate-budget-reset";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(CostRoot::default()) });
}}

struct Counters {
    priced: Option<u32>,
    unpriced: Option<u32>,
    budget_exceeded: Option<u32>,
    store_failure: Option<u32>,
    cas_retries: Option<u32>,
    booking_failures: Option<u32>,
    tenants_created: Option<u32>,
    overflowed: Option<u32>,
    locks_lost: Option<u32>,
    store_full: Option<u32>,
    /// When this worker last logged a ledger store failure.
    store_log: LogEvery,
}

impl Counters {
    fn define() -> Self {
        let status = |s: &str| define_counter(&metric_name(REQUESTS, &[("status", s)]));
        Counters {
            priced: status("priced"),
            unpriced: status("unpriced"),
            budget_exceeded: status("budget_exceeded"),
            store_failure: status("store_failure"),
            cas_retries: define_counter(CAS_RETRIES),
            booking_failures: define_counter(BOOKING_FAILURES),
            tenants_created: define_counter(TENANTS_CREATED),
            overflowed: define_counter(OVERFLOWED),
            locks_lost: define_counter(LOCKS_LOST),
            store_full: define_counter(STORE_FULL),
            store_log: LogEvery::new(STORE_LOG_INTERVAL_MS),
        }
    }

    fn add(&self, stats: &BookStats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.tenants_created, u64::from(stats.created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
        count_n(self.store_full, u64::from(stats.store_full));
    }

    /// Logs a store failure (at most once per interval and worker).
    fn store_failed(&self, what: &str, status: u32) {
        if let Some(unlogged) = self.store_log.due(now_unix_millis()) {
            log::warn!(
                "cost: {what} (shared data: host status {status}, a full zone?); \
                 {unlogged} more since the last line"
            );
        }
    }
}

struct Shared {
    config: Config,
    counters: Counters,
}

#[derive(Default)]
struct CostRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for CostRoot {}

impl RootContext for CostRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match Config::parse(&plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("cost: {e}");
                return false;
            }
        };
        // The ledger's records exist before this worker serves a request, so that a zone that
        // fills up later still has them.
        if let Err((key, e)) = config.ledger.ensure(
            &HostSharedData,
            config.tenant_budgets.keys().map(String::as_str),
            now_unix_millis(),
        ) {
            log::error!(
                "cost: cannot create the ledger record {key} in shared data ({e:?}); \
                 tenants with a budget follow store_full until it can be"
            );
        }
        self.shared = Some(Rc::new(Shared {
            config,
            counters: Counters::define(),
        }));
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(CostHttp {
            shared: self.shared.clone(),
            tenant: String::new(),
            spend: None,
            request_body: None,
            request_model: None,
            mode: Mode::Off,
            body_end: BodyEnd::default(),
            done: false,
        }))
    }
}

enum Mode {
    /// Not inspected (yet): no response, compressed or another content type.
    Off,
    /// Non-streaming JSON: our copy of the body so far.
    CopiedJson(Vec<u8>),
    /// Server-sent events.
    Stream(Box<StreamState>),
}

struct CostHttp {
    shared: Option<Rc<Shared>>,
    tenant: String,
    /// The tenant's spend read at the request headers.
    spend: Option<Spend>,
    /// The request body prefix kept so far (`None`: not kept).
    request_body: Option<Vec<u8>>,
    request_model: Option<String>,
    mode: Mode,
    /// The response body's progress against its `Content-Length`.
    body_end: BodyEnd,
    /// Signals set and spend booked (or the request refused).
    done: bool,
}

fn header_value(map: proxy_wasm::types::MapType, name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(map, name).ok().flatten()
}

/// The proxy-wasm status of a store error.
fn status_of(e: StoreError) -> u32 {
    match e {
        StoreError::CasMismatch => tollgate_common::shared_data::status::CAS_MISMATCH,
        StoreError::Failed(status) => status,
    }
}

fn body_chunk(buffer: BufferType, size: usize) -> Vec<u8> {
    hostcalls::get_buffer(buffer, 0, size)
        .ok()
        .flatten()
        .unwrap_or_default()
}

impl CostHttp {
    /// Books and publishes the outcome of the response (once).
    fn finish(&mut self, shared: &Shared, usage: Option<Usage>) {
        if self.done {
            return;
        }
        self.done = true;
        let config = &shared.config;
        signals::set(signals::COST_TENANT, &self.tenant);
        let Some(usage) = usage else {
            count(shared.counters.unpriced);
            signals::set(signals::COST_STATUS, "unpriced");
            return;
        };
        if let Some(model) = &usage.model {
            signals::set(signals::COST_MODEL, model);
        }
        let input = usage.input_tokens.to_string();
        let output = usage.output_tokens.to_string();
        signals::set(signals::COST_INPUT_TOKENS, &input);
        signals::set(signals::COST_OUTPUT_TOKENS, &output);
        let price = usage.model.as_ref().and_then(|m| config.prices.get(m));
        let Some(nano) = price.and_then(|p| cost_nano(&usage, p).ok()) else {
            count(shared.counters.unpriced);
            signals::set(signals::COST_STATUS, "unpriced");
            return;
        };
        let key = config.ledger.key(&self.tenant);
        match config
            .ledger
            .book(&HostSharedData, &key, now_unix_millis(), nano)
        {
            Ok(stats) => shared.counters.add(&stats),
            Err(not) => {
                shared.counters.add(&not.stats);
                count(shared.counters.booking_failures);
                match not.failed {
                    Some(status) => shared.counters.store_failed(
                        &format!("tenant {}: {nano} nano-USD not booked", self.tenant),
                        status,
                    ),
                    None => log::warn!(
                        "cost: tenant {}: {nano} nano-USD not booked (CAS retries exhausted)",
                        self.tenant
                    ),
                }
            }
        }
        let cost = nano.to_string();
        signals::set(signals::COST_NANO_USD, &cost);
        signals::set(signals::COST_STATUS, "priced");
        count(shared.counters.priced);
    }

    /// The tenant's spend for the budget check. A tenant with a budget (`limited`) and no record
    /// yet gets one now, before its request goes upstream; `Err(status)` when its spend cannot be
    /// known or its record cannot be created and `store_full` says refuse. A tenant without a
    /// budget is never refused for the ledger (its spend then goes to the overflow record).
    fn read_spend(
        &self,
        shared: &Shared,
        limited: bool,
        now_ms: u64,
        now: &Periods,
    ) -> Result<Spend, u32> {
        let ledger = &shared.config.ledger;
        let key = ledger.key(&self.tenant);
        let lookup = match ledger.spend(&HostSharedData, &key, now) {
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
        let opened = ledger.open(&HostSharedData, &key, now_ms, &mut stats);
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
}

impl Context for CostHttp {}

impl HttpContext for CostHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            log::error!("cost: no configuration; refusing the request");
            send_json_error(500, &[], "internal_error", "cost is not configured");
            self.done = true;
            return Action::Pause;
        };
        let config = &shared.config;
        self.tenant = config.tenant(request_header_bytes(config.tenant_header()).as_deref());
        let now_ms = now_unix_millis();
        let now = Periods::at(now_ms / 1_000);
        let budget = config.budget(&self.tenant);
        let spend = match self.read_spend(&shared, budget.is_limited(), now_ms, &now) {
            Ok(spend) => spend,
            Err(status) => {
                self.done = true;
                count(shared.counters.store_failure);
                signals::set(signals::COST_TENANT, &self.tenant);
                signals::set(signals::COST_STATUS, "store_failure");
                shared.counters.store_failed(
                    &format!(
                        "tenant {}: ledger unavailable, request refused",
                        self.tenant
                    ),
                    status,
                );
                send_json_error(
                    config.store_full.status,
                    &[("retry-after", "1")],
                    "budget_unavailable",
                    "the spend of this tenant cannot be read or stored; retry later",
                );
                return Action::Pause;
            }
        };
        self.spend = Some(spend);
        if let Some(exceeded) = budget.check(&spend, &now) {
            self.done = true;
            count(shared.counters.budget_exceeded);
            signals::set(signals::COST_TENANT, &self.tenant);
            signals::set(signals::COST_STATUS, "budget_exceeded");
            let reset = exceeded.reset_secs.to_string();
            let message = format!(
                "the {} budget of tenant {} is spent; it resets in {reset} s",
                exceeded.period, self.tenant
            );
            send_json_error(
                config.over_budget_status,
                &[(BUDGET_RESET_HEADER, &reset), ("retry-after", &reset)],
                "budget_exceeded",
                &message,
            );
            return Action::Pause;
        }
        if !end_of_stream
            && config.max_request_body_bytes > 0
            && request_header_bytes(":method").as_deref() == Some(b"POST")
        {
            self.request_body = Some(Vec::new());
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let (Some(shared), Some(buf)) = (self.shared.as_ref(), self.request_body.as_mut()) else {
            return Action::Continue;
        };
        if buf.len().saturating_add(body_size) > shared.config.max_request_body_bytes {
            self.request_body = None;
            return Action::Continue;
        }
        buf.extend_from_slice(&body_chunk(BufferType::HttpRequestBody, body_size));
        if end_of_stream {
            self.request_model = request_model(buf);
            self.request_body = None;
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if self.done {
            return Action::Continue;
        }
        self.request_body = None;
        let config = &shared.config;
        self.spend_headers(&shared);
        if end_of_stream {
            self.finish(&shared, None);
            return Action::Continue;
        }
        use proxy_wasm::types::MapType::HttpResponseHeaders as H;
        let length_header = header_value(H, "content-length");
        self.body_end = BodyEnd::new(length_header.as_deref());
        let encoded = header_value(H, "content-encoding")
            .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case(b"identity"));
        let content_type = header_value(H, "content-type").unwrap_or_default();
        let media = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii()
            .to_ascii_lowercase();
        if encoded {
            return Action::Continue;
        }
        if media == b"text/event-stream" {
            self.mode = Mode::Stream(Box::new(StreamState::new(config.max_event_bytes)));
            return Action::Continue;
        }
        if media != b"application/json" && !media.ends_with(b"+json") {
            return Action::Continue;
        }
        let length = length_header.as_deref().and_then(content_length);
        if length.is_some_and(|n| n > config.max_body_bytes as u64) {
            return Action::Continue;
        }
        self.mode = Mode::CopiedJson(Vec::new());
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
        let end_of_stream = self.body_end.feed(body_size) || end_of_stream;
        let max = shared.config.max_body_bytes;
        let request_model = self.request_model.take();
        let model = request_model.as_deref();
        match &mut self.mode {
            Mode::Off => {
                if end_of_stream {
                    self.finish(&shared, None);
                }
            }
            Mode::CopiedJson(buf) => {
                if buf.len().saturating_add(body_size) > max {
                    self.mode = Mode::Off;
                } else {
                    buf.extend_from_slice(&body_chunk(BufferType::HttpResponseBody, body_size));
                }
                if end_of_stream {
                    let usage = match std::mem::replace(&mut self.mode, Mode::Off) {
                        Mode::CopiedJson(buf) => parse_json_body(&buf, model),
                        _ => None,
                    };
                    self.finish(&shared, usage);
                }
            }
            Mode::Stream(state) => {
                state.feed(&body_chunk(BufferType::HttpResponseBody, body_size));
                if end_of_stream || state.ended() {
                    let usage = state.finish(model);
                    self.mode = Mode::Off;
                    self.finish(&shared, usage);
                }
            }
        }
        if !end_of_stream {
            self.request_model = request_model;
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // A response that never reached its end (reset, upstream failure): count it once.
        if let Some(shared) = self.shared.clone() {
            let usage = match &self.mode {
                Mode::Stream(state) => state.finish(self.request_model.as_deref()),
                _ => None,
            };
            self.finish(&shared, usage);
        }
    }
}
