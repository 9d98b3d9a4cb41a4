//! sticky-upstream's counters, declared once: `tollgate_sticky_upstream_requests_total.result.
//! <result>`, one series per [`Outcome`] (the README's "Metrics" lists them; the test below
//! keeps it so).

use crate::sticky::Outcome;

tollgate_common::counters! {
    /// Requests by outcome (counted once per request; `repinned` once per re-pinning response).
    pub struct Counters {}
    per_value {
        outcomes: "tollgate_sticky_upstream_requests_total"
            [outcome: Outcome = Outcome::ALL, Outcome::as_str],
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
