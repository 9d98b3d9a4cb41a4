//! The jwt-auth plugin configuration parser on arbitrary bytes (seeds: the shipped
//! configurations). Properties: no panic; a refusal names a field (the JSON path shows in its
//! message); an accepted configuration is accepted again (parsing has no hidden state), has a
//! provider, and its rules' paths are normal paths under its path policy (else they could never
//! match a normalised request), read only when a rule needs them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::path::is_normal;
use tollgate_jwt_auth::config::Config;

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(c) => {
            assert!(Config::parse(data).is_ok());
            assert!(!c.providers.is_empty());
            for r in &c.rules {
                for p in r.route.prefix.iter().chain(r.route.path.iter()) {
                    assert!(is_normal(p, &c.paths), "{p:?}");
                }
            }
            assert_eq!(c.needs.path, c.rules.iter().any(|r| r.route.needs_path()));
        }
        Err(e) => {
            assert!(!e.field.is_empty());
            assert!(e.to_string().contains(&format!("`{}`", e.field)), "{e}");
        }
    }
});
