//! metrics on the filters' skeleton (`tollgate_common::skeleton`): what its root context shares
//! (configuration, the per-VM series cache, the tenant registry) and its two phases, a thin
//! shell over the host-free modules.
//!
//! Per request: `on_http_request_headers` reads the host clock (one host call); `on_log` (called
//! by Envoy for every filter of the stream at its end, local replies included) reads the request
//! headers it needs, the response code and sizes (Envoy attributes), the other filters' lines
//! (`tollgate_common::signals`: the time to first token is the cost filter's `first_byte_us`),
//! all in one host call where the host offers it (`tollgate_common::prefetch`), and updates
//! the series: histograms at once, counters summed in the VM (`crate::pending`) and
//! handed to the host on the root context's tick (`flush_interval_ms`) and at `on_done`. No
//! body callback: the response's chunks never enter this VM. Host calls go through
//! `tollgate_common::host_calls` (the raw ABI, errors handled); nothing here traps.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::types::{Action, MetricType};
use tollgate_common::clock::{micros, UnixNanos};
use tollgate_common::config::ConfigError;
use tollgate_common::identity::{Identity, IdentitySource};
use tollgate_common::logfmt;
use tollgate_common::prefetch::{HostReader, ReadList};
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals::field;
use tollgate_common::skeleton::{Filter, FilterConfig};

use crate::config::Config;
use crate::labels::{method_label, route_label, Label};
use crate::log_reads;
use crate::pending::PendingCounters;
use crate::record::{decimal, record, CostSignals, Observation};
use tollgate_common::bytes::same_bytes;

use crate::series::{Kind, SeriesCache};
use crate::tenants::{Tenants, NONE_LABEL};

/// Upper bound on the series one VM defines (a safety net; the configuration bounds them).
const MAX_SERIES: usize = 100_000;

proxy_wasm::main! {{
    tollgate_common::skeleton::contexts::main::<Metrics>();
}}

/// The filter, for the skeleton.
struct Metrics;

impl FilterConfig for Config {
    fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse(bytes)
    }
}

/// What the root context shares with its HTTP contexts (single-threaded VM: `RefCell`).
struct State {
    config: Config,
    cache: SeriesCache,
    tenants: Option<Tenants>,
    /// The request's tenant label and the cost filter's, copied out of the registry (which
    /// lends one at a time) into buffers kept from request to request: no allocation once they
    /// have grown to the longest label (64 bytes at most).
    tenant_label: String,
    cost_tenant_label: String,
    /// Counter increments not yet handed to the host.
    pending: PendingCounters,
    /// Whether counters are held until a flush (`flush_interval_ms` above 0 and the tick set):
    /// otherwise each request's go to the host at its end.
    holds_counters: bool,
    /// What `on_log` reads ([`log_reads::list`]).
    log_reads: ReadList<10>,
}

impl Filter for Metrics {
    const NAME: &'static str = "metrics";
    type Config = Config;
    type Shared = RefCell<State>;
    type Root = ();
    type Request = Timing;

    fn configure(
        config: Config,
        _root: &mut (),
        _started: Option<UnixNanos>,
    ) -> Option<RefCell<State>> {
        let tenants = config.tenant.as_ref().map(Tenants::new);
        if let Some(t) = &tenants {
            t.ensure_registry(&HostSharedData);
        }
        let holds_counters = config.flush_interval_ms > 0
            && match tollgate_common::host_calls::set_tick_period_ms(config.flush_interval_ms) {
                Ok(()) => true,
                Err(status) => {
                    log::warn!(
                        "the host refused a tick of {} ms (status {status}): counters go to the \
                         host at the end of each request",
                        config.flush_interval_ms
                    );
                    false
                }
            };
        let log_reads = log_reads::list(&config);
        Some(RefCell::new(State {
            log_reads,
            config,
            cache: SeriesCache::new(MAX_SERIES),
            tenants,
            tenant_label: String::new(),
            cost_tenant_label: String::new(),
            pending: PendingCounters::default(),
            holds_counters,
        }))
    }

    fn tick(_root: &mut (), shared: &Rc<RefCell<State>>) {
        flush(shared);
    }

    fn done(_root: &mut (), shared: &Rc<RefCell<State>>) {
        flush(shared);
    }

    fn request_headers(timing: &mut Timing, _shared: &Rc<RefCell<State>>, _end: bool) -> Action {
        timing.start = now();
        Action::Continue
    }

    fn log(timing: &mut Timing, shared: &Rc<RefCell<State>>) {
        let Ok(mut state) = shared.try_borrow_mut() else {
            return;
        };
        log_request(timing, &mut state);
        if state.cache.refused() == 1 {
            log::warn!("series cache full ({MAX_SERIES}); further new series are dropped");
        }
    }
}

/// Hands the counters the VM holds to the host: one `proxy_increment_metric` per series that
/// changed since the last flush.
fn flush(shared: &Rc<RefCell<State>>) {
    let Ok(mut state) = shared.try_borrow_mut() else {
        return;
    };
    state
        .pending
        .flush(|id, n| tollgate_common::host_calls::count_n(Some(id), n));
}

/// A request's start on the host's clock.
#[derive(Default)]
struct Timing {
    /// At the request headers.
    start: Option<UnixNanos>,
}

fn now() -> Option<UnixNanos> {
    tollgate_common::host_calls::now()
}

/// An Envoy integer attribute (`response.code`, `request.size`, ...): 8 bytes little-endian.
fn int_value(bytes: Option<&[u8]>) -> Option<u64> {
    let arr = <[u8; 8]>::try_from(bytes?.get(..8)?).ok()?;
    u64::try_from(i64::from_le_bytes(arr)).ok()
}

/// The cost filter's line as read (`tollgate_common::signals::COST`), its fields borrowed
/// from the line where they need no unquoting.
#[derive(Default)]
struct RawCost<'a> {
    outcome: Option<Cow<'a, str>>,
    model: Option<Cow<'a, str>>,
    tenant: Option<Cow<'a, str>>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cached_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
    cost_nano_usd: Option<u64>,
    first_byte_us: Option<u64>,
}

impl<'a> RawCost<'a> {
    /// The fields of `line` this filter records (others are skipped).
    fn parse(line: &'a [u8]) -> Self {
        let mut raw = RawCost::default();
        for (key, value) in logfmt::pairs(line) {
            raw.set(key, value);
        }
        raw
    }

    fn set(&mut self, key: &str, value: Cow<'a, str>) {
        let int = || decimal(value.as_bytes());
        match key {
            field::OUTCOME => self.outcome = Some(value),
            field::MODEL => self.model = Some(value),
            field::TENANT => self.tenant = Some(value),
            field::INPUT_TOKENS => self.input_tokens = int(),
            field::OUTPUT_TOKENS => self.output_tokens = int(),
            field::CACHED_INPUT_TOKENS => self.cached_input_tokens = int(),
            field::CACHE_CREATION_INPUT_TOKENS => self.cache_creation_input_tokens = int(),
            field::REASONING_TOKENS => self.reasoning_tokens = int(),
            field::COST_NANO_USD => self.cost_nano_usd = int(),
            field::FIRST_BYTE_US => self.first_byte_us = int(),
            _ => {}
        }
    }

    fn signals<'b>(&'b self, tenant: Label<'b>) -> CostSignals<'b> {
        CostSignals {
            model: self.model.as_deref(),
            tenant,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cached_input_tokens: self.cached_input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens,
            reasoning_tokens: self.reasoning_tokens,
            cost_nano_usd: self.cost_nano_usd,
            status: self.outcome.as_deref(),
        }
    }
}

fn define(kind: Kind, name: &str) -> Option<u32> {
    let t = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Histogram => MetricType::Histogram,
    };
    tollgate_common::host_calls::define_metric(t, name)
}

/// A series' value for the request: a histogram's sample to the host; a counter's increment
/// held in `pending`, or to the host at once when the VM does not hold counters.
fn emit(pending: &mut PendingCounters, holds: bool, id: Option<u32>, kind: Kind, value: u64) {
    match (kind, id) {
        (Kind::Counter, Some(id)) if holds => pending.add(id, value),
        (Kind::Counter, _) => tollgate_common::host_calls::count_n(id, value),
        (Kind::Histogram, _) => tollgate_common::host_calls::record(id, value),
    }
}

/// Records the request that ended.
fn log_request(timing: &Timing, state: &mut State) {
    let State {
        config,
        cache,
        tenants,
        tenant_label,
        cost_tenant_label,
        pending,
        holds_counters,
        log_reads,
    } = state;
    // What on_log reads, in one host call where the host offers it (else each when used).
    let values = log_reads.fetch(HostReader);
    // Headers are read only for the labels that use them.
    let method = if config.method {
        values
            .get(log_reads::at::METHOD)
            .map_or(Label::OTHER, |m| method_label(&m))
    } else {
        Label::OTHER
    };
    let route = if config.routes.is_empty() {
        Label::OTHER
    } else {
        let path = values.get(log_reads::at::PATH).unwrap_or_default();
        route_label(&config.routes, &path, &config.paths)
    };
    let end = values.clock(log_reads::at::CLOCK);
    let now_secs = end.map_or(0, UnixNanos::secs);
    // The tenant: only a verified identity (or a header configured as trusted) is admitted
    // to the registry; see tollgate_common::identity and crate::tenants.
    let mut identity = None;
    let (tenant, trusted) = match (&config.tenant, tenants.as_mut()) {
        (Some(t), Some(reg)) => {
            let identity = identity.insert(t.source.read(&values));
            let trusted = match t.source {
                IdentitySource::Verified { .. } => *identity != Identity::Unauthenticated,
                IdentitySource::Unverified { .. } | IdentitySource::Credential { .. } => true,
            };
            let label = reg.label(&HostSharedData, identity, now_secs, true);
            let index = label.index;
            tenant_label.clear();
            tenant_label.push_str(label.text);
            let label = Label {
                index,
                text: tenant_label.as_str(),
            };
            (Some(label), trusted)
        }
        _ => (None, false),
    };
    let duration_us = micros(timing.start, end);
    // The other filters' lines (`tollgate_common::signals`).
    let auth_line = values.get(log_reads::at::JWT_AUTH);
    let auth = auth_line
        .as_deref()
        .and_then(|l| logfmt::value(l, field::OUTCOME));
    let rate_limit_line = values.get(log_reads::at::RATE_LIMIT);
    let (mut decision, mut rule) = (None, None);
    for (key, value) in rate_limit_line
        .as_deref()
        .map(logfmt::pairs)
        .into_iter()
        .flatten()
    {
        match key {
            field::OUTCOME => decision = Some(value),
            field::RULE => rule = Some(value),
            _ => {}
        }
    }
    let cost_line = values.get(log_reads::at::COST);
    let mut raw_cost = cost_line.as_deref().map(RawCost::parse);
    let cost_tenant = raw_cost
        .as_mut()
        .and_then(|raw| raw.tenant.take())
        .map(|t| {
            // The cost filter books most requests to the request's own tenant (both keyed by the
            // verified subject): the same value, already labelled, with the same admission (a
            // request with a value is trusted). Its tenant is admitted only on a request whose own
            // tenant was trusted; otherwise it is only looked up (it may be client-chosen, e.g. an
            // API key).
            if let (Some(own), Some(Identity::Value(v))) = (tenant, &identity) {
                if same_bytes(v, t.as_bytes()) {
                    return own;
                }
            }
            match (&config.tenant, tenants.as_mut()) {
                (Some(_), Some(reg)) => {
                    let identity = Identity::Value(t.into_owned().into_bytes());
                    let label = reg.label(&HostSharedData, &identity, now_secs, trusted);
                    let index = label.index;
                    cost_tenant_label.clear();
                    cost_tenant_label.push_str(label.text);
                    Label {
                        index,
                        text: cost_tenant_label.as_str(),
                    }
                }
                _ => Label::OTHER,
            }
        });
    let cost = raw_cost
        .as_ref()
        .filter(|raw| raw.outcome.is_some())
        .map(|raw| raw.signals(cost_tenant.unwrap_or(NONE_LABEL)));
    let obs = Observation {
        method,
        route,
        tenant,
        status: int_value(values.get(log_reads::at::RESPONSE_CODE).as_deref()).unwrap_or(0),
        duration_us,
        first_byte_us: raw_cost.as_ref().and_then(|raw| raw.first_byte_us),
        request_bytes: int_value(values.get(log_reads::at::REQUEST_SIZE).as_deref()).unwrap_or(0),
        response_bytes: int_value(values.get(log_reads::at::RESPONSE_SIZE).as_deref()).unwrap_or(0),
        auth_result: auth.as_deref(),
        rate_limit: match (&rule, &decision) {
            (Some(r), Some(d)) => Some((r.as_ref(), d.as_ref())),
            (None, Some(d)) => Some(("none", d.as_ref())),
            _ => None,
        },
        cost,
    };
    let holds = *holds_counters;
    record(config, cache, &obs, &mut define, &mut |id, kind, value| {
        emit(pending, holds, id, kind, value);
    });
}
