//! The metrics plugin configuration parser on arbitrary bytes (seeds: the shipped
//! configurations). Properties: no panic; a refusal names a field (the JSON path shows in its
//! message); an accepted configuration is accepted again (parsing has no hidden state) and its
//! label sets are bounded (routes, models, tenants, the registry's age) with route prefixes in
//! normal form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::path::is_normal;
use tollgate_metrics::config::{Config, MAX_AGE_SECONDS, MAX_MODELS, MAX_ROUTES, MAX_TENANTS};

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(c) => {
            assert!(Config::parse(data).is_ok());
            assert!(c.routes.len() <= MAX_ROUTES && c.models.len() <= MAX_MODELS);
            assert!(c
                .routes
                .iter()
                .all(|r| is_normal(&r.prefix, &c.paths) && r.name != "other"));
            if let Some(t) = &c.tenant {
                assert!((1..=MAX_TENANTS).contains(&t.max_tenants));
                assert!(MAX_AGE_SECONDS.contains(&t.max_age_seconds));
            }
            assert!(!c.tenant_label || c.tenant.is_some());
        }
        Err(e) => {
            assert!(!e.field.is_empty());
            assert!(e.to_string().contains(&format!("`{}`", e.field)), "{e}");
        }
    }
});
