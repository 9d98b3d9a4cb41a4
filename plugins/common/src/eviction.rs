//! Whether the shared data holding a filter's state may evict it, checked when the filter's
//! configuration loads.
//!
//! An nginx `shm_kv` zone declared with `eviction=lru` or `eviction=slru` (ngx_wasm_module's
//! default when a zone gives none, and the nginx host's implicit `*` zone) makes room for a new
//! key by dropping old ones silently: an over-budget tenant's ledger record or a limited client's
//! bucket then reads as missing, and a flood of new keys (one per request a client chooses)
//! resets them. A filter whose state enforces something (rate-limit; cost with budgets) therefore
//! refuses to load on such a zone unless its configuration sets `allow_eviction: true`; nginx
//! runs `on_configure` at configuration time, so `nginx -t` fails and names the zone.
//!
//! The host tells the policy through the property `tollgate.shared_data.eviction.<KEY>`: `lru`,
//! `slru` or `none`, for the zone that `proxy_set_shared_data(KEY)` writes to (Tollgate's nginx
//! host). Envoy's shared data never evicts and has no such property; nor does Kong's
//! ngx_wasm_module, which cannot say (its zones must be declared `eviction=none`, see
//! nginx-compat/README.md).

/// The property path of the policy of the zone holding `key` (segments).
pub fn property_path(key: &str) -> [&str; 4] {
    ["tollgate", "shared_data", "eviction", key]
}

/// Checks the host's answer for the zone holding a filter's `key`: `Err` with the log line of a
/// refusal (an evicting zone without `allow_eviction`), `Ok(Some(line))` with the warning for an
/// evicting zone that the configuration allows, `Ok(None)` when the zone does not evict or the
/// host has no such property.
///
/// # Errors
/// The refusal's log line.
pub fn check(
    key: &str,
    policy: Option<&[u8]>,
    allow_eviction: bool,
) -> Result<Option<String>, String> {
    let policy = match policy {
        None | Some(b"none") => return Ok(None),
        Some(p) => String::from_utf8_lossy(p),
    };
    let risk = format!(
        "the shared-data zone holding {key:?} evicts keys ({policy}): a flood of new keys can \
         evict the state this filter enforces (limits, budgets) and lift it"
    );
    if allow_eviction {
        Ok(Some(format!("{risk}; allowed by allow_eviction")))
    } else {
        Err(format!(
            "{risk}; declare the zone with eviction=none (shm_kv NAME SIZE \
             eviction=none), or set allow_eviction: true to accept it"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_an_evicting_zone_unless_allowed() {
        assert_eq!(check("cost/x/", None, false), Ok(None));
        assert_eq!(check("cost/x/", Some(b"none"), false), Ok(None));
        for policy in [&b"lru"[..], b"slru"] {
            let refused = check("ratelimit/", Some(policy), false).unwrap_err();
            // The host names the plugin; the line does not name it again.
            assert!(
                refused.starts_with("the shared-data zone holding"),
                "{refused}"
            );
            assert!(refused.contains("evicts keys"), "{refused}");
            assert!(refused.contains("allow_eviction"), "{refused}");
            let allowed = check("ratelimit/", Some(policy), true).unwrap();
            assert!(allowed.unwrap().ends_with("allowed by allow_eviction"));
        }
        assert_eq!(
            property_path("ratelimit/"),
            ["tollgate", "shared_data", "eviction", "ratelimit/"]
        );
    }
}
