//! cost's counters, declared once (the README's "Metrics" lists them; the test below keeps it
//! so).

use crate::unpriced::Reason;
use crate::unreadable::Unreadable;

tollgate_common::counters! {
    /// Requests by outcome, then what the ledger's shared-data writes cost.
    pub struct Counters {
        priced: "tollgate_cost_requests_total" [outcome = "priced"],
        estimated: "tollgate_cost_requests_total" [outcome = "estimated"],
        unpriced: "tollgate_cost_requests_total" [outcome = "unpriced"],
        budget_exceeded: "tollgate_cost_requests_total" [outcome = "budget_exceeded"],
        store_failure: "tollgate_cost_requests_total" [outcome = "store_failure"],
        unknown_model: "tollgate_cost_requests_total" [outcome = "unknown_model"],
        request_too_large: "tollgate_cost_requests_total" [outcome = "request_too_large"],
        /// The API key header does not hold exactly one credential (401).
        invalid_credential: "tollgate_cost_requests_total" [outcome = "invalid_credential"],
        /// A request body the filter cannot read, refused (`unreadable`).
        unreadable_body: "tollgate_cost_requests_total" [outcome = "unreadable_body"],
        /// A call starting billable work the filter cannot price, refused (`unpriced_calls`).
        unpriced_endpoint: "tollgate_cost_requests_total" [outcome = "unpriced_endpoint"],
        /// Such a call passed on by `unpriced_calls: allow`.
        unpriced_calls_allowed: "tollgate_cost_unpriced_calls_allowed_total",
        cas_retries: "tollgate_cost_cas_retries_total",
        booking_failures: "tollgate_cost_booking_failures_total",
        tenants_created: "tollgate_cost_tenants_created_total",
        overflowed: "tollgate_cost_overflow_total",
        locks_lost: "tollgate_cost_creation_locks_lost_total",
        store_full: "tollgate_cost_store_full_total",
        global_unavailable: "tollgate_cost_requests_total" [outcome = "global_unavailable"],
        global_admitted: "tollgate_cost_global_checks_total" [result = "admitted"],
        global_refused: "tollgate_cost_global_checks_total" [result = "refused"],
        global_error_dispatch: "tollgate_cost_global_errors_total" [reason = "dispatch"],
        global_error_grpc_status: "tollgate_cost_global_errors_total" [reason = "grpc_status"],
        global_error_reply: "tollgate_cost_global_errors_total" [reason = "reply"],
        global_error_breaker_open: "tollgate_cost_global_errors_total" [reason = "breaker_open"],
        global_fallback_local: "tollgate_cost_global_fallbacks_total" [on_error = "local"],
        global_fallback_allow: "tollgate_cost_global_fallbacks_total" [on_error = "allow"],
        global_fallback_deny: "tollgate_cost_global_fallbacks_total" [on_error = "deny"],
        global_breaker_opened: "tollgate_cost_global_breaker_opened_total",
        global_booked: "tollgate_cost_global_bookings_total" [result = "booked"],
        global_queued: "tollgate_cost_global_bookings_total" [result = "queued"],
        global_dropped: "tollgate_cost_global_bookings_total" [result = "dropped"],
        global_stale: "tollgate_cost_global_bookings_total" [result = "stale"],
        global_replays: "tollgate_cost_global_replays_total",
        /// A spent token-limit window refused the request (429).
        token_limited: "tollgate_cost_requests_total" [outcome = "token_limited"],
        token_booking_failures: "tollgate_cost_token_booking_failures_total",
        token_keys_created: "tollgate_cost_token_keys_created_total",
        token_overflow: "tollgate_cost_token_overflow_total",
    }
    per_value {
        /// Responses that could not be priced exactly, by why.
        unpriced_reasons: "tollgate_cost_unpriced_total" [reason: Reason = Reason::ALL, Reason::label],
        /// Request bodies the filter could not read (refused or passed on), by why.
        unreadable_reasons: "tollgate_cost_unreadable_bodies_total" [reason: Unreadable = Unreadable::ALL, Unreadable::label],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::metrics::CounterList as _;

    #[test]
    fn the_readme_lists_every_counter() {
        let readme = include_str!("../README.md");
        assert_eq!(Counters::undocumented(readme), Vec::<String>::new());
    }

    #[test]
    fn every_counter_has_help_text() {
        assert_eq!(Counters::without_help(), Vec::<&str>::new());
    }
}
