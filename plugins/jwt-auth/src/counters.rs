//! jwt-auth's counters, declared once: `tollgate_jwt_auth_requests_total.result.<result>`, one
//! series per outcome (the README's "Metrics" lists them; the test below keeps it so).

use crate::verify::Reason;

tollgate_common::counters! {
    /// Requests by result: passed, bypassed, refused for a malformed path or authority, or refused for a
    /// [`Reason`].
    pub struct Counters {
        ok: "tollgate_jwt_auth_requests_total" [outcome = "ok"],
        bypass: "tollgate_jwt_auth_requests_total" [outcome = "bypass"],
        invalid_path: "tollgate_jwt_auth_requests_total" [outcome = "invalid_path"],
        invalid_authority: "tollgate_jwt_auth_requests_total" [outcome = "invalid_authority"],
        /// The host could not list or edit the request's headers (500).
        headers_unavailable: "tollgate_jwt_auth_requests_total" [outcome = "headers_unavailable"],
    }
    per_value {
        denied: "tollgate_jwt_auth_requests_total" [outcome: Reason = Reason::ALL, Reason::as_str],
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
