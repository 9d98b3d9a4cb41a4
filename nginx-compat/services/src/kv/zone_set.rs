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

/// The position, among zones named `names` (in any order; names are unique), of the zone that
/// `key` belongs to: [`ZoneSet`]'s routing, for callers that have the zones' names before the
/// zones exist (the nginx module at configuration time). A key `NAME/rest` (`NAME` not empty)
/// goes to the zone `NAME` when there is one, every other key to the zone `*`; `None` when
/// that zone does not exist either.
pub fn route_index<'a, I>(names: I, key: &[u8]) -> Option<usize>
where
    I: IntoIterator<Item = &'a str>,
    I::IntoIter: Clone,
{
    let names = names.into_iter();
    let prefix = key
        .iter()
        .position(|&b| b == b'/')
        .filter(|&i| i > 0)
        .and_then(|i| key.get(..i));
    if let Some(prefix) = prefix {
        if let Some(i) = names.clone().position(|n| n.as_bytes() == prefix) {
            return Some(i);
        }
    }
    names.into_iter().position(|n| n == "*")
}

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
        route_index(self.zones.iter().map(|z| z.name.as_str()), key).and_then(|i| self.zones.get(i))
    }

    /// [`KvZone::get`] on the key's zone.
    ///
    /// # Errors
    /// [`KvError::NoZone`] and those of [`KvZone::get`].
    pub fn get(&self, key: &[u8]) -> Result<(Vec<u8>, u32), KvError> {
        self.route(key).ok_or(KvError::NoZone)?.get(key)
    }

    /// [`KvZone::get_into`] on the key's zone.
    ///
    /// # Errors
    /// [`KvError::NoZone`] and those of [`KvZone::get_into`].
    pub fn get_into(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, KvError> {
        self.route(key).ok_or(KvError::NoZone)?.get_into(key, value)
    }

    /// [`KvZone::set`] on the key's zone.
    ///
    /// # Errors
    /// [`KvError::NoZone`] and those of [`KvZone::set`].
    pub fn set(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), KvError> {
        self.route(key).ok_or(KvError::NoZone)?.set(key, value, cas)
    }
}
