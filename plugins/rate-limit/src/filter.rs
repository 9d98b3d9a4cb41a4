//! proxy-wasm glue: the root context (configuration, metrics, the zone record) and the HTTP
//! context (one request), a thin shell over the host-free modules.
//!
//! Host calls go through `proxy_wasm::hostcalls` with their errors handled, not through the SDK's
//! trait helpers that unwrap (a header value that is not UTF-8 would trap there).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};
use tollgate_common::host::{
    add_response_header, count, count_n, forward_normal_path, now_unix_millis,
    plugin_configuration, refuse_path, request_header_bytes, send_json_error,
};
use tollgate_common::identity::{HostIdentityView, IdentityView};
use tollgate_common::log_every::LogEvery;
use tollgate_common::path::normalize;
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals;

use crate::config::{Config, MissingKey, Rule, StoreFullAction};
use crate::counters::{PathCounters, RuleCounters};
use crate::headers::{
    push_service_limit, retry_after_seconds, RATELIMIT, RATELIMIT_POLICY, RETRY_AFTER,
};
use crate::key::{client_key, shared_key, RequestView};
use crate::limiter::{check, ensure_key, ensure_zone, Settings, Stats, Target, Verdict};
use crate::state::encode;

/// How often a worker logs that a rule's state could not be stored (ms).
const STORE_LOG_INTERVAL_MS: u64 = 10_000;

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

/// What the root context shares with its HTTP contexts.
struct Shared {
    config: Config,
    counters: Vec<RuleCounters>,
    /// When this worker last logged a store failure, per rule (as `counters`).
    store_logs: Vec<LogEvery>,
    /// Defined when a rule or key reads the path.
    paths: Option<PathCounters>,
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
                log::error!("rate-limit: {e}");
                return false;
            }
        };
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
                    "rate-limit: rule {}: cannot create its records in shared data ({e:?}); \
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
        let paths = config.needs_path.then(PathCounters::define);
        self.shared = Some(Rc::new(Shared {
            config,
            counters,
            store_logs,
            paths,
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
        }))
    }
}

struct RateLimitHttp {
    shared: Option<Rc<Shared>>,
    /// For allowed requests with `headers_on_allowed`: the rule and the RateLimit value.
    response_headers: Option<(usize, String)>,
}

/// The request as the key and the rule match read it; pseudo-headers fetched once, on demand,
/// the path normalised beforehand when the configuration reads it.
#[derive(Default)]
struct HostRequest {
    path: Option<Vec<u8>>,
    method: OnceCell<Option<Vec<u8>>>,
    authority: OnceCell<Option<Vec<u8>>>,
}

impl IdentityView for HostRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        request_header_bytes(name)
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

    fn authority(&self) -> Option<&[u8]> {
        self.authority
            .get_or_init(|| request_header_bytes(":authority"))
            .as_deref()
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
        let client = client_key(&rule.key, req);
        if client.is_none() {
            match rule.missing_key {
                MissingKey::Deny => {
                    decided(
                        counters.missing_key_denied,
                        "missing_key_denied",
                        &rule.name,
                    );
                    log::debug!("rate-limit: rule {}: request without its key", rule.name);
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
        match report.verdict {
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
                log::debug!("rate-limit: rule {}: limit {name} refused", rule.name);
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
                        "rate-limit: rule {}: its state cannot be stored (host status {status}: \
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

impl Context for RateLimitHttp {}

impl HttpContext for RateLimitHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            log::error!("rate-limit: no configuration; refusing the request");
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
                    count(shared.paths.as_ref().and_then(|p| p.invalid_paths));
                    signals::set(signals::RATE_LIMIT_DECISION, "invalid_path");
                    refuse_path("rate-limit", e);
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
