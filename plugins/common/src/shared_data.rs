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
//!
//! # Full stores and failures
//!
//! | | Envoy | nginx (`shm_kv NAME SIZE [eviction=...]`) |
//! |---|---|---|
//! | size | unbounded (process memory) | the zone's `SIZE` |
//! | full, `eviction=none` | never full | a write of a new key (or a larger value) fails: `InternalFailure` |
//! | full, `eviction=lru` (the default) | never full | other keys are **evicted silently** to make room |
//! | value too large for the zone | - | `BadArgument` |
//!
//! An evicted key reads as missing, exactly like one never written: a budget or a limit kept in an
//! evicting zone can be reset by whoever fills it. State that enforces something therefore lives
//! in zones declared with `eviction=none` (the shipped nginx configurations give each filter's
//! namespace, `ratelimit/` and `cost/`, its own zone), sized for its keys, and the filters treat
//! a failed write as "cannot store", with an explicit policy.
//!
//! The proxy-wasm Rust SDK's `hostcalls::get_shared_data` / `set_shared_data` `panic!` on any
//! status other than `Ok`, `NotFound` (read) or `CasMismatch` (write), and a panic is a trap:
//! the guest would die in the middle of a request, possibly holding a key-creation lease.
//! [`HostSharedData`] therefore calls the ABI functions itself and returns every status as a
//! [`StoreError`].

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;

use crate::config::ConfigError;

/// proxy-wasm `Status` codes (ABI 0.2.1) that this module names.
pub mod status {
    /// `NotFound`.
    pub const NOT_FOUND: u32 = 1;
    /// `BadArgument` (nginx: a value larger than the zone).
    pub const BAD_ARGUMENT: u32 = 2;
    /// `CasMismatch`.
    pub const CAS_MISMATCH: u32 = 8;
    /// `InternalFailure` (nginx: the zone is full and evicts nothing, or is corrupt).
    pub const INTERNAL_FAILURE: u32 = 10;
}

/// Why a shared-data call did not do what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// A write's CAS token did not match: the key changed since it was read (or, in
    /// ngx_wasm_module, a write without CAS met an existing key). Read again and retry.
    CasMismatch,
    /// The host refused the call with this proxy-wasm status (e.g. `InternalFailure`: an nginx
    /// zone is full and evicts nothing; `BadArgument`: the value can never fit). Retrying does
    /// not help; the caller's policy decides (see each filter's `store_full` setting).
    Failed(u32),
}

/// What a read returns: the value (`None`: no such key) and its CAS token.
pub type Read = (Option<Vec<u8>>, Option<u32>);

/// The shared-data operations a filter needs: one read, one conditional write.
pub trait SharedStore {
    /// The value of `key` and its CAS token; `Ok((None, None))` when the key does not exist.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the host could not answer (the key may exist).
    fn get(&self, key: &str) -> Result<Read, StoreError>;

    /// Writes `value` under `key`. With `cas: Some(token)` the write succeeds only if the key
    /// still carries `token`; with `None` see the host table in the module documentation.
    ///
    /// # Errors
    /// [`StoreError::CasMismatch`]; [`StoreError::Failed`] (nothing was written).
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;

    /// A monotonic-enough clock in milliseconds, for bounding how long a caller waits on
    /// another worker ([`create_once`]); the host's wall clock (WASI `clock_time_get` in a
    /// filter). Tests may replace it.
    fn clock_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The host's shared data through the proxy-wasm ABI, never trapping (module documentation).
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSharedData;

#[cfg(target_arch = "wasm32")]
impl SharedStore for HostSharedData {
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        match abi::get_shared_data(key) {
            (0, value, cas) => Ok((value, (cas != 0).then_some(cas))),
            (status::NOT_FOUND, _, _) => Ok((None, None)),
            (status, _, _) => Err(StoreError::Failed(status)),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match abi::set_shared_data(key, value, cas.unwrap_or(0)) {
            0 => Ok(()),
            status::CAS_MISMATCH => Err(StoreError::CasMismatch),
            status => Err(StoreError::Failed(status)),
        }
    }
}

/// The two shared-data functions of the proxy-wasm ABI 0.2.1, with the status as the host
/// returned it (the SDK's wrappers panic on statuses they do not expect, and read the status
/// into an enum, which is undefined behaviour for a value outside it).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod abi {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_get_shared_data(
            key_data: *const u8,
            key_size: usize,
            return_value_data: *mut *mut u8,
            return_value_size: *mut usize,
            return_cas: *mut u32,
        ) -> u32;
        fn proxy_set_shared_data(
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
            cas: u32,
        ) -> u32;
    }

    /// `(status, value, cas)`; the value only with status 0 (`Ok`).
    pub fn get_shared_data(key: &str) -> (u32, Option<Vec<u8>>, u32) {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        let mut cas: u32 = 0;
        // SAFETY: the key is a live buffer of key.len() bytes; the out-pointers are live locals.
        let status = unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
        };
        let value = if status == 0 && !data.is_null() {
            // SAFETY: on Ok the host returns `size` bytes it allocated through this module's
            // `proxy_on_memory_allocate` (the SDK's: a `Vec<u8>` of exactly that capacity, then
            // forgotten), and hands their ownership to the guest, as the SDK's own wrapper assumes.
            Some(unsafe { Vec::from_raw_parts(data, size, size) })
        } else {
            None
        };
        (status, value, cas)
    }

    /// The status of the write.
    pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> u32 {
        // SAFETY: key and value are live buffers of their lengths; the host copies them.
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
    }
}

/// Why [`cas_update`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contended {
    /// CAS mismatches seen (one per failed attempt).
    pub retries: u32,
    /// The host status that stopped the update (a failed read or write), if any; `None`: the
    /// retries ran out.
    pub failed: Option<u32>,
}

/// Read-modify-write of one existing key with bounded retries: `f` gets the current value and
/// returns the new one (`None`: nothing to write). Tries at most `attempts` times (at least once);
/// a host failure ([`StoreError::Failed`]) stops at once. Returns the number of CAS mismatches on
/// success.
///
/// Only safe for keys that already exist: on a missing key the write carries no CAS token, which
/// Envoy applies unconditionally (see the module documentation).
pub fn cas_update<S, F>(store: &S, key: &str, attempts: u32, mut f: F) -> Result<u32, Contended>
where
    S: SharedStore + ?Sized,
    F: FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
{
    let mut retries = 0u32;
    let failed = |retries, status| Contended {
        retries,
        failed: Some(status),
    };
    loop {
        let (value, cas) = store.get(key).map_err(|e| failed(retries, code(e)))?;
        let Some(new) = f(value.as_deref()) else {
            return Ok(retries);
        };
        match store.set(key, &new, cas) {
            Ok(()) => return Ok(retries),
            Err(StoreError::Failed(status)) => return Err(failed(retries, status)),
            Err(StoreError::CasMismatch) => {}
        }
        retries = retries.saturating_add(1);
        if retries >= attempts.max(1) {
            return Err(Contended {
                retries,
                failed: None,
            });
        }
    }
}

/// The proxy-wasm status of an error.
fn code(e: StoreError) -> u32 {
    match e {
        StoreError::CasMismatch => status::CAS_MISMATCH,
        StoreError::Failed(status) => status,
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
    /// `set` calls refused with [`StoreError::CasMismatch`].
    pub mismatches: u64,
    /// `get` and `set` calls refused with [`StoreError::Failed`].
    pub failures: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    ops: OpCounts,
    /// Most keys (a full nginx zone with `eviction=none`); `None`: unbounded (Envoy).
    capacity: Option<usize>,
    /// Reads fail with `InternalFailure` (a corrupt or unreachable zone).
    failing_reads: bool,
}

/// An in-memory shared-data store with a host's CAS rules, for native tests of CAS logic
/// (thread-safe, so several threads can play the workers). It can also play a full nginx zone
/// that evicts nothing ([`MemoryStore::set_capacity`]) and a store whose reads fail.
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

    /// Bounds the store to `keys` keys (`None`: unbounded): beyond, writing a new key fails with
    /// `Failed(InternalFailure)`, as in an nginx zone with `eviction=none`.
    pub fn set_capacity(&self, keys: Option<usize>) {
        self.lock().capacity = keys;
    }

    /// Makes every read fail (`true`) or work again.
    pub fn set_failing_reads(&self, failing: bool) {
        self.lock().failing_reads = failing;
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
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        let mut inner = self.lock();
        if inner.failing_reads {
            inner.ops.failures = inner.ops.failures.saturating_add(1);
            return Err(StoreError::Failed(status::INTERNAL_FAILURE));
        }
        inner.ops.reads = inner.ops.reads.saturating_add(1);
        Ok(match inner.map.get(key) {
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
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
            return Err(StoreError::CasMismatch);
        }
        if current.is_none() && inner.capacity.is_some_and(|c| inner.map.len() >= c) {
            inner.ops.failures = inner.ops.failures.saturating_add(1);
            return Err(StoreError::Failed(status::INTERNAL_FAILURE));
        }
        // Tokens start at 1 and skip 0, as in both hosts (0 means "no CAS" on the ABI).
        inner.next_cas = inner.next_cas.wrapping_add(1).max(1);
        let token = inner.next_cas;
        inner.map.insert(key.to_string(), (value.to_vec(), token));
        inner.ops.writes = inner.ops.writes.saturating_add(1);
        Ok(())
    }
}

/// Default `store_full.status` (RFC 9110 section 15.6.4: the server cannot handle the request
/// for now).
pub const DEFAULT_STORE_FULL_STATUS: u32 = 503;

fn default_store_full_status() -> u32 {
    DEFAULT_STORE_FULL_STATUS
}

/// The `store_full` setting of a filter whose enforcing state lives in shared data: what a
/// request gets when that state cannot be read or stored (`action`, the filter's own choices;
/// the default refuses) and the status of a refusal (`status`, default 503, 4xx or 5xx).
/// JSON: `{"action": "...", "status": 503}`, both optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "A: Deserialize<'de> + Default")
)]
pub struct StoreFull<A> {
    /// What to do.
    #[serde(default)]
    pub action: A,
    /// Status of a refusal.
    #[serde(default = "default_store_full_status")]
    pub status: u32,
}

impl<A: Default> Default for StoreFull<A> {
    fn default() -> Self {
        StoreFull {
            action: A::default(),
            status: DEFAULT_STORE_FULL_STATUS,
        }
    }
}

impl<A> StoreFull<A> {
    /// The setting, checked.
    ///
    /// # Errors
    /// A status that is not 4xx or 5xx (field `store_full.status`).
    pub fn checked(self) -> Result<Self, ConfigError> {
        if (400..=599).contains(&self.status) {
            Ok(self)
        } else {
            Err(ConfigError::new(
                "store_full.status",
                "must be a 4xx or 5xx status code",
            ))
        }
    }
}

/// How long a worker holds a zone's key-creation lease (ms). A worker stalled longer than this
/// between taking the lease and releasing it can lose it to another worker.
pub const CREATION_LEASE_MS: u64 = 2_000;

/// How long [`create_once`] keeps trying, past its `attempts`, while another worker holds the
/// lease within its time (ms). The holder needs three host calls to create a key and release
/// the lease, but the system may deschedule it in between (a loaded machine: several ms); a
/// waiter that gave up after its attempts alone, a fraction of a millisecond, booked spend to the
/// overflow record instead of the tenant's. Well under the 100 ms a guest call may run in the
/// nginx host (`GuestLimits::call_deadline`), and in all, not per key: every creation that one
/// [`LeaseWait`] serves (a rule's limits, a booking) shares the one deadline.
pub const LEASE_WAIT_MS: u64 = 50;

/// The deadline of the waits for a creation lease that one caller's creations share
/// ([`KeySpace::wait`]): set at the first wait, [`LEASE_WAIT_MS`] ahead on the store's clock. A rule
/// of many limits creating fresh client keys (under a client's control) while another worker
/// holds the lease waits [`LEASE_WAIT_MS`] in all, not that long for each key, which would
/// outlast the guest call's deadline.
#[derive(Debug, Default)]
pub struct LeaseWait(std::cell::Cell<Option<u64>>);

/// How far another worker's clock may run ahead of ours (ms): a lease ending further ahead than
/// one lease plus this is stale (a clock was set back) and is taken over.
pub const CLOCK_TOLERANCE_MS: u64 = 1_000;

/// Length of an encoded [`CreationRecord`] (bytes).
pub const ZONE_BYTES: usize = 18;

const TAG_ZONE: u8 = 16;

/// A creation record: how many keys the zone has created, its key-creation lease, and whether the
/// store has refused a new key. One per zone (e.g. `ratelimit/<zone>/~zone`,
/// `cost/<ledger>/~zone`). Bytes: tag 16, keys (u64 LE), lease end in Unix ms (u64 LE; 0 when
/// free), flags (bit 0: the store refused a key; bit 1: the lease holder has not released it
/// yet): [`ZONE_BYTES`] in all. A record of another length (an older layout) does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreationRecord {
    /// Keys created so far (only the counted ones, see [`create_once`]).
    pub keys: u64,
    /// The creation lease is held until this Unix time (ms); 0 when free.
    pub locked_until_ms: u64,
    /// The store refused to write a new key (an nginx zone declared `eviction=none` is full).
    /// Sticky: such a zone frees nothing until nginx restarts, so later creations are refused
    /// at once, by every worker alike, instead of each one trying (see [`create_once`]).
    pub store_full: bool,
    /// Set with the lease, cleared when its holder releases it: a record whose lease ran out
    /// with this still set was left by a holder that never came back from writing its key.
    /// Kong's ngx_wasm_module traps the guest (`proxy_set_shared_data` answers a host trap,
    /// not a status) when a zone declared `eviction=none` is full, so that holder died on a
    /// full store: later creations take it as [`CreationRecord::store_full`] (see [`create_once`]).
    pub pending: bool,
}

impl CreationRecord {
    /// Encodes the record.
    pub fn encode(&self) -> [u8; ZONE_BYTES] {
        let mut out = [0u8; ZONE_BYTES];
        let (tag, rest) = out.split_at_mut(1);
        let (keys, rest) = rest.split_at_mut(8);
        let (lease, flags) = rest.split_at_mut(8);
        tag.copy_from_slice(&[TAG_ZONE]);
        keys.copy_from_slice(&self.keys.to_le_bytes());
        lease.copy_from_slice(&self.locked_until_ms.to_le_bytes());
        flags.copy_from_slice(&[u8::from(self.store_full) | (u8::from(self.pending) << 1)]);
        out
    }

    /// Decodes a record; `None` if the bytes are not one.
    pub fn decode(bytes: &[u8]) -> Option<CreationRecord> {
        if bytes.len() != ZONE_BYTES || bytes.first() != Some(&TAG_ZONE) {
            return None;
        }
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
            ))
        };
        let flags = *bytes.get(17)?;
        if flags > 3 {
            return None;
        }
        let (store_full, pending) = (flags & 1 != 0, flags & 2 != 0);
        Some(CreationRecord {
            keys: u64_at(1)?,
            locked_until_ms: u64_at(9)?,
            store_full,
            pending,
        })
    }
}

/// Creates `key` with `value` if it is missing (root contexts call this in `on_configure`,
/// before their worker serves requests, for the records and shared buckets that must exist
/// before the store can fill up). Returns whether this call wrote it.
///
/// # Errors
/// The store's error when it could neither read the key nor write it (e.g. an nginx zone
/// already full): the caller logs it; its filter then runs with the key missing.
pub fn ensure_key<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    value: &[u8],
) -> Result<bool, StoreError> {
    if store.get(key)?.0.is_some() {
        return Ok(false);
    }
    match store.set(key, value, None) {
        Ok(()) => Ok(true),
        // Another worker created it meanwhile (ngx_wasm_module's rule for a write without CAS).
        Err(StoreError::CasMismatch) => Ok(false),
        Err(e) => Err(e),
    }
}

/// [`ensure_key`] for a creation record (a free lease, no key counted).
///
/// # Errors
/// See [`ensure_key`].
pub fn ensure_creation_record<S: SharedStore + ?Sized>(
    store: &S,
    record_key: &str,
) -> Result<bool, StoreError> {
    ensure_key(store, record_key, &CreationRecord::default().encode())
}

/// The outcome of [`create_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The key exists now (created by this call or by another worker).
    Ready,
    /// The key space already holds `max_keys` counted keys: nothing was created.
    SpaceFull,
    /// The store refused to write the key (this host status: an nginx zone full with
    /// `eviction=none`, or a value too large): nothing was created and the lease was released.
    StoreFull(u32),
}

/// Where [`create_once`] creates keys: the creation record's key, the bound on counted keys, and
/// how many tries a call may make (CAS mismatches and held leases each cost one).
#[derive(Debug, Clone, Copy)]
pub struct KeySpace<'a> {
    /// Shared-data key of the [`CreationRecord`].
    pub key: &'a str,
    /// Largest number of counted keys.
    pub max_keys: u64,
    /// Tries before giving up (at least one).
    pub attempts: u32,
    /// The deadline shared with the caller's other creations (one request's, one booking's).
    pub wait: &'a LeaseWait,
}

/// What a [`create_once`] call did, for the caller's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Creation {
    /// CAS mismatches and held leases met.
    pub cas_retries: u32,
    /// This call wrote the key.
    pub created: bool,
    /// The lease was taken over before this call released it (the bound documented below).
    pub lock_lost: bool,
}

/// Why [`create_once`] created nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// The tries ran out (another worker held the lease); the key may exist by then.
    Contended,
    /// The creation record could not be read or written: this host status.
    Failed(u32),
}

/// Creates `key` with `initial` exactly once across workers, under the zone's creation lease:
/// take the lease with a CAS write of the creation record, re-read `key`, write it only if still
/// missing, release the lease with CAS while counting the key (when `counted`). This is how a
/// filter creates keys without Envoy's unconditional first insert losing updates: two workers
/// that both saw the key missing cannot both write it while the lease holds.
///
/// A write of `key` that the store refuses ([`StoreError::Failed`]) releases the lease without
/// counting, marks the creation record [`CreationRecord::store_full`] and returns
/// [`Created::StoreFull`]: a full store never leaves the lease held (it would block every other
/// creation for [`CREATION_LEASE_MS`]). Once marked, every later call returns
/// `Created::StoreFull(`[`status::INTERNAL_FAILURE`]`)` (what the nginx host answers for a full
/// zone) without taking the lease: the answer no longer
/// depends on which worker asks, or on whether it met the lease held (a worker that gave up
/// waiting for the lease cannot tell a full store from a busy one, and would let a request
/// through that the store would have refused).
///
/// Bound: a worker stalled for more than [`CREATION_LEASE_MS`] between taking the lease and
/// writing can lose the lease to another worker, which may then create the same key first; the
/// later write replaces it once (`lock_lost` is set). Under ngx_wasm_module's semantics the
/// second write is a mismatch instead.
///
/// # Errors
/// [`CreateError::Contended`] after `attempts` failed tries, and, while another worker holds
/// the lease within its time, once `zone.wait`'s deadline ([`LeaseWait`], [`LEASE_WAIT_MS`]
/// after the caller's first wait) has passed (the key may exist by then: re-read it); [`CreateError::Failed`] when the creation record cannot be read, created or
/// locked.
pub fn create_once<S: SharedStore + ?Sized>(
    store: &S,
    zone: &KeySpace<'_>,
    key: &str,
    initial: &[u8],
    counted: bool,
    now_ms: u64,
) -> (Result<Created, CreateError>, Creation) {
    let (record_key, max_keys, attempts, wait) =
        (zone.key, zone.max_keys, zone.attempts, zone.wait);
    let mut out = Creation::default();
    let mut failures = 0u32;
    let failed = |e: StoreError| CreateError::Failed(code(e));
    // Past the attempts, while a live holder keeps the lease: until `zone.wait`'s deadline.
    let mut waiting = false;
    // One more turn for creating a missing creation record; the waiting turns beyond.
    let mut turns = 0u32;
    while turns <= attempts || waiting {
        turns = turns.saturating_add(1);
        let (value, zone_cas) = match store.get(record_key) {
            Ok(read) => read,
            Err(e) => return (Err(failed(e)), out),
        };
        let Some(value) = value else {
            if let Err(e) = ensure_creation_record(store, record_key) {
                return (Err(failed(e)), out);
            }
            continue;
        };
        let zone = CreationRecord::decode(&value).unwrap_or_default();
        if zone.store_full {
            return (Ok(Created::StoreFull(status::INTERNAL_FAILURE)), out);
        }
        if counted && zone.keys >= max_keys {
            return (Ok(Created::SpaceFull), out);
        }
        let lease_end = now_ms.saturating_add(CREATION_LEASE_MS);
        let stale_after = lease_end.saturating_add(CLOCK_TOLERANCE_MS);
        let held = zone.locked_until_ms > now_ms && zone.locked_until_ms <= stale_after;
        if zone.pending && zone.locked_until_ms <= now_ms {
            // The holder took the lease and never released it: it died writing its key, which
            // Kong's module does to a guest on a full zone (a host trap). Taking the lease over
            // would only trap again after another lease of contention: the store is full.
            return (Ok(Created::StoreFull(status::INTERNAL_FAILURE)), out);
        }
        let locked = CreationRecord {
            keys: zone.keys,
            locked_until_ms: lease_end,
            store_full: false,
            pending: true,
        }
        .encode();
        let taken = !held && zone_cas.is_some() && {
            match store.set(record_key, &locked, zone_cas) {
                Ok(()) => true,
                Err(StoreError::CasMismatch) => false,
                Err(e) => return (Err(failed(e)), out),
            }
        };
        if !taken {
            out.cas_retries = out.cas_retries.saturating_add(1);
            failures = failures.saturating_add(1);
            if failures >= attempts {
                waiting = held && still_waiting(store, wait, failures);
                if !waiting {
                    return (Err(CreateError::Contended), out);
                }
            }
            continue;
        }
        // Lease held: check and create. A failed read counts as "exists" (nothing is written
        // over a key that may hold state) and is reported after the release.
        let mut result = Ok(Created::Ready);
        match store.get(key) {
            Ok((None, _)) => match store.set(key, initial, None) {
                Ok(()) => out.created = true,
                // Another worker's write met ours (only when the lease was lost).
                Err(StoreError::CasMismatch) => {}
                Err(StoreError::Failed(status)) => result = Ok(Created::StoreFull(status)),
            },
            Ok((Some(_), _)) => {}
            Err(e) => result = Err(failed(e)),
        }
        let keys = if out.created && counted {
            zone.keys.saturating_add(1)
        } else {
            zone.keys
        };
        let released = CreationRecord {
            keys,
            locked_until_ms: 0,
            store_full: matches!(result, Ok(Created::StoreFull(_))),
            pending: false,
        }
        .encode();
        let still_ours = match store.get(record_key) {
            Ok((now_value, release_cas)) if now_value.as_deref() == Some(&locked[..]) => {
                store.set(record_key, &released, release_cas).is_ok()
            }
            _ => false,
        };
        out.lock_lost = !still_ours;
        return (result, out);
    }
    (Err(CreateError::Contended), out)
}

/// Whether a creation that ran out of attempts while a live holder keeps the lease goes on
/// trying: until `wait`'s deadline (set now if this is the caller's first wait), the clock read
/// every 16th turn.
fn still_waiting<S: SharedStore + ?Sized>(store: &S, wait: &LeaseWait, failures: u32) -> bool {
    match wait.0.get() {
        None => {
            wait.0
                .set(Some(store.clock_ms().saturating_add(LEASE_WAIT_MS)));
            true
        }
        Some(_) if !failures.is_multiple_of(16) => true,
        Some(until) => store.clock_ms() < until,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zone "z" with no key yet and its creation lease held by another worker until 5,000 ms
    /// (`pending`: taken and not released).
    fn hold_lease(s: &MemoryStore, pending: bool) {
        let held = CreationRecord {
            keys: 0,
            locked_until_ms: 5_000,
            store_full: false,
            pending,
        };
        s.set("z", &held.encode(), None).unwrap();
    }

    /// A zone whose creations wait on their own (a deadline of their own each call).
    fn zone(max_keys: u64) -> KeySpace<'static> {
        KeySpace {
            key: "z",
            max_keys,
            attempts: 3,
            wait: Box::leak(Box::default()),
        }
    }

    #[test]
    fn zone_records_round_trip_and_refuse_other_bytes() {
        let z = CreationRecord {
            keys: 7,
            locked_until_ms: 99,
            store_full: true,
            pending: false,
        };
        assert_eq!(CreationRecord::decode(&z.encode()), Some(z));
        assert_eq!(z.encode()[17], 1);
        assert_eq!(
            CreationRecord::decode(&z.encode()[..17]),
            None,
            "the older layout"
        );
        let mut bad = z.encode();
        bad[0] = 1;
        assert_eq!(CreationRecord::decode(&bad), None);
        let mut bad = z.encode();
        bad[17] = 4;
        assert_eq!(CreationRecord::decode(&bad), None, "unknown flags");
        let pending = CreationRecord { pending: true, ..z };
        assert_eq!(pending.encode()[17], 3);
        assert_eq!(CreationRecord::decode(&pending.encode()), Some(pending));
    }

    /// A store whose clock advances one ms at each reading and which, at the `n`-th reading
    /// (`.2`), plays another worker that creates `k` and releases the lease.
    struct Ticking<'a>(&'a MemoryStore, std::cell::Cell<u64>, Option<u64>);

    impl SharedStore for Ticking<'_> {
        fn get(&self, key: &str) -> Result<Read, StoreError> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            self.0.set(key, value, cas)
        }
        fn clock_ms(&self) -> u64 {
            let now = self.1.get().saturating_add(1);
            self.1.set(now);
            if Some(now) == self.2 {
                self.0.set("k", b"theirs", None).unwrap();
                let free = CreationRecord {
                    keys: 1,
                    locked_until_ms: 0,
                    store_full: false,
                    pending: false,
                };
                let cas = self.0.get("z").unwrap().1;
                self.0.set("z", &free.encode(), cas).unwrap();
            }
            now
        }
    }

    /// The holder of the lease is descheduled longer than the waiter's attempts last (a loaded
    /// machine), then creates the key and releases the lease: the waiter, still trying, finds
    /// the key there (it used to give up after its attempts, and the ledger then booked to the
    /// overflow record instead of the tenant's).
    #[test]
    fn a_creation_waits_for_a_live_holder_that_is_slow() {
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let s = MemoryStore::new(semantics);
            hold_lease(&s, true);
            let ticking = Ticking(&s, std::cell::Cell::new(0), Some(LEASE_WAIT_MS / 2));
            let (r, c) = create_once(&ticking, &zone(9), "k", b"mine", true, 4_000);
            assert_eq!(r, Ok(Created::Ready), "{semantics:?}");
            assert!(!c.created && c.cas_retries > 3, "{c:?}");
            assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"theirs"[..]));
            let zone_now = CreationRecord::decode(&s.get("z").unwrap().0.unwrap()).unwrap();
            assert_eq!((zone_now.keys, zone_now.locked_until_ms), (1, 0));
        }
    }

    /// A client that makes one request create many fresh keys (a rule of 16 limits) while another
    /// worker holds the lease: the creations share one deadline, so the request waits
    /// LEASE_WAIT_MS in all, not that long for each key (16 of them would outlast the nginx
    /// host's 100 ms guest-call deadline).
    #[test]
    fn the_creations_of_one_caller_wait_for_a_held_lease_once_in_all() {
        let s = MemoryStore::new(Semantics::Envoy);
        hold_lease(&s, true);
        let ticking = Ticking(&s, std::cell::Cell::new(0), None);
        let wait = LeaseWait::default();
        let shared = KeySpace {
            wait: &wait,
            ..zone(9)
        };
        for i in 0..16 {
            let key = format!("k{i}");
            let (r, _) = create_once(&ticking, &shared, &key, b"i", true, 4_000);
            assert_eq!(r, Err(CreateError::Contended), "{key}");
        }
        // The first creation read the clock once a ms of its wait; each later one at most once
        // more (its 16th turn), past the shared deadline.
        let read = ticking.1.get();
        assert!(read > LEASE_WAIT_MS, "{read}");
        assert!(
            read <= LEASE_WAIT_MS + 1 + 15,
            "the clock read {read} times: waited per key"
        );
    }

    /// Kong's module answers a write to a full `eviction=none` zone with a host trap: the guest
    /// stops inside `set` while it holds the creation lease. Simulated by a store whose write of
    /// a new key panics (caught here as the host's trap ends the call).
    #[test]
    fn a_holder_that_died_writing_its_key_leaves_the_zone_refusing_new_keys() {
        struct Trapping<'a>(&'a MemoryStore);
        impl SharedStore for Trapping<'_> {
            fn get(&self, key: &str) -> Result<Read, StoreError> {
                self.0.get(key)
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
                if key != "z" && self.0.get(key)?.0.is_none() {
                    panic!("host trap: failed setting value to shm (could not write to slab)");
                }
                self.0.set(key, value, cas)
            }
        }
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let s = MemoryStore::new(semantics);
            ensure_creation_record(&s, "z").unwrap();
            let trapped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                create_once(&Trapping(&s), &zone(10), "k", b"init", true, 1_000)
            }));
            assert!(trapped.is_err());
            let left = CreationRecord::decode(&s.get("z").unwrap().0.unwrap()).unwrap();
            assert_eq!(
                left,
                CreationRecord {
                    keys: 0,
                    locked_until_ms: 1_000 + CREATION_LEASE_MS,
                    store_full: false,
                    pending: true,
                }
            );
            // Within the lease: a live holder looks the same, so the lease is contended.
            let (r, _) = create_once(&s, &zone(10), "k2", b"init", true, 1_500);
            assert_eq!(r, Err(CreateError::Contended), "{semantics:?}");
            // The lease ran out and was never released: the store is full, for every creator
            // from now on, and nobody takes the lease again (which would trap again).
            for now in [1_000 + CREATION_LEASE_MS, 60_000] {
                let (r, c) = create_once(&s, &zone(10), "k2", b"init", true, now);
                assert_eq!(
                    r,
                    Ok(Created::StoreFull(status::INTERNAL_FAILURE)),
                    "{semantics:?}"
                );
                assert!(!c.created);
            }
            assert_eq!(s.get("k2").unwrap().0, None);
            // A holder that was only slow releases the lease: pending cleared, creation resumes.
            let s = MemoryStore::new(semantics);
            ensure_creation_record(&s, "z").unwrap();
            let (r, c) = create_once(&s, &zone(10), "k", b"init", true, 1_000);
            assert_eq!((r, c.created), (Ok(Created::Ready), true));
            let z = CreationRecord::decode(&s.get("z").unwrap().0.unwrap()).unwrap();
            assert!(!z.pending && !z.store_full && z.locked_until_ms == 0);
        }
    }

    #[test]
    fn keys_are_created_once_and_counted_under_both_semantics() {
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let s = MemoryStore::new(semantics);
            assert_eq!(ensure_creation_record(&s, "z"), Ok(true));
            assert_eq!(ensure_creation_record(&s, "z"), Ok(false), "only once");
            let (r, c) = create_once(&s, &zone(10), "k", b"init", true, 1_000);
            assert_eq!(
                (r, c.created, c.lock_lost),
                (Ok(Created::Ready), true, false)
            );
            s.set("k", b"used", s.get("k").unwrap().1).unwrap();
            let (r, c) = create_once(&s, &zone(10), "k", b"init", true, 1_001);
            assert_eq!(
                (r, c.created),
                (Ok(Created::Ready), false),
                "an existing key is kept"
            );
            assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"used"[..]));
            let zone = CreationRecord::decode(&s.get("z").unwrap().0.unwrap()).unwrap();
            assert_eq!(
                zone,
                CreationRecord {
                    keys: 1,
                    locked_until_ms: 0,
                    store_full: false,
                    pending: false,
                },
                "{semantics:?}"
            );
        }
    }

    #[test]
    fn a_full_zone_and_a_held_lease_create_nothing() {
        let s = MemoryStore::new(Semantics::Envoy);
        s.set(
            "z",
            &CreationRecord {
                keys: 2,
                locked_until_ms: 0,
                store_full: false,
                pending: false,
            }
            .encode(),
            None,
        )
        .unwrap();
        assert_eq!(
            create_once(&s, &zone(2), "k", b"i", true, 0).0,
            Ok(Created::SpaceFull)
        );
        assert_eq!(
            create_once(&s, &zone(2), "k", b"i", false, 0).0,
            Ok(Created::Ready),
            "uncounted keys"
        );
        hold_lease(&s, false);
        // A live holder: tried past the attempts for LEASE_WAIT_MS of the store's clock (here
        // one ms per reading of it), then given up.
        let ticking = Ticking(&s, std::cell::Cell::new(0), None);
        let (r, c) = create_once(&ticking, &zone(9), "k2", b"i", true, 4_000);
        assert_eq!(r, Err(CreateError::Contended));
        assert!(
            ticking.1.get() > LEASE_WAIT_MS,
            "the clock ran past the wait"
        );
        // Every 16th turn reads the clock: 16 turns a ms here.
        assert_eq!(c.cas_retries, 16 * u32::try_from(LEASE_WAIT_MS).unwrap());
        assert!(s.get("k2").unwrap().0.is_none());
        // A lease ending further ahead than a lease plus the clock tolerance is stale.
        let stale = CreationRecord {
            keys: 0,
            locked_until_ms: 4_000 + CREATION_LEASE_MS + CLOCK_TOLERANCE_MS + 1,
            store_full: false,
            pending: false,
        };
        s.set("z", &stale.encode(), None).unwrap();
        assert_eq!(
            create_once(&s, &zone(9), "k2", b"i", true, 4_000).0,
            Ok(Created::Ready)
        );
    }

    #[test]
    fn a_store_that_cannot_write_the_key_releases_the_lease_and_counts_nothing() {
        for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
            let s = MemoryStore::new(semantics);
            ensure_creation_record(&s, "z").unwrap();
            s.set_capacity(Some(1));
            let (r, c) = create_once(&s, &zone(10), "k", b"init", true, 1_000);
            assert_eq!(r, Ok(Created::StoreFull(status::INTERNAL_FAILURE)));
            assert!(!c.created && !c.lock_lost);
            let z = CreationRecord::decode(&s.get("z").unwrap().0.unwrap()).unwrap();
            let marked = CreationRecord {
                store_full: true,
                ..CreationRecord::default()
            };
            assert_eq!(
                z, marked,
                "lease released, nothing counted, the zone marked full"
            );
            // Marked: every later creation is refused at once, without the lease, even while
            // another worker holds it (a worker that gave up waiting would not know).
            let held = CreationRecord {
                locked_until_ms: 1_500,
                ..marked
            };
            s.set("z", &held.encode(), s.get("z").unwrap().1).unwrap();
            let (r, c) = create_once(&s, &zone(10), "k2", b"init", true, 1_001);
            assert_eq!(r, Ok(Created::StoreFull(status::INTERNAL_FAILURE)));
            assert_eq!((c.cas_retries, c.created), (0, false));
            // Without the mark (another zone), room again: the very next creation goes through
            // (no lease left behind by the refusal).
            s.set_capacity(None);
            ensure_creation_record(&s, "fresh").unwrap();
            let fresh = KeySpace {
                key: "fresh",
                ..zone(10)
            };
            let (r, _) = create_once(&s, &fresh, "k", b"init", true, 1_001);
            assert_eq!(r, Ok(Created::Ready));
            // Reads that fail: an error, never a write over a key that may exist.
            s.set_failing_reads(true);
            let (r, _) = create_once(&s, &zone(10), "k3", b"init", true, 1_002);
            assert_eq!(r, Err(CreateError::Failed(status::INTERNAL_FAILURE)));
            assert_eq!(
                ensure_creation_record(&s, "y"),
                Err(StoreError::Failed(status::INTERNAL_FAILURE))
            );
        }
    }

    #[test]
    fn envoy_inserts_missing_keys_whatever_the_cas_and_overwrites_without_cas() {
        let s = MemoryStore::new(Semantics::Envoy);
        assert_eq!(s.get("k"), Ok((None, None)));
        s.set("k", b"a", Some(12345)).unwrap();
        let (v, cas) = s.get("k").unwrap();
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        let cas = cas.unwrap();
        assert_ne!(cas, 0);
        s.set("k", b"b", None).unwrap();
        assert_eq!(s.set("k", b"c", Some(cas)), Err(StoreError::CasMismatch));
        let (_, cas2) = s.get("k").unwrap();
        s.set("k", b"c", cas2).unwrap();
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"c"[..]));
        assert_eq!(s.ops().mismatches, 1);
    }

    #[test]
    fn ngx_refuses_blind_writes_to_existing_keys_and_cas_writes_to_missing_ones() {
        let s = MemoryStore::new(Semantics::NgxWasm);
        assert_eq!(s.set("k", b"a", Some(1)), Err(StoreError::CasMismatch));
        s.set("k", b"a", None).unwrap();
        assert_eq!(s.set("k", b"b", None), Err(StoreError::CasMismatch));
        let (_, cas) = s.get("k").unwrap();
        s.set("k", b"b", cas).unwrap();
        assert_eq!(s.set("k", b"c", cas), Err(StoreError::CasMismatch));
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn envoy_first_insert_race_loses_an_update() {
        // Two workers read the counter as missing, both write "1": one increment is lost.
        let s = MemoryStore::new(Semantics::Envoy);
        let (a, a_cas) = s.get("n").unwrap();
        let (b, b_cas) = s.get("n").unwrap();
        assert!(a.is_none() && b.is_none());
        s.set("n", b"1", a_cas).unwrap();
        s.set("n", b"1", b_cas).unwrap();
        assert_eq!(
            s.get("n").unwrap().0.as_deref(),
            Some(&b"1"[..]),
            "lost update"
        );
        // ngx_wasm_module refuses the second insert instead.
        let s = MemoryStore::new(Semantics::NgxWasm);
        s.set("n", b"1", None).unwrap();
        assert_eq!(s.set("n", b"1", None), Err(StoreError::CasMismatch));
    }

    #[test]
    fn cas_update_retries_then_gives_up() {
        let s = MemoryStore::new(Semantics::Envoy);
        s.set("n", &[0], None).unwrap();
        let inc =
            |v: Option<&[u8]>| Some(vec![v.and_then(|b| b.first()).copied().unwrap_or(0) + 1]);
        assert_eq!(cas_update(&s, "n", 3, inc), Ok(0));
        assert_eq!(s.get("n").unwrap().0, Some(vec![1]));
        // A writer that always interferes between the read and the write.
        struct Meddler<'a>(&'a MemoryStore);
        impl SharedStore for Meddler<'_> {
            fn get(&self, key: &str) -> Result<Read, StoreError> {
                let got = self.0.get(key);
                self.0.set(key, &[9], None).unwrap();
                got
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
                self.0.set(key, value, cas)
            }
        }
        assert_eq!(
            cas_update(&Meddler(&s), "n", 3, inc),
            Err(Contended {
                retries: 3,
                failed: None
            })
        );
        assert_eq!(cas_update(&s, "n", 1, |_| None), Ok(0), "nothing to write");
        s.set_failing_reads(true);
        assert_eq!(
            cas_update(&s, "n", 3, inc),
            Err(Contended {
                retries: 0,
                failed: Some(status::INTERNAL_FAILURE)
            })
        );
    }
}
