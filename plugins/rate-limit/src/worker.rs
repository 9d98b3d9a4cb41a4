//! rate-limit's per-worker state (wasm32): what the root context shares with the requests
//! ([`Shared`]: configuration, counters, store-failure log throttles, the global rules' calls,
//! the request stage).

use tollgate_common::host_calls::count_n;
use tollgate_common::log_every::LogEvery;
use tollgate_common::prefetch::ReadList;
use tollgate_common::skeleton::global_call::{CallCounters, GlobalCall};
use tollgate_common::skeleton::request_stage::Stage;

use crate::config::Config;
use crate::counters::{GlobalCounters, RuleCounters};
use crate::limiter::Stats;

/// How often a worker logs that a rule's state could not be stored (ms).
pub(crate) const STORE_LOG_INTERVAL_MS: u64 = 10_000;

impl RuleCounters {
    /// Adds a check's statistics.
    pub(crate) fn add_stats(&self, stats: &Stats) {
        count_n(self.cas_retries, u64::from(stats.cas_retries));
        count_n(self.keys_created, u64::from(stats.keys_created));
        count_n(self.overflowed, u64::from(stats.overflowed));
        count_n(self.refund_failures, u64::from(stats.refund_failures));
        count_n(self.locks_lost, u64::from(stats.lock_lost));
        count_n(self.store_full, u64::from(stats.store_full));
    }
}

impl GlobalCounters {
    /// The ids the skeleton's `GlobalCall` counts a rule's calls with.
    pub(crate) fn calls(&self) -> CallCounters {
        CallCounters {
            error_dispatch: self.error_dispatch,
            error_grpc_status: self.error_grpc_status,
            error_reply: self.error_reply,
            error_breaker_open: self.error_breaker_open,
            fallback_local: self.fallback_local,
            fallback_allow: self.fallback_allow,
            fallback_deny: self.fallback_deny,
            breaker_opened: self.breaker_opened,
        }
    }
}

/// A global rule's per-worker state: its calls, and the counters of its requests answered by
/// `on_error`.
pub(crate) struct GlobalState {
    pub(crate) call: GlobalCall,
    pub(crate) counters: GlobalCounters,
}

/// What the root context shares with its HTTP contexts.
pub(crate) struct Shared {
    /// Per rule (as `counters`): `Some` for a global rule.
    pub(crate) global: Vec<Option<GlobalState>>,
    pub(crate) config: Config,
    pub(crate) counters: Vec<RuleCounters>,
    /// When this worker last logged a store failure, per rule (as `counters`).
    pub(crate) store_logs: Vec<LogEvery>,
    /// How the path and the authority are refused.
    pub(crate) stage: Stage,
    /// What a request's keys and rules read, in one host call where the host offers it
    /// (`crate::request_view::request_reads`).
    pub(crate) request_reads: ReadList<3>,
}
