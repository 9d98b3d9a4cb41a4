//! The sticky-upstream plugin configuration parser on arbitrary bytes (seeds: the shipped
//! configurations). Properties: no panic; a refusal names a field (the JSON path shows in its
//! message); an accepted configuration is accepted again (parsing has no hidden state).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_sticky_upstream::config::Config;

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(_) => assert!(Config::parse(data).is_ok()),
        Err(e) => {
            assert!(!e.field.is_empty());
            assert!(e.to_string().contains(&format!("`{}`", e.field)), "{e}");
        }
    }
});
