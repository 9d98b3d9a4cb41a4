//! A call to the rate limit service (`crate::rls`) as every filter makes it: the circuit
//! breaker asked before each call and told of each outcome, failures counted by reason,
//! `on_error` applied and counted, and one log line per interval and worker.
//!
//! Counters, declared in each filter's counter list under its own prefix (`<prefix>` is
//! `tollgate_rate_limit` or `tollgate_cost`):
//! - `<prefix>_global_errors_total{reason}`: `dispatch` (the host refused the call),
//!   `grpc_status` (a failed call: timeout, no upstream), `reply` (a reply that does not
//!   decode or does not match the request), `breaker_open` (not called);
//! - `<prefix>_global_fallbacks_total{on_error}`: `local`, `allow`, `deny`, once per request
//!   answered by `on_error`;
//! - `<prefix>_global_breaker_opened_total`.

use crate::host_calls::{count, now_unix_millis};
use crate::log_every::LogEvery;
use crate::rls::{self, Admit, Breaker, CallFailure, GlobalConfig, OnError, RateLimitRequest};
use crate::skeleton::contexts::Calls;

/// How often a worker logs that the service gave no verdict (ms).
const LOG_INTERVAL_MS: u64 = 10_000;

/// The metric ids of one filter's (or one rule's) calls, from its counter list (`None`: not
/// defined by the host).
#[derive(Debug, Clone, Copy, Default)]
pub struct CallCounters {
    /// `errors_total{reason="dispatch"}`.
    pub error_dispatch: Option<u32>,
    /// `errors_total{reason="grpc_status"}`.
    pub error_grpc_status: Option<u32>,
    /// `errors_total{reason="reply"}`.
    pub error_reply: Option<u32>,
    /// `errors_total{reason="breaker_open"}`.
    pub error_breaker_open: Option<u32>,
    /// `fallbacks_total{on_error="local"}`.
    pub fallback_local: Option<u32>,
    /// `fallbacks_total{on_error="allow"}`.
    pub fallback_allow: Option<u32>,
    /// `fallbacks_total{on_error="deny"}`.
    pub fallback_deny: Option<u32>,
    /// `breaker_opened_total`.
    pub breaker_opened: Option<u32>,
}

/// One worker's calls to one service (a rate-limit rule's, or cost's for every tenant).
pub struct GlobalCall {
    config: GlobalConfig,
    breaker: Breaker,
    counters: CallCounters,
    log: LogEvery,
    /// What the log lines start with (`rule per_user: `), or nothing.
    scope: String,
}

impl GlobalCall {
    /// The calls of `config`'s service, counted in `counters`; `scope` starts their log lines.
    pub fn new(config: GlobalConfig, counters: CallCounters, scope: String) -> GlobalCall {
        GlobalCall {
            breaker: config.breaker(),
            config,
            counters,
            log: LogEvery::new(LOG_INTERVAL_MS),
            scope,
        }
    }

    /// Where and how the service is called.
    pub fn config(&self) -> &GlobalConfig {
        &self.config
    }

    /// Whether the breaker lets a call go now (closed, or its one probe); when it does not, the
    /// caller answers with [`GlobalCall::fall_back`] (`CallFailure::BreakerOpen`).
    pub fn admits(&self) -> bool {
        self.breaker.admit(now_unix_millis()) != Admit::Skip
    }

    /// Sends `request` as one `ShouldRateLimit` (`rls::host_calls::should_rate_limit`): the call's
    /// token, whose reply reaches the calling context's `on_grpc_call_response`, or the
    /// failure of a call the host refused.
    pub fn dispatch(&self, request: &RateLimitRequest) -> Result<u32, CallFailure> {
        rls::host_calls::should_rate_limit(&Calls, &self.config, request)
            .map_err(|status| CallFailure::Dispatch(status as u32))
    }

    /// The reply of the call being reported to `on_grpc_call_response`, for a request of
    /// `descriptors` descriptors (`rls::host_calls::reply`); a verdict closes the breaker.
    pub fn reply(
        &self,
        status_code: u32,
        response_size: usize,
        descriptors: usize,
    ) -> Result<rls::Verdict, CallFailure> {
        let reply = rls::host_calls::reply(status_code, response_size, descriptors);
        if reply.is_ok() {
            self.breaker.success();
        }
        reply
    }

    /// A call gave no verdict (`what`: what happens instead, for the log line): counted by
    /// reason, the breaker told (counted and logged when it opens), logged at most once per
    /// interval and worker.
    pub fn failed(&self, failure: &CallFailure, what: &str) {
        let c = &self.counters;
        count(match failure {
            CallFailure::Dispatch(_) => c.error_dispatch,
            CallFailure::Grpc(_) => c.error_grpc_status,
            CallFailure::Reply(_) => c.error_reply,
            CallFailure::BreakerOpen => c.error_breaker_open,
        });
        let now = now_unix_millis();
        if *failure != CallFailure::BreakerOpen && self.breaker.failure(now) {
            count(c.breaker_opened);
            log::warn!(
                "{}the rate limit service {} failed repeatedly; this worker skips it for {} \
                 ms, then probes it",
                self.scope,
                self.config.service,
                self.config.breaker_open_ms
            );
        }
        if let Some(unlogged) = self.log.due(now) {
            log::warn!(
                "{}no verdict from the rate limit service {} ({failure}): {what}; \
                 {unlogged} more since the last line",
                self.scope,
                self.config.service
            );
        }
    }

    /// A request's call gave no verdict: [`GlobalCall::failed`], then the `on_error` the
    /// request gets, counted.
    pub fn fall_back(&self, failure: &CallFailure) -> OnError {
        let policy = self.config.on_error;
        let what = match policy {
            OnError::Local => "requests get on_error: local",
            OnError::Allow => "requests get on_error: allow",
            OnError::Deny => "requests get on_error: deny",
        };
        self.failed(failure, what);
        let c = &self.counters;
        count(match policy {
            OnError::Local => c.fallback_local,
            OnError::Allow => c.fallback_allow,
            OnError::Deny => c.fallback_deny,
        });
        policy
    }
}
