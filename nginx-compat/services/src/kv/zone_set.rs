//! The `shm_kv` zones of a configuration ([`ZoneSet`]) and how keys are routed to them.

use super::layout::KvError;
use super::table::KvZone;

/// The `shm_kv` zones of a configuration, routing keys like ngx_wasm_module
/// (`ngx_wa_shm_kv_resolve_key`): a key `NAME/rest` goes to zone `NAME` when such a zone
/// exists, every other key (no `/`, empty or unknown prefix) to the zone named `*`. The whole
/// key (prefix included) is what the zone stores.
#[derive(Debug, Clone, Default)]
pub struct ZoneSet {
    zones: Vec<KvZone>,
}

/// A zone name given twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateZone(pub String);

impl std::fmt::Display for DuplicateZone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\" shm already defined", self.0)
    }
}

impl std::error::Error for DuplicateZone {}

impl ZoneSet {
    /// No zones.
    pub fn new() -> ZoneSet {
        ZoneSet::default()
    }

    /// Adds a zone.
    ///
    /// # Errors
    /// [`DuplicateZone`] when a zone of that name exists.
    pub fn insert(&mut self, zone: KvZone) -> Result<(), DuplicateZone> {
        if self.zones.iter().any(|z| z.name == zone.name) {
            return Err(DuplicateZone(zone.name));
        }
        self.zones.push(zone);
        Ok(())
    }

    /// The zone named `name`.
    pub fn zone(&self, name: &str) -> Option<&KvZone> {
        self.zones.iter().find(|z| z.name == name)
    }

    /// The zone `key` belongs to (see the type documentation), if any.
    pub fn route(&self, key: &[u8]) -> Option<&KvZone> {
        let named = key
            .iter()
            .position(|&b| b == b'/')
            .filter(|&i| i > 0)
            .and_then(|i| key.get(..i))
            .and_then(|prefix| self.zones.iter().find(|z| z.name.as_bytes() == prefix));
        named.or_else(|| self.zone("*"))
    }

    /// [`KvZone::get`] on the key's zone.
    ///
    /// # Errors
    /// [`KvError::NoZone`] and those of [`KvZone::get`].
    pub fn get(&self, key: &[u8]) -> Result<(Vec<u8>, u32), KvError> {
        self.route(key).ok_or(KvError::NoZone)?.get(key)
    }

    /// [`KvZone::set`] on the key's zone.
    ///
    /// # Errors
    /// [`KvError::NoZone`] and those of [`KvZone::set`].
    pub fn set(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), KvError> {
        self.route(key).ok_or(KvError::NoZone)?.set(key, value, cas)
    }
}
