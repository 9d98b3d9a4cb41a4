//! rate-limit's counters, declared once (the README's "Metrics" lists them; the test below
//! keeps it so). Every rule has its own series, labelled `rule`.

tollgate_common::counters! {
    /// One rule's counters: its decisions, then what its shared-data writes cost.
    pub struct RuleCounters(rule) {
        allowed: "tollgate_rate_limit_requests_total" [outcome = "allowed"],
        limited: "tollgate_rate_limit_requests_total" [outcome = "limited"],
        contention_allowed: "tollgate_rate_limit_requests_total" [outcome = "contention_allowed"],
        contention_denied: "tollgate_rate_limit_requests_total" [outcome = "contention_denied"],
        missing_key_denied: "tollgate_rate_limit_requests_total" [outcome = "missing_key_denied"],
        missing_key_allowed: "tollgate_rate_limit_requests_total"
            [outcome = "missing_key_allowed"],
        invalid_weight: "tollgate_rate_limit_requests_total" [outcome = "invalid_weight"],
        /// A credential key part whose header does not hold exactly one credential (401).
        invalid_credential: "tollgate_rate_limit_requests_total" [outcome = "invalid_credential"],
        store_failure_denied: "tollgate_rate_limit_requests_total"
            [outcome = "store_failure_denied"],
        store_failure_allowed: "tollgate_rate_limit_requests_total"
            [outcome = "store_failure_allowed"],
        /// CAS mismatches and lock waits.
        cas_retries: "tollgate_rate_limit_cas_retries_total",
        keys_created: "tollgate_rate_limit_keys_created_total",
        overflowed: "tollgate_rate_limit_overflow_total",
        refund_failures: "tollgate_rate_limit_refund_failures_total",
        locks_lost: "tollgate_rate_limit_creation_locks_lost_total",
        /// New keys the store refused.
        store_full: "tollgate_rate_limit_store_full_total",
    }
}

tollgate_common::counters! {
    /// A global rule's counters (defined for global rules only): calls that gave no verdict, by
    /// reason, and what their requests got, by `on_error` policy.
    pub struct GlobalCounters(rule) {
        /// The host refused to dispatch the call.
        error_dispatch: "tollgate_rate_limit_global_errors_total" [reason = "dispatch"],
        /// A gRPC status other than OK (Envoy: a timeout, an unreachable service).
        error_grpc_status: "tollgate_rate_limit_global_errors_total" [reason = "grpc_status"],
        /// A reply that is malformed, truncated, oversize or has an unknown code.
        error_reply: "tollgate_rate_limit_global_errors_total" [reason = "reply"],
        /// Requests that made no call because the circuit breaker was open.
        error_breaker_open: "tollgate_rate_limit_global_errors_total" [reason = "breaker_open"],
        /// `on_error: allow` admitted the request uncharged.
        error_allowed: "tollgate_rate_limit_requests_total" [outcome = "global_error_allowed"],
        /// `on_error: deny` refused it (503).
        error_denied: "tollgate_rate_limit_requests_total" [outcome = "global_error_denied"],
        fallback_local: "tollgate_rate_limit_global_fallbacks_total" [on_error = "local"],
        fallback_allow: "tollgate_rate_limit_global_fallbacks_total" [on_error = "allow"],
        fallback_deny: "tollgate_rate_limit_global_fallbacks_total" [on_error = "deny"],
        /// Times this worker's breaker opened (or reopened after a failed probe).
        breaker_opened: "tollgate_rate_limit_global_breaker_opened_total",
    }
}

tollgate_common::counters! {
    /// Counters of the filter as a whole (defined when a rule or key reads the path or host).
    pub struct RequestCounters {
        /// Requests refused with 400 because their path cannot be normalised.
        invalid_paths: "tollgate_rate_limit_invalid_path_total",
        /// Requests refused with 400 because their authority has no canonical host.
        invalid_authorities: "tollgate_rate_limit_invalid_authority_total",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::metrics::CounterList as _;

    #[test]
    fn the_readme_lists_every_counter() {
        let readme = include_str!("../README.md");
        assert_eq!(RuleCounters::undocumented(readme), Vec::<String>::new());
        assert_eq!(RequestCounters::undocumented(readme), Vec::<String>::new());
        assert_eq!(GlobalCounters::undocumented(readme), Vec::<String>::new());
    }

    #[test]
    fn every_counter_has_help_text() {
        assert_eq!(RuleCounters::without_help(), Vec::<&str>::new());
        assert_eq!(RequestCounters::without_help(), Vec::<&str>::new());
        assert_eq!(GlobalCounters::without_help(), Vec::<&str>::new());
    }
}
