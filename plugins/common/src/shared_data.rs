//! Proxy-wasm shared data behind a trait, so that compare-and-swap (CAS) logic built on it can be
//! unit-tested natively against a fake store that behaves like each host.
//!
//! Shared data is the host's key-value store shared by every VM (one per worker) of a plugin
//! (`proxy_get_shared_data`, `proxy_set_shared_data` in the proxy-wasm ABI 0.2.1; Envoy scopes it
//! by `vm_id`). A read returns the value and its CAS token; a write that carries a CAS token
//! succeeds only if the key still has that token. The hosts differ on writes without a token and
//! on missing keys (Envoy: proxy-wasm-cpp-host `SharedData::set`; nginx: ngx_wasm_module
//! `ngx_wa_shm_kv_set_locked`):
//!
//! | write                          | Envoy                          | ngx_wasm_module |
//! |--------------------------------|--------------------------------|-----------------|
//! | missing key, no CAS            | inserted                       | inserted        |
//! | missing key, some CAS          | inserted (the CAS is ignored)  | mismatch        |
//! | existing key, no CAS           | overwritten unconditionally    | mismatch        |
//! | existing key, its CAS          | written                        | written         |
//! | existing key, another CAS      | mismatch                       | mismatch        |
//!
//! So Envoy has no "insert if absent": two workers that both read a key as missing both write it,
//! and the later write silently replaces the earlier one (see [`MemoryStore`]'s tests).
//! Neither host deletes keys through this interface in the form used here, so every key written
//! stays until the proxy restarts.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A CAS write was refused: the key changed since it was read (or, in ngx_wasm_module, a write
/// without CAS met an existing key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasMismatch;

/// The shared-data operations a filter needs: one read, one conditional write.
pub trait SharedStore {
    /// The value of `key` and its CAS token; `(None, None)` when the key does not exist.
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);

    /// Writes `value` under `key`. With `cas: Some(token)` the write succeeds only if the key
    /// still carries `token`; with `None` see the host table in the module documentation.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch>;
}

/// The host's shared data through the proxy-wasm ABI.
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSharedData;

#[cfg(target_arch = "wasm32")]
impl SharedStore for HostSharedData {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        proxy_wasm::hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        proxy_wasm::hostcalls::set_shared_data(key, Some(value), cas).map_err(|_| CasMismatch)
    }
}

/// Why [`cas_update`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contended {
    /// CAS mismatches seen (one per failed attempt).
    pub retries: u32,
}

/// Read-modify-write of one existing key with bounded retries: `f` gets the current value and
/// returns the new one (`None`: nothing to write). Tries at most `attempts` times (at least once).
/// Returns the number of CAS mismatches on success.
///
/// Only safe for keys that already exist: on a missing key the write carries no CAS token, which
/// Envoy applies unconditionally (see the module documentation).
pub fn cas_update<S, F>(store: &S, key: &str, attempts: u32, mut f: F) -> Result<u32, Contended>
where
    S: SharedStore + ?Sized,
    F: FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
{
    let mut retries = 0u32;
    loop {
        let (value, cas) = store.get(key);
        let Some(new) = f(value.as_deref()) else {
            return Ok(retries);
        };
        if store.set(key, &new, cas).is_ok() {
            return Ok(retries);
        }
        retries = retries.saturating_add(1);
        if retries >= attempts.max(1) {
            return Err(Contended { retries });
        }
    }
}

/// Which host's CAS rules a [`MemoryStore`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantics {
    /// Envoy (proxy-wasm-cpp-host): a missing key is always inserted; no CAS overwrites.
    Envoy,
    /// ngx_wasm_module: the CAS must equal the key's (0 for a missing key).
    NgxWasm,
}

/// Counts of the operations a [`MemoryStore`] served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// `get` calls.
    pub reads: u64,
    /// `set` calls that wrote.
    pub writes: u64,
    /// `set` calls refused with [`CasMismatch`].
    pub mismatches: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    ops: OpCounts,
}

/// An in-memory shared-data store with a host's CAS rules, for native tests of CAS logic
/// (thread-safe, so several threads can play the workers).
#[derive(Debug)]
pub struct MemoryStore {
    semantics: Semantics,
    inner: Mutex<Inner>,
}

impl MemoryStore {
    /// An empty store following `semantics`.
    pub fn new(semantics: Semantics) -> Self {
        Self {
            semantics,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The rules this store follows.
    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// Operations served so far.
    pub fn ops(&self) -> OpCounts {
        self.lock().ops
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key and its value size (bytes), sorted by key.
    pub fn keys(&self) -> Vec<(String, usize)> {
        let mut keys: Vec<(String, usize)> = self
            .lock()
            .map
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.len()))
            .collect();
        keys.sort();
        keys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        let mut inner = self.lock();
        inner.ops.reads = inner.ops.reads.saturating_add(1);
        match inner.map.get(key) {
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        let mut inner = self.lock();
        let current = inner.map.get(key).map(|(_, c)| *c);
        let accepted = match (self.semantics, current, cas) {
            (Semantics::Envoy, None, _) | (Semantics::Envoy, Some(_), None) => true,
            (Semantics::Envoy, Some(have), Some(want)) => have == want,
            (Semantics::NgxWasm, None, None) => true,
            (Semantics::NgxWasm, None, Some(_)) | (Semantics::NgxWasm, Some(_), None) => false,
            (Semantics::NgxWasm, Some(have), Some(want)) => have == want,
        };
        if !accepted {
            inner.ops.mismatches = inner.ops.mismatches.saturating_add(1);
            return Err(CasMismatch);
        }
        // Tokens start at 1 and skip 0, as in both hosts (0 means "no CAS" on the ABI).
        inner.next_cas = inner.next_cas.wrapping_add(1).max(1);
        let token = inner.next_cas;
        inner.map.insert(key.to_string(), (value.to_vec(), token));
        inner.ops.writes = inner.ops.writes.saturating_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_inserts_missing_keys_whatever_the_cas_and_overwrites_without_cas() {
        let s = MemoryStore::new(Semantics::Envoy);
        assert_eq!(s.get("k"), (None, None));
        s.set("k", b"a", Some(12345)).unwrap();
        let (v, cas) = s.get("k");
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        let cas = cas.unwrap();
        assert_ne!(cas, 0);
        s.set("k", b"b", None).unwrap();
        assert_eq!(s.set("k", b"c", Some(cas)), Err(CasMismatch));
        let (_, cas2) = s.get("k");
        s.set("k", b"c", cas2).unwrap();
        assert_eq!(s.get("k").0.as_deref(), Some(&b"c"[..]));
        assert_eq!(s.ops().mismatches, 1);
    }

    #[test]
    fn ngx_refuses_blind_writes_to_existing_keys_and_cas_writes_to_missing_ones() {
        let s = MemoryStore::new(Semantics::NgxWasm);
        assert_eq!(s.set("k", b"a", Some(1)), Err(CasMismatch));
        s.set("k", b"a", None).unwrap();
        assert_eq!(s.set("k", b"b", None), Err(CasMismatch));
        let (_, cas) = s.get("k");
        s.set("k", b"b", cas).unwrap();
        assert_eq!(s.set("k", b"c", cas), Err(CasMismatch));
        assert_eq!(s.get("k").0.as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn envoy_first_insert_race_loses_an_update() {
        // Two workers read the counter as missing, both write "1": one increment is lost.
        let s = MemoryStore::new(Semantics::Envoy);
        let (a, a_cas) = s.get("n");
        let (b, b_cas) = s.get("n");
        assert!(a.is_none() && b.is_none());
        s.set("n", b"1", a_cas).unwrap();
        s.set("n", b"1", b_cas).unwrap();
        assert_eq!(s.get("n").0.as_deref(), Some(&b"1"[..]), "lost update");
        // ngx_wasm_module refuses the second insert instead.
        let s = MemoryStore::new(Semantics::NgxWasm);
        s.set("n", b"1", None).unwrap();
        assert_eq!(s.set("n", b"1", None), Err(CasMismatch));
    }

    #[test]
    fn cas_update_retries_then_gives_up() {
        let s = MemoryStore::new(Semantics::Envoy);
        s.set("n", &[0], None).unwrap();
        let inc =
            |v: Option<&[u8]>| Some(vec![v.and_then(|b| b.first()).copied().unwrap_or(0) + 1]);
        assert_eq!(cas_update(&s, "n", 3, inc), Ok(0));
        assert_eq!(s.get("n").0, Some(vec![1]));
        // A writer that always interferes between the read and the write.
        struct Meddler<'a>(&'a MemoryStore);
        impl SharedStore for Meddler<'_> {
            fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
                let got = self.0.get(key);
                self.0.set(key, &[9], None).unwrap();
                got
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
                self.0.set(key, value, cas)
            }
        }
        assert_eq!(
            cas_update(&Meddler(&s), "n", 3, inc),
            Err(Contended { retries: 3 })
        );
        assert_eq!(cas_update(&s, "n", 1, |_| None), Ok(0), "nothing to write");
    }
}
