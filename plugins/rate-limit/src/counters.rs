//! rate-limit's counters, declared once (the README's "Metrics" lists them; the test below
//! keeps it so). Every rule has its own series, labelled `rule`.

tollgate_common::counters! {
    /// One rule's counters: its decisions, then what its shared-data writes cost.
    pub struct RuleCounters(rule) {
        allowed: "tollgate_rate_limit_requests_total" [decision = "allowed"],
        limited: "tollgate_rate_limit_requests_total" [decision = "limited"],
        contention_allowed: "tollgate_rate_limit_requests_total" [decision = "contention_allowed"],
        contention_denied: "tollgate_rate_limit_requests_total" [decision = "contention_denied"],
        missing_key_denied: "tollgate_rate_limit_requests_total" [decision = "missing_key_denied"],
        missing_key_allowed: "tollgate_rate_limit_requests_total"
            [decision = "missing_key_allowed"],
        invalid_weight: "tollgate_rate_limit_requests_total" [decision = "invalid_weight"],
        store_failure_denied: "tollgate_rate_limit_requests_total"
            [decision = "store_failure_denied"],
        store_failure_allowed: "tollgate_rate_limit_requests_total"
            [decision = "store_failure_allowed"],
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
    /// Counters of the filter as a whole (defined when a rule or key reads the path).
    pub struct PathCounters {
        /// Requests refused with 400 because their path cannot be normalised.
        invalid_paths: "tollgate_rate_limit_invalid_path_total",
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
        assert_eq!(PathCounters::undocumented(readme), Vec::<String>::new());
    }
}
