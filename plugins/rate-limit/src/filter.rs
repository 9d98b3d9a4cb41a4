//! rate-limit on the filters' skeleton (`tollgate_common::skeleton`): what its root context
//! shares (configuration, counters, the rules' records, the global rules' calls) and its phases,
//! a thin shell over the host-free modules.
//!
//! Host calls go through `tollgate_common::host_calls` (the raw ABI, errors handled), not through the
//! SDK's trait helpers or `hostcalls` wrappers, which unwrap or panic on statuses a host may give
//! (a header value that is not UTF-8 would trap there).

use std::rc::Rc;

use proxy_wasm::types::Action;
use tollgate_common::clock::UnixNanos;
use tollgate_common::config::ConfigError;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::host_calls::{add_response_header, eviction_allowed};
use tollgate_common::log_every::LogEvery;
use tollgate_common::rls;
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals;
use tollgate_common::skeleton::global_call::GlobalCall;
use tollgate_common::skeleton::request_stage::Stage;
use tollgate_common::skeleton::{Filter, FilterConfig};

use crate::admission::Request;
use crate::config::Config;
use crate::counters::{GlobalCounters, RequestCounters, RuleCounters};
use crate::headers::{RATELIMIT, RATELIMIT_POLICY};
use crate::limiter::{ensure_creation_record, ensure_key};
use crate::state::encode;
use crate::worker::{GlobalState, Shared, STORE_LOG_INTERVAL_MS};

proxy_wasm::main! {{
    tollgate_common::skeleton::contexts::main::<RateLimit>();
}}

/// The filter, for the skeleton.
struct RateLimit;

impl FilterConfig for Config {
    fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse(bytes)
    }

    fn error_format(&self) -> ErrorFormat {
        self.error_format
    }
}

impl Filter for RateLimit {
    const NAME: &'static str = "rate-limit";
    type Config = Config;
    type Shared = Shared;
    type Root = ();
    type Request = Request;

    fn configure(config: Config, _root: &mut (), _started: Option<UnixNanos>) -> Option<Shared> {
        // Every limit's state lives under `ratelimit/` (one zone in nginx).
        if !eviction_allowed("ratelimit/", config.allow_eviction) {
            return None;
        }
        if config.rules.iter().any(|r| r.global.is_some()) {
            if let Err(status) = rls::host_calls::grpc_calls_supported() {
                log::error!(
                    "global mode needs gRPC calls, which this host does not \
                     implement (proxy_grpc_call answered status {status}); refusing the \
                     configuration"
                );
                return None;
            }
        }
        // The rules' creation records and shared buckets exist before this worker serves a request
        // (see limiter.rs), so that a store that fills up later still has them.
        for rule in &config.rules {
            let zone = ensure_creation_record(&HostSharedData, &rule.record_key).map(|_| ());
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
                r.global.as_ref().map(|g| {
                    let counters = GlobalCounters::define(&r.name);
                    GlobalState {
                        call: GlobalCall::new(
                            g.clone(),
                            counters.calls(),
                            format!("rule {}: ", r.name),
                        ),
                        counters,
                    }
                })
            })
            .collect();
        Some(Shared {
            global,
            request_reads: crate::request_view::request_reads(&config),
            config,
            counters,
            store_logs,
            stage: Stage {
                filter: Self::NAME,
                outcome_property: signals::RATE_LIMIT,
                invalid_path: request.as_ref().and_then(|c| c.invalid_paths),
                invalid_authority: request.as_ref().and_then(|c| c.invalid_authorities),
            },
        })
    }

    fn request_headers(request: &mut Request, shared: &Rc<Shared>, _end: bool) -> Action {
        request.headers(shared)
    }

    fn response_headers(request: &mut Request, shared: &Rc<Shared>, _end: bool) -> Action {
        if let Some((index, value)) = request.response_headers.take() {
            if let Some(rule) = shared.config.rules.get(index) {
                add_response_header(RATELIMIT_POLICY, &rule.policy_header);
                add_response_header(RATELIMIT, &value);
            }
        }
        Action::Continue
    }

    fn request_grpc_reply(
        request: &mut Request,
        shared: &Rc<Shared>,
        token: u32,
        status_code: u32,
        response_size: usize,
    ) {
        request.reply(shared, token, status_code, response_size);
    }
}
