//! The rate-limit plugin configuration parser on arbitrary bytes (seeds: the shipped and tested
//! configurations). Properties: no panic; a refusal names a field (the JSON path shows in its
//! message); an accepted configuration is accepted again, and is within its documented bounds:
//! 1 to 16 limits per rule, key bounds from 1 to 10^8, a weight bound that every limit can
//! admit, statuses that are errors, names short enough that every shared-data key fits
//! `MAX_SHARED_KEY_BYTES`, and one creation record per rule.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_rate_limit::config::{Config, MAX_LIMITS_PER_RULE, MAX_MAX_KEYS, MAX_NAME_BYTES};
use tollgate_rate_limit::key::{shared_key, MAX_CLIENT_KEY_BYTES, MAX_SHARED_KEY_BYTES};

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(c) => {
            assert!(Config::parse(data).is_ok());
            assert!(!c.rules.is_empty());
            assert!((400..=599).contains(&c.status) && (400..=599).contains(&c.store_full.status));
            assert!(c.namespace.len() <= MAX_NAME_BYTES);
            let mut zones: Vec<&str> = c.rules.iter().map(|r| r.record_key.as_str()).collect();
            zones.sort_unstable();
            zones.dedup();
            assert_eq!(zones.len(), c.rules.len(), "one creation record per rule");
            for r in &c.rules {
                assert!((1..=MAX_LIMITS_PER_RULE).contains(&r.limits.len()));
                assert!((1..=MAX_MAX_KEYS).contains(&r.max_keys));
                assert!(
                    r.limits.iter().all(|l| l.limit.capacity() >= r.max_weight),
                    "{r:?}"
                );
                assert_eq!(r.weight(None), Some(1));
                for l in &r.limits {
                    let longest = shared_key(&l.key_prefix, &"x".repeat(MAX_CLIENT_KEY_BYTES));
                    assert!(longest.len() <= MAX_SHARED_KEY_BYTES);
                    assert!(
                        l.overflow_key.starts_with(&l.key_prefix)
                            && l.missing_key.starts_with(&l.key_prefix)
                    );
                }
            }
        }
        Err(e) => {
            assert!(!e.field.is_empty());
            assert!(e.to_string().contains(&format!("`{}`", e.field)), "{e}");
        }
    }
});
