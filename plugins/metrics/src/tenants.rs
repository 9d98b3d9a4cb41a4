//! The gateway-wide cap on distinct tenant label values.
//!
//! Each worker runs its own VM, so a per-VM cap would allow `workers × max_tenants` values and
//! could name a tenant on one worker and call it `other` on another. The cap is therefore kept in
//! proxy-wasm shared data (one store for all VMs of the plugin, see
//! `tollgate_common::shared_data`):
//!
//! - `metrics/<registry>/~count`: the number of slots taken, a `u32` little-endian, created by
//!   every VM in `on_configure` if missing;
//! - `metrics/<registry>/t/<tenant>`: present once `<tenant>` (sanitised label value) is admitted.
//!
//! A tenant the VM has not seen yet costs one read of its key; if absent, a slot is reserved with
//! a CAS increment of the count (bounded retries) unless the count reached `max_tenants`, then the
//! tenant key is written (idempotent: the value is constant). Admitted tenants are cached in the
//! VM (at most `max_tenants` entries), so later requests cost no host call.
//!
//! **Bound.** Every admitted value took a slot first and the count never exceeds `max_tenants`,
//! so at most `max_tenants` distinct tenant values exist gateway-wide (exact). Two workers that
//! admit the same new tenant at the same moment both take a slot: the count can exceed the
//! number of distinct tenants by up to `workers − 1` per such race (slots lost, never extra
//! values). The count record itself is created without CAS (Envoy has no insert-if-absent): two
//! VMs starting together both write 0, harmless before any tenant is admitted. Keys are never
//! deleted (shared data has no delete in this form): the registry lives until Envoy restarts.
//!
//! Once the cap is reached, a request from a tenant unknown to the VM costs one shared-data read
//! (it may have been admitted by another worker) and is labelled `other`.

use std::collections::HashSet;

use tollgate_common::shared_data::{cas_update, SharedStore};

use crate::config::{Tenant, NONE, OTHER};
use crate::labels::sanitize;

/// CAS attempts to reserve a slot; when they run out the request is labelled `other`.
pub const RESERVE_ATTEMPTS: u32 = 8;
/// Longest tenant value (bytes of the header value) that gets its own label; longer: `other`.
pub const MAX_TENANT_BYTES: usize = 64;

/// One VM's view of the tenant registry.
#[derive(Debug)]
pub struct Tenants {
    prefix: String,
    count_key: String,
    max: u32,
    admitted: HashSet<String>,
    /// This VM saw the count at the cap: skip reservation attempts.
    full: bool,
}

fn decode_count(value: Option<&[u8]>) -> u32 {
    value
        .and_then(|v| v.get(..4))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_le_bytes)
}

impl Tenants {
    /// The registry of `tenant` (nothing read or written yet).
    pub fn new(tenant: &Tenant) -> Self {
        Tenants {
            prefix: format!("{}t/", tenant.key_prefix),
            count_key: format!("{}~count", tenant.key_prefix),
            max: tenant.max_tenants,
            admitted: HashSet::new(),
            full: false,
        }
    }

    /// Creates the count record if it does not exist (call in `on_configure`).
    pub fn ensure_registry<S: SharedStore + ?Sized>(&self, store: &S) {
        if matches!(store.get(&self.count_key), Ok((None, _))) {
            let _ = store.set(&self.count_key, &0u32.to_le_bytes(), None);
        }
    }

    /// Number of tenants this VM has cached as admitted.
    pub fn cached(&self) -> usize {
        self.admitted.len()
    }

    /// The tenant label of a request whose tenant header is `raw` (`None`: absent): `none`,
    /// the sanitised value if admitted (now or before), else `other`.
    pub fn label<S: SharedStore + ?Sized>(&mut self, store: &S, raw: Option<&[u8]>) -> &str {
        let Some(raw) = raw else {
            return NONE;
        };
        if raw.is_empty() {
            return NONE;
        }
        if raw.len() > MAX_TENANT_BYTES {
            return OTHER;
        }
        let value = sanitize(&String::from_utf8_lossy(raw));
        if value == OTHER || value == NONE {
            // Reserved label values: a tenant literally named so shares them.
            return if value == OTHER { OTHER } else { NONE };
        }
        if !self.admitted.contains(&value) && !self.admit(store, &value) {
            return OTHER;
        }
        self.admitted.get(&value).map_or(OTHER, String::as_str)
    }

    /// Whether `value` is (now) admitted gateway-wide; caches it if so.
    fn admit<S: SharedStore + ?Sized>(&mut self, store: &S, value: &str) -> bool {
        let key = format!("{}{value}", self.prefix);
        if store.get(&key).is_ok_and(|(v, _)| v.is_some()) {
            return self.remember(value);
        }
        if self.full {
            return false;
        }
        let max = self.max;
        let mut reserved = false;
        let outcome = cas_update(store, &self.count_key, RESERVE_ATTEMPTS, |current| {
            let n = decode_count(current);
            if n >= max {
                reserved = false;
                None
            } else {
                reserved = true;
                Some(n.saturating_add(1).to_le_bytes().to_vec())
            }
        });
        if outcome.is_err() {
            return false;
        }
        if !reserved {
            self.full = true;
            return false;
        }
        // Constant value: a concurrent writer of the same tenant writes the same bytes.
        let _ = store.set(&key, b"1", None);
        self.remember(value)
    }

    fn remember(&mut self, value: &str) -> bool {
        if self.admitted.len() >= usize::try_from(self.max).unwrap_or(usize::MAX) {
            // Cannot happen while the registry holds (admitted ⊆ registry ≤ max); stay bounded.
            return false;
        }
        self.admitted.insert(value.to_string());
        true
    }
}
