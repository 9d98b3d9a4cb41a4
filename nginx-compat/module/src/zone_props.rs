//! The host's own read-only properties about its `shm_kv` zones, nginx-free
//! ([`ZoneEvictions`]): `tollgate.shared_data.eviction.<KEY>`, the eviction policy of the zone
//! that `proxy_get/set_shared_data(KEY)` uses.
//!
//! Why: a filter that keeps limits or budgets in shared data (rate-limit, cost) must not run on
//! a zone that evicts (`lru`, `slru`: a flood of new keys evicts an over-budget tenant's record,
//! which starts again from nothing), unless the operator says so. It asks in its root context's
//! `on_configure`, which this host runs in the master at configuration time (`nginx -t`, start,
//! reload) and again in each worker, and refuses its configuration, failing `nginx -t`. Envoy's
//! shared data never evicts and has no such property (it answers NotFound, as Kong's
//! ngx_wasm_module does): a filter reads NotFound as "does not evict".
//!
//! The path's segments are `tollgate`, `shared_data`, `eviction`, then `KEY` (any bytes, `/`
//! included: the rest of the path). The SDKs join segments with `\0`
//! (`tollgate\0shared_data\0eviction\0KEY`); the dotted form `tollgate.shared_data.eviction.KEY`
//! (KEY taken as it is, dots included) is accepted too. The answer is `none`, `lru` or `slru`:
//! the `eviction=` of the zone `KEY` routes to (ngx_wasm_module's `NAME/key` routing, else the
//! `*` zone: `tollgate_services::kv::route_index`), as declared (`lru` when no `eviction=` was
//! given), or `lru` for the `*` zone of 4 MiB the module adds when none is declared. A key
//! with no zone (no `NAME` zone and no `*` zone) has no answer (NotFound).

use tollgate_services::kv::{route_index, EvictionPolicy};

/// `tollgate.shared_data.eviction.` as the SDKs pass it (segments joined by `\0`).
const PREFIX: &[u8] = b"tollgate\0shared_data\0eviction\0";
/// The same path written with dots.
const PREFIX_DOTTED: &[u8] = b"tollgate.shared_data.eviction.";

/// The `KEY` of a `tollgate.shared_data.eviction.<KEY>` property path (see the module
/// documentation); `None` for any other path. (The worker's host turns away paths that do not
/// start with `t` before asking: `worker_host.rs`, `WorkerHost::property`.)
pub fn eviction_key(path: &[u8]) -> Option<&[u8]> {
    path.strip_prefix(PREFIX)
        .or_else(|| path.strip_prefix(PREFIX_DOTTED))
}

/// The `shm_kv` zones of a configuration by name, with the eviction policy each was declared
/// with (the implicit `*` zone included), in the order nginx-compat routes keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneEvictions {
    zones: Vec<(String, EvictionPolicy)>,
}

impl ZoneEvictions {
    /// The zones `(name, policy)`.
    pub fn new(zones: impl IntoIterator<Item = (String, EvictionPolicy)>) -> ZoneEvictions {
        ZoneEvictions {
            zones: zones.into_iter().collect(),
        }
    }

    /// The policy of the zone shared-data key `key` goes to, if any.
    pub fn of_key(&self, key: &[u8]) -> Option<EvictionPolicy> {
        let i = route_index(self.zones.iter().map(|(n, _)| n.as_str()), key)?;
        self.zones.get(i).map(|(_, p)| *p)
    }

    /// The value of property `path` when it is `tollgate.shared_data.eviction.<KEY>` and `KEY`
    /// has a zone: `none`, `lru` or `slru`.
    pub fn property(&self, path: &[u8]) -> Option<&'static str> {
        self.of_key(eviction_key(path)?).map(EvictionPolicy::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones() -> ZoneEvictions {
        ZoneEvictions::new([
            ("limits".to_owned(), EvictionPolicy::None),
            ("cache".to_owned(), EvictionPolicy::Slru),
            ("*".to_owned(), EvictionPolicy::Lru),
        ])
    }

    #[test]
    fn keys_are_routed_as_shared_data_is() {
        let z = zones();
        let get = |p: &[u8]| z.property(p);
        assert_eq!(
            get(b"tollgate\0shared_data\0eviction\0limits/rl/tenant"),
            Some("none")
        );
        assert_eq!(
            get(b"tollgate\0shared_data\0eviction\0cache/jwks"),
            Some("slru")
        );
        assert_eq!(get(b"tollgate\0shared_data\0eviction\0plain"), Some("lru"));
        assert_eq!(
            get(b"tollgate\0shared_data\0eviction\0other/x"),
            Some("lru")
        );
        assert_eq!(get(b"tollgate\0shared_data\0eviction\0limits"), Some("lru"));
        assert_eq!(get(b"tollgate\0shared_data\0eviction\0"), Some("lru"));
        // A key may hold `\0` or dots; the dotted form takes KEY as it is.
        assert_eq!(
            get(b"tollgate\0shared_data\0eviction\0limits/a\0b"),
            Some("none")
        );
        assert_eq!(
            get(b"tollgate.shared_data.eviction.limits/a.b"),
            Some("none")
        );
        assert_eq!(get(b"tollgate.shared_data.eviction.x.y"), Some("lru"));
    }

    #[test]
    fn other_paths_and_keys_without_a_zone_are_not_found() {
        let z = zones();
        for p in [
            &b"tollgate\0shared_data\0eviction"[..],
            b"tollgate\0shared_data\0evictions\0x",
            b"tollgate\0shared_data",
            b"tollgate.shared_data.eviction",
            b"request\0path",
            b"wasmx\0tollgate\0x",
            b"",
        ] {
            assert_eq!(z.property(p), None, "{}", String::from_utf8_lossy(p));
        }
        let named_only = ZoneEvictions::new([("limits".to_owned(), EvictionPolicy::None)]);
        assert_eq!(
            named_only.property(b"tollgate\0shared_data\0eviction\0limits/x"),
            Some("none")
        );
        assert_eq!(
            named_only.property(b"tollgate\0shared_data\0eviction\0other/x"),
            None
        );
        assert_eq!(
            ZoneEvictions::default().property(b"tollgate\0shared_data\0eviction\0x"),
            None
        );
    }
}
