//! proxy-wasm glue: the root context (configuration, metrics, the zone record) and the HTTP
//! context (one request), a thin shell over the host-free modules.
//!
//! Host calls go through `tollgate_common::host` (the raw ABI, errors handled), not through the
//! SDK's trait helpers or `hostcalls` wrappers, which unwrap or panic on statuses a host may give
//! (a header value that is not UTF-8 would trap there).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};
use tollgate_common::authority::canonical_host;
use tollgate_common::host::{
    add_response_header, count, count_n, eviction_allowed, forward_normal_path, now_unix_millis,
    plugin_configuration, refuse_authority, refuse_path, request_header_bytes, send_json_error,
};
use tollgate_common::identity::{HostIdentityView, IdentityView};
use tollgate_common::log_every::LogEvery;
use tollgate_common::path::normalize;
use tollgate_common::rls::{self, Admit, Breaker, CallFailure, GlobalConfig, OnError};
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals;

use crate::config::{Config, MissingKey, Rule, StoreFullAction};
use crate::counters::{GlobalCounters, RequestCounters, RuleCounters};
use crate::headers::{
    push_service_limit, retry_after_seconds, RATELIMIT, RATELIMIT_POLICY, RETRY_AFTER,
};
use crate::key::{client_key, shared_key, RequestView};
use crate::limiter::{check, ensure_key, ensure_zone, Settings, Stats, Target, Verdict};
use crate::state::encode;

/// How often a worker logs that a rule's state could not be stored (ms).
const STORE_LOG_INTERVAL_MS: u64 = 10_000;
/// How often a worker logs that a global rule's service gave no verdict (ms).
const GLOBAL_LOG_INTERVAL_MS: u64 = 10_000;

proxy_wasm::main! {{
    tollgate_common::host::init_log(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(RateLimitRoot::default()) });
}}

impl RuleCounters {
    fn add_stats(&self, stats: &Stats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.keys_created, u64::from(stats.keys_created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.refund_failures, u64::from(stats.refund_failures));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
        count_n(self.store_full, u64::from(stats.store_full));
    }
}

/// A global rule's per-worker state.
struct GlobalState {
    counters: GlobalCounters,
    breaker: Breaker,
    /// When this worker last logged a failed call.
    log: LogEvery,
}

/// What the root context shares with its HTTP contexts.
struct Shared {
    /// Per rule (as `counters`): `Some` for a global rule.
    global: Vec<Option<GlobalState>>,
    config: Config,
    counters: Vec<RuleCounters>,
    /// When this worker last logged a store failure, per rule (as `counters`).
    store_logs: Vec<LogEvery>,
    /// Defined when a rule or key reads the path.
    request: Option<RequestCounters>,
}

#[derive(Default)]
struct RateLimitRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for RateLimitRoot {}

impl RootContext for RateLimitRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = plugin_configuration();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        // Every limit's state lives under `ratelimit/` (one zone in nginx).
        if !eviction_allowed("ratelimit/", config.allow_eviction) {
            return false;
        }
        if config.rules.iter().any(|r| r.global.is_some()) {
            if let Err(status) = rls::host::grpc_calls_supported() {
                log::error!(
                    "global mode needs gRPC calls, which this host does not \
                     implement (proxy_grpc_call answered status {status}); refusing the \
                     configuration"
                );
                return false;
            }
        }
        // The rules' zone records and shared buckets exist before this worker serves a request
        // (see limiter.rs), so that a store that fills up later still has them.
        for rule in &config.rules {
            let zone = ensure_zone(&HostSharedData, &rule.zone_key).map(|_| ());
            let buckets = rule.limits.iter().try_for_each(|l| {
                let initial = encode(&l.limit, &l.limit.initial());
                ensure_key(&HostSharedData, &l.overflow_key, &initial)?;
                ensure_key(&HostSharedData, &l.missing_key, &initial).map(|_| ())
            });
            if let Err(e) = zone.and(buckets) {
                log::error!(
                    "rule {}: cannot create its records in shared data ({e:?}); \
                     its requests follow store_full ({:?}) until they can",
                    rule.name,
                    config.store_full.action
                );
            }
        }
        let counters = config
            .rules
            .iter()
            .map(|r| RuleCounters::define(&r.name))
            .collect();
        let store_logs = config
            .rules
            .iter()
            .map(|_| LogEvery::new(STORE_LOG_INTERVAL_MS))
            .collect();
        let request = (config.needs_path || config.needs_host).then(RequestCounters::define);
        let global = config
            .rules
            .iter()
            .map(|r| {
                r.global.as_ref().map(|g| GlobalState {
                    counters: GlobalCounters::define(&r.name),
                    breaker: g.breaker(),
                    log: LogEvery::new(GLOBAL_LOG_INTERVAL_MS),
                })
            })
            .collect();
        self.shared = Some(Rc::new(Shared {
            global,
            config,
            counters,
            store_logs,
            request,
        }));
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(RateLimitHttp {
            shared: self.shared.clone(),
            response_headers: None,
            pending: None,
        }))
    }
}

struct RateLimitHttp {
    shared: Option<Rc<Shared>>,
    /// For allowed requests with `headers_on_allowed`: the rule and the RateLimit value.
    response_headers: Option<(usize, String)>,
    /// A global rule's call in flight, the request paused.
    pending: Option<Pending>,
}

/// A `ShouldRateLimit` call in flight for this request.
struct Pending {
    token: u32,
    /// The rule's index.
    index: usize,
    /// The client key (`None`: missing, shared bucket), for the local fallback.
    client: Option<String>,
    weight: u64,
}

/// The request as the key and the rule match read it; pseudo-headers fetched once, on demand,
/// the path normalised beforehand when the configuration reads it.
#[derive(Default)]
struct HostRequest {
    path: Option<Vec<u8>>,
    method: OnceCell<Option<Vec<u8>>>,
    /// The canonical host, read beforehand when the configuration reads it.
    host: Option<String>,
}

impl IdentityView for HostRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        request_header_bytes(name)
    }

    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        HostIdentityView.header_values(name)
    }

    fn property(&self, name: &str) -> Option<Vec<u8>> {
        HostIdentityView.property(name)
    }
}

impl RequestView for HostRequest {
    fn forwarded_for(&self) -> Vec<Vec<u8>> {
        tollgate_common::host::headers(MapType::HttpRequestHeaders)
            .into_iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-for"))
            .map(|(_, value)| value)
            .collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        tollgate_common::host::property(&["source", "address"])
    }

    fn path(&self) -> Option<&[u8]> {
        self.path.as_deref()
    }

    fn method(&self) -> Option<&[u8]> {
        self.method
            .get_or_init(|| request_header_bytes(":method"))
            .as_deref()
    }

    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
}

/// Counts a decision and publishes it for the metrics filter and access logs (see
/// `tollgate_common::signals`).
fn decided(counter: Option<u32>, decision: &str, rule: &str) {
    count(counter);
    signals::set(signals::RATE_LIMIT_DECISION, decision);
    signals::set(signals::RATE_LIMIT_RULE, rule);
}

impl RateLimitHttp {
    fn refuse(&self, status: u32, headers: &[(&str, &str)], error: &str, message: &str) -> Action {
        send_json_error(status, headers, error, message);
        Action::Pause
    }

    fn limit(&mut self, shared: &Shared, index: usize, rule: &Rule, req: &HostRequest) -> Action {
        let config = &shared.config;
        let Some(counters) = shared.counters.get(index) else {
            return Action::Continue;
        };
        let weight = match &rule.weight_header {
            None => 1,
            Some(name) => match rule.weight(req.header(name).as_deref()) {
                Some(w) => w,
                None => {
                    decided(counters.invalid_weight, "invalid_weight", &rule.name);
                    let message = format!(
                        "header {name} must be a whole number of cost units from 1 to {}",
                        rule.max_weight
                    );
                    return self.refuse(400, &[], "invalid_weight", &message);
                }
            },
        };
        let client = match client_key(&rule.key, req) {
            Ok(client) => client,
            Err(e) => {
                decided(
                    counters.invalid_credential,
                    "invalid_credential",
                    &rule.name,
                );
                log::info!("rule {}: 401 invalid_credential: {e}", rule.name);
                return self.refuse(401, &[], "invalid_credential", e.description());
            }
        };
        if client.is_none() {
            match rule.missing_key {
                MissingKey::Deny => {
                    decided(
                        counters.missing_key_denied,
                        "missing_key_denied",
                        &rule.name,
                    );
                    log::debug!("rule {}: request without its key", rule.name);
                    let message = format!(
                        "the request lacks what rate-limit rule {} is keyed by",
                        rule.name
                    );
                    return self.refuse(config.status, &[], "rate_limit_key_missing", &message);
                }
                MissingKey::Allow => {
                    decided(
                        counters.missing_key_allowed,
                        "missing_key_allowed",
                        &rule.name,
                    );
                    return Action::Continue;
                }
                MissingKey::Shared => {}
            }
        }
        match &rule.global {
            Some(g) => self.global(shared, index, rule, g, client, weight),
            None => self.local(shared, index, rule, client, weight),
        }
    }

    /// Checks and charges the request in shared data (local mode, and global mode's
    /// `on_error: local`).
    fn local(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
    ) -> Action {
        let config = &shared.config;
        let Some(counters) = shared.counters.get(index) else {
            return Action::Continue;
        };
        let mut targets: Vec<Target<'_>> = rule
            .limits
            .iter()
            .map(|l| Target {
                limit: &l.limit,
                key: match &client {
                    Some(c) => shared_key(&l.key_prefix, c),
                    None => l.missing_key.clone(),
                },
                overflow_key: &l.overflow_key,
                counted: client.is_some(),
            })
            .collect();
        let settings = Settings {
            zone_key: &rule.zone_key,
            cas_retries: config.cas_retries,
            on_contention: config.on_contention,
            max_keys: rule.max_keys,
            store_full: config.store_full.action.limiter(),
        };
        let report = check(
            &HostSharedData,
            &settings,
            &mut targets,
            now_unix_millis(),
            weight,
        );
        counters.add_stats(&report.stats);
        self.decide(shared, index, rule, report.verdict)
    }

    /// Asks the rule's rate limit service (global mode): pauses the request until the reply
    /// (`on_grpc_call_response`), or applies `on_error` at once when the breaker is open or the
    /// host refuses the call.
    fn global(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        g: &GlobalConfig,
        client: Option<String>,
        weight: u64,
    ) -> Action {
        let Some(state) = shared.global.get(index).and_then(Option::as_ref) else {
            return self.local(shared, index, rule, client, weight);
        };
        if state.breaker.admit(now_unix_millis()) == Admit::Skip {
            return self.fallback(
                shared,
                index,
                rule,
                client,
                weight,
                CallFailure::BreakerOpen,
            );
        }
        let request = crate::global::request(rule, &g.domain, client.as_deref(), weight);
        let call = rls::host::should_rate_limit(self, g, &request);
        match call {
            Ok(token) => {
                self.pending = Some(Pending {
                    token,
                    index,
                    client,
                    weight,
                });
                Action::Pause
            }
            Err(status) => {
                let failure = CallFailure::Dispatch(status as u32);
                self.failed(shared, index, rule, client, weight, failure)
            }
        }
    }

    /// A call failed: the breaker counts it, then `on_error` answers the request.
    fn failed(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
        failure: CallFailure,
    ) -> Action {
        if let Some(state) = shared.global.get(index).and_then(Option::as_ref) {
            if state.breaker.failure(now_unix_millis()) {
                count(state.counters.breaker_opened);
                log::warn!(
                    "rule {}: the rate limit service failed repeatedly; this worker \
                     skips it for {} ms, then probes it",
                    rule.name,
                    rule.global.as_ref().map_or(0, |g| g.breaker_open_ms)
                );
            }
        }
        self.fallback(shared, index, rule, client, weight, failure)
    }

    /// The request of a call that gave no verdict gets the rule's `on_error`: counted, logged
    /// at most once per interval per worker.
    fn fallback(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
        failure: CallFailure,
    ) -> Action {
        let policy = rule.global.as_ref().map_or(OnError::Local, |g| g.on_error);
        let state = shared.global.get(index).and_then(Option::as_ref);
        if let Some(state) = state {
            let c = &state.counters;
            count(match failure {
                CallFailure::Dispatch(_) => c.error_dispatch,
                CallFailure::Grpc(_) => c.error_grpc_status,
                CallFailure::Reply(_) => c.error_reply,
                CallFailure::BreakerOpen => c.error_breaker_open,
            });
            count(match policy {
                OnError::Local => c.fallback_local,
                OnError::Allow => c.fallback_allow,
                OnError::Deny => c.fallback_deny,
            });
            if let Some(unlogged) = state.log.due(now_unix_millis()) {
                log::warn!(
                    "rule {}: no verdict from the rate limit service {} ({failure}); \
                     requests get on_error: {policy:?}, {unlogged} more since the last line",
                    rule.name,
                    rule.global.as_ref().map_or("", |g| g.service.as_str()),
                );
            }
        }
        let counters = state.map(|s| &s.counters);
        match policy {
            OnError::Local => self.local(shared, index, rule, client, weight),
            OnError::Allow => {
                let counter = counters.and_then(|c| c.error_allowed);
                decided(counter, "global_error_allowed", &rule.name);
                Action::Continue
            }
            OnError::Deny => {
                let counter = counters.and_then(|c| c.error_denied);
                decided(counter, "global_error_denied", &rule.name);
                self.refuse(
                    503,
                    &[(RETRY_AFTER, "1")],
                    "rate_limit_unavailable",
                    "the rate limit service is unavailable; retry later",
                )
            }
        }
    }

    /// Answers the request from a verdict (either mode): continue (with RateLimit headers on
    /// the response when configured) or refuse.
    fn decide(&mut self, shared: &Shared, index: usize, rule: &Rule, verdict: Verdict) -> Action {
        let config = &shared.config;
        let Some(counters) = shared.counters.get(index) else {
            return Action::Continue;
        };
        match verdict {
            Verdict::Allowed(decisions) => {
                decided(counters.allowed, "allowed", &rule.name);
                if config.headers_on_allowed {
                    let mut value = String::with_capacity(32);
                    for (l, d) in rule.limits.iter().zip(&decisions) {
                        push_service_limit(&mut value, &l.name, d);
                    }
                    self.response_headers = Some((index, value));
                }
                Action::Continue
            }
            Verdict::Limited {
                index: at,
                decision,
            } => {
                decided(counters.limited, "limited", &rule.name);
                let name = rule.limits.get(at).map_or(rule.name.as_str(), |l| &l.name);
                let mut value = String::with_capacity(32);
                push_service_limit(&mut value, name, &decision);
                let retry = retry_after_seconds(decision.retry_after_ms).to_string();
                log::debug!("rule {}: limit {name} refused", rule.name);
                let message = format!("rate limit {name} exceeded; retry in {retry} s");
                self.refuse(
                    config.status,
                    &[
                        (RETRY_AFTER, &retry),
                        (RATELIMIT_POLICY, &rule.policy_header),
                        (RATELIMIT, &value),
                    ],
                    "rate_limited",
                    &message,
                )
            }
            Verdict::ContentionAllowed => {
                decided(
                    counters.contention_allowed,
                    "contention_allowed",
                    &rule.name,
                );
                Action::Continue
            }
            Verdict::ContentionDenied => {
                decided(counters.contention_denied, "contention_denied", &rule.name);
                self.refuse(
                    config.status,
                    &[(RETRY_AFTER, "1")],
                    "rate_limit_contention",
                    "the rate limiter is contended; retry",
                )
            }
            Verdict::StoreFailed(status) => {
                let policy = config.store_full;
                let allow = policy.action == StoreFullAction::Allow;
                let log = shared.store_logs.get(index);
                if let Some(unlogged) = log.and_then(|l| l.due(now_unix_millis())) {
                    log::warn!(
                        "rule {}: its state cannot be stored (host status {status}: \
                         a full shared-data zone?); requests {} (store_full), {unlogged} more \
                         since the last line",
                        rule.name,
                        if allow {
                            "admitted uncharged"
                        } else {
                            "refused"
                        },
                    );
                }
                if allow {
                    decided(
                        counters.store_failure_allowed,
                        "store_failure_allowed",
                        &rule.name,
                    );
                    return Action::Continue;
                }
                decided(
                    counters.store_failure_denied,
                    "store_failure_denied",
                    &rule.name,
                );
                self.refuse(
                    policy.status,
                    &[(RETRY_AFTER, "1")],
                    "rate_limit_unavailable",
                    "the rate limiter cannot store this client's state; retry later",
                )
            }
        }
    }
}

impl Context for RateLimitHttp {
    /// The reply (or failure) of the global rule's call: decide, then resume the request unless
    /// it was answered here.
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some(pending) = self.pending.take_if(|p| p.token == token_id) else {
            return;
        };
        // A call is only made with a configuration and a rule: both exist here. Should they
        // not, the paused request is refused rather than left hanging.
        let Some(shared) = self.shared.clone() else {
            send_json_error(500, &[], "internal_error", "rate-limit is not configured");
            return;
        };
        let Some(rule) = shared.config.rules.get(pending.index) else {
            send_json_error(
                500,
                &[],
                "internal_error",
                "rate-limit lost the request's rule",
            );
            return;
        };
        let reply = rls::host::reply(status_code, response_size, rule.limits.len());
        let Pending {
            index,
            client,
            weight,
            ..
        } = pending;
        let action = match reply {
            Ok(verdict) => {
                if let Some(state) = shared.global.get(index).and_then(Option::as_ref) {
                    state.breaker.success();
                }
                self.decide(&shared, index, rule, crate::global::verdict(&verdict))
            }
            Err(failure) => self.failed(&shared, index, rule, client, weight, failure),
        };
        if action == Action::Continue {
            if let Err(status) = rls::host::resume_request() {
                log::error!("cannot resume the request (host status {status})");
            }
        }
    }
}

impl HttpContext for RateLimitHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            log::error!("no configuration; refusing the request");
            send_json_error(500, &[], "internal_error", "rate-limit is not configured");
            return Action::Pause;
        };
        let mut req = HostRequest::default();
        if shared.config.needs_path {
            let mut target = request_header_bytes(":path").unwrap_or_default();
            match normalize(&target, &shared.config.paths) {
                Ok(p) => {
                    forward_normal_path(&p);
                    // Already normal (the common case): the target itself, cut at its query.
                    req.path = Some(match p.path {
                        Cow::Owned(normal) => normal.into_bytes(),
                        Cow::Borrowed(path) => {
                            let len = path.len();
                            target.truncate(len);
                            target
                        }
                    });
                }
                Err(e) => {
                    count(shared.request.as_ref().and_then(|p| p.invalid_paths));
                    signals::set(signals::RATE_LIMIT_DECISION, "invalid_path");
                    refuse_path("rate-limit", e);
                    return Action::Pause;
                }
            }
        }
        if shared.config.needs_host {
            let authority = request_header_bytes(":authority").unwrap_or_default();
            match canonical_host(&authority) {
                Ok(host) => req.host = Some(host.into_owned()),
                Err(e) => {
                    count(shared.request.as_ref().and_then(|p| p.invalid_authorities));
                    signals::set(signals::RATE_LIMIT_DECISION, "invalid_authority");
                    refuse_authority("rate-limit", e);
                    return Action::Pause;
                }
            }
        }
        let Some((index, rule)) = shared
            .config
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(&req))
        else {
            return Action::Continue;
        };
        self.limit(&shared, index, rule, &req)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let (Some((index, value)), Some(shared)) =
            (self.response_headers.take(), self.shared.as_ref())
        {
            if let Some(rule) = shared.config.rules.get(index) {
                add_response_header(RATELIMIT_POLICY, &rule.policy_header);
                add_response_header(RATELIMIT, &value);
            }
        }
        Action::Continue
    }
}
