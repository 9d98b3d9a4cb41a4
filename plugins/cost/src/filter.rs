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
//!    is booked at the end of the body, and the signals are set for every response.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel};
use tollgate_common::host::{
    add_response_header, count, count_n, define_counter, now_unix_millis, plugin_configuration,
    request_header_bytes, send_json_error,
};
use tollgate_common::identity::HostIdentityView;
use tollgate_common::metrics::metric_name;
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals;

use crate::config::Config;
use crate::ledger::{BookStats, Spend};
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
    cas_retries: Option<u32>,
    booking_failures: Option<u32>,
    tenants_created: Option<u32>,
    overflowed: Option<u32>,
    locks_lost: Option<u32>,
}

impl Counters {
    fn define() -> Self {
        let status = |s: &str| define_counter(&metric_name(REQUESTS, &[("status", s)]));
        Counters {
            priced: status("priced"),
            unpriced: status("unpriced"),
            budget_exceeded: status("budget_exceeded"),
            cas_retries: define_counter(CAS_RETRIES),
            booking_failures: define_counter(BOOKING_FAILURES),
            tenants_created: define_counter(TENANTS_CREATED),
            overflowed: define_counter(OVERFLOWED),
            locks_lost: define_counter(LOCKS_LOST),
        }
    }

    fn add(&self, stats: &BookStats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.tenants_created, u64::from(stats.created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
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
        config.ledger.ensure(
            &HostSharedData,
            config.tenant_budgets.keys().map(String::as_str),
            now_unix_millis(),
        );
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
    /// Signals set and spend booked (or the request refused).
    done: bool,
}

fn header_value(map: proxy_wasm::types::MapType, name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(map, name).ok().flatten()
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
            Err(c) => {
                shared.counters.add(&c.0);
                count(shared.counters.booking_failures);
                log::warn!(
                    "cost: tenant {}: {nano} nano-USD not booked (CAS retries exhausted)",
                    self.tenant
                );
            }
        }
        let cost = nano.to_string();
        signals::set(signals::COST_NANO_USD, &cost);
        signals::set(signals::COST_STATUS, "priced");
        count(shared.counters.priced);
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
        self.tenant = config.tenant(&HostIdentityView);
        let now = Periods::at(now_unix_millis() / 1_000);
        let key = config.ledger.key(&self.tenant);
        let spend = config.ledger.spend(&HostSharedData, &key, &now);
        self.spend = Some(spend);
        if let Some(exceeded) = config.budget(&self.tenant).check(&spend, &now) {
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
        let length = header_value(H, "content-length")
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<usize>().ok());
        if length.is_some_and(|n| n > config.max_body_bytes) {
            return Action::Continue;
        }
        self.mode = Mode::CopiedJson(Vec::new());
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
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
                if end_of_stream {
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
