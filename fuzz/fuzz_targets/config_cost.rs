//! The cost plugin configuration parser on arbitrary bytes (seeds: the shipped and tested
//! configurations, LiteLLM entries). Properties: no panic; a refusal names a field (the JSON path
//! shows in its message); an accepted configuration is accepted again and within its bounds
//! (statuses, byte bounds, a ledger and a default tenant that cannot reach another key; any
//! tenant header value maps to a valid tenant), and pricing a few tokens of each kind at any
//! configured price never fails (a usage is never left unpriced for the price table's sake).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::identity::IdentityView;
use tollgate_cost::config::{valid_tenant, Config, MAX_BYTES};
use tollgate_cost::price::cost_nano;
use tollgate_cost::usage::Usage;

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(c) => {
            assert!(Config::parse(data).is_ok());
            assert!(c.over_budget_status == 402 || c.over_budget_status == 429);
            assert!(
                (400..=599).contains(&c.store_full.status)
                    && (400..=599).contains(&c.unknown_model.status)
            );
            assert!(
                c.max_request_body_bytes <= MAX_BYTES
                    && (256..=MAX_BYTES).contains(&c.max_event_bytes)
            );
            assert!(valid_tenant(&c.default_tenant));
            assert!(c.tenant_budgets.keys().all(|t| valid_tenant(t)));
            assert!(
                c.ledger.tenant_prefix.starts_with("cost/")
                    && c.ledger.tenant_prefix.ends_with("/t/")
            );
            let one = Usage {
                model: None,
                input_tokens: 3,
                output_tokens: 2,
                cached_input_tokens: 1,
                cache_creation_input_tokens: 1,
                reasoning_tokens: 1,
            };
            for p in c
                .prices
                .prices()
                .chain(c.unknown_model.default_price.iter())
            {
                assert!(cost_nano(&one, p).is_ok(), "{p:?}");
            }
            // Any tenant header value maps to a valid tenant name (never another ledger key),
            // or is refused as a credential that is not one.
            if let Ok(tenant) = c.tenant(&AnyValue(data)) {
                assert!(valid_tenant(&tenant));
            }
        }
        Err(e) => {
            assert!(!e.field.is_empty());
            assert!(e.to_string().contains(&format!("`{}`", e.field)), "{e}");
        }
    }
});

/// A request whose every header and property holds the same bytes (verified or not, the
/// tenant is read from them).
struct AnyValue<'a>(&'a [u8]);

impl IdentityView for AnyValue<'_> {
    fn property(&self, _name: &str) -> Option<Vec<u8>> {
        Some(self.0.to_vec())
    }
    fn header(&self, _name: &str) -> Option<Vec<u8>> {
        Some(self.0.to_vec())
    }
    fn header_values(&self, _name: &str) -> Option<Vec<Vec<u8>>> {
        Some(vec![self.0.to_vec()])
    }
}
