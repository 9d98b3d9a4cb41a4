//! The `# HELP` text of every Tollgate metric family, in one table.
//!
//! The proxy-wasm metrics ABI (`proxy_define_metric`: a type and a name) carries no description,
//! and Envoy's `/stats/prometheus` writes no `# HELP` line for any stat (its Prometheus
//! formatter, `source/server/admin/prometheus_stats.cc`, prints `# TYPE` only). The nginx host's
//! exposition (`nginx-compat/services/src/exposition.rs`) looks each family up here, so that
//! `promtool check metrics` finds nothing to report on it. Each filter's counter list
//! ([`crate::counters!`]) and the metrics filter's families are tested against this table
//! ([`crate::metrics::CounterList::without_help`]), so a family cannot be added without its text.
//!
//! Texts: one sentence, the unit where the name's suffix does not say it all, no newline or
//! backslash (the text format would need them escaped).

/// `(family, help)`, sorted by family (a test keeps it so, for the binary search in [`help`]).
pub const HELP: &[(&str, &str)] = &[
    ("tollgate_auth_total", "Requests by jwt-auth outcome, as the metrics filter saw them."),
    ("tollgate_cost_booking_failures_total", "Spend bookings the cost filter could not store in shared data."),
    ("tollgate_cost_cas_retries_total", "Compare-and-swap retries of the cost filter's ledger writes."),
    ("tollgate_cost_creation_locks_lost_total", "Ledger record creations whose lock another worker took over."),
    ("tollgate_cost_global_bookings_total", "Spend sent to the global budget service, by result."),
    ("tollgate_cost_global_breaker_opened_total", "Times a worker's circuit breaker to the global budget service opened."),
    ("tollgate_cost_global_checks_total", "Global budget checks that gave a verdict, by result."),
    ("tollgate_cost_global_errors_total", "Global budget checks that gave no verdict, by reason."),
    ("tollgate_cost_global_fallbacks_total", "Requests served by the on_error policy of the global budget check."),
    ("tollgate_cost_global_replays_total", "Queued global bookings sent again."),
    ("tollgate_cost_overflow_total", "Ledger counters that reached their maximum."),
    ("tollgate_cost_requests_total", "Requests by cost filter outcome (priced, estimated, unpriced or a refusal)."),
    ("tollgate_cost_store_full_total", "New ledger records the shared-data store refused."),
    ("tollgate_cost_tenants_created_total", "Tenant ledger records created."),
    ("tollgate_cost_token_booking_failures_total", "Token-limit usage additions the cost filter could not store in shared data."),
    ("tollgate_cost_token_keys_created_total", "Token-limit count records created (one per tenant and limit)."),
    ("tollgate_cost_token_overflow_total", "Token-limit counts that went to the shared overflow record (max_keys reached or store full)."),
    ("tollgate_cost_unpriced_calls_allowed_total", "Calls starting billable work the cost filter cannot price, passed on by unpriced_calls: allow."),
    ("tollgate_cost_unpriced_total", "LLM responses that could not be priced exactly, by reason."),
    ("tollgate_cost_unreadable_bodies_total", "Request bodies the cost filter could not read, by reason."),
    ("tollgate_jwt_auth_requests_total", "Requests by jwt-auth outcome (ok, bypass or the refusal reason)."),
    ("tollgate_llm_cost_nano_usd_total", "LLM spend in nano-USD (1e-9 USD), by model and tenant."),
    ("tollgate_llm_requests_total", "Requests the cost filter decided on, by outcome."),
    ("tollgate_llm_time_to_first_token_microseconds", "Time from the request headers to the first response body byte of a successful LLM response, in microseconds."),
    ("tollgate_llm_time_to_first_token_seconds", "Time from the request headers to the first response body byte of a successful LLM response, in seconds."),
    ("tollgate_llm_tokens_total", "LLM tokens by kind (type), model and tenant."),
    ("tollgate_rate_limit_cas_retries_total", "Compare-and-swap retries of rate-limit's counter writes, by rule."),
    ("tollgate_rate_limit_creation_locks_lost_total", "Rate-limit key creations whose lock another worker took over, by rule."),
    ("tollgate_rate_limit_global_breaker_opened_total", "Times a worker's circuit breaker to the rate limit service opened, by rule."),
    ("tollgate_rate_limit_global_errors_total", "Rate limit service calls that gave no verdict, by rule and reason."),
    ("tollgate_rate_limit_global_fallbacks_total", "Requests served by a global rule's on_error policy, by rule."),
    ("tollgate_rate_limit_invalid_authority_total", "Requests rate-limit refused because their authority has no canonical host."),
    ("tollgate_rate_limit_invalid_path_total", "Requests rate-limit refused because their path cannot be normalised."),
    ("tollgate_rate_limit_keys_created_total", "Rate-limit keys created in shared data, by rule."),
    ("tollgate_rate_limit_overflow_total", "Rate-limit counters that reached their maximum, by rule."),
    ("tollgate_rate_limit_refund_failures_total", "Rate-limit refunds that could not be stored, by rule."),
    ("tollgate_rate_limit_requests_total", "Requests by rate-limit rule and outcome."),
    ("tollgate_rate_limit_store_full_total", "New rate-limit keys the shared-data store refused, by rule."),
    ("tollgate_rate_limit_total", "Requests by rate-limit rule and outcome, as the metrics filter saw them."),
    (
        "tollgate_refusals_total",
        "Requests a Tollgate filter refused, by filter and reason.",
    ),
    ("tollgate_request_body_bytes_total", "Request body bytes, by route."),
    ("tollgate_request_duration_microseconds", "Time from the request headers to the end of the stream, in microseconds."),
    ("tollgate_request_duration_seconds", "Time from the request headers to the end of the stream, in seconds."),
    ("tollgate_requests_total", "Requests by method, status class, route and tenant (as configured)."),
    ("tollgate_response_body_bytes_total", "Response body bytes, by route."),
    ("tollgate_sticky_upstream_requests_total", "Requests by sticky-upstream outcome."),
];

/// The help text of `family` (a Prometheus family name, labels removed), if it is Tollgate's.
pub fn help(family: &str) -> Option<&'static str> {
    HELP.binary_search_by(|(name, _)| (*name).cmp(family))
        .ok()
        .and_then(|i| HELP.get(i))
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_unique_and_safe_for_the_text_format() {
        assert!(
            HELP.iter().zip(HELP.iter().skip(1)).all(|(a, b)| a.0 < b.0),
            "HELP must be sorted, no duplicates"
        );
        for (family, text) in HELP {
            assert!(family.starts_with("tollgate_"), "{family}");
            assert!(!text.is_empty() && !text.contains(['\n', '\\']), "{family}");
            assert_eq!(help(family), Some(*text));
        }
        assert_eq!(help("tollgate_nope_total"), None);
        assert_eq!(help(""), None);
    }
}
