//! The geometry of a `shm_kv` zone: offsets of the header, allocator, stripe and block fields
//! (see the layout in `kv/mod.rs`), [`KvLayout`], the eviction policy and the errors.

pub(super) const LINE: usize = 64;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"TGSHMKV1");
/// Layout version; bump on any change of the layout below or of the keys' hash (2: SipHash-1-3).
pub(super) const VERSION: u32 = 2;
pub(super) const NIL: u32 = u32::MAX;
pub(super) const BUCKETS_PER_STRIPE: usize = 15;
/// Key+value bytes in an entry's head block.
pub(super) const HEAD_INLINE: usize = 32;
/// Key+value bytes in a continuation block.
pub(super) const CONT_DATA: usize = 60;
/// Smallest zone accepted (bytes).
pub const MIN_ZONE_BYTES: usize = 4096;
/// Stripes with entries sampled per eviction.
pub(super) const SAMPLE_STRIPES: usize = 8;
/// Evictions one set may perform before giving up with `NoSpace`.
pub(super) const MAX_EVICTIONS_PER_SET: u32 = 1024;

// Header (line 0).
pub(super) const H_MAGIC: usize = 0;
pub(super) const H_VERSION: usize = 8;
pub(super) const H_LINE: usize = 12;
pub(super) const H_ZONE_SIZE: usize = 16;
pub(super) const H_BLOCK: usize = 24;
pub(super) const H_NBLOCKS: usize = 28;
pub(super) const H_NSTRIPES: usize = 32;
pub(super) const H_BPS: usize = 36;
pub(super) const H_SEED0: usize = 40;
pub(super) const H_SEED1: usize = 48;
pub(super) const H_HEAD_INLINE: usize = 56;
pub(super) const H_CONT_DATA: usize = 60;
// Allocator line (line 1).
pub(super) const G_ALLOC_LOCK: usize = 64;
pub(super) const G_FREE_HEAD: usize = 68;
pub(super) const G_FREE_COUNT: usize = 72;
pub(super) const G_KEYS: usize = 76;
pub(super) const G_STEALS: usize = 80;
pub(super) const G_EVICTIONS: usize = 88;
pub(super) const STRIPES_OFF: usize = 128;
// Entry head block fields.
pub(super) const E_NEXT: usize = 0;
pub(super) const E_HASH: usize = 4;
pub(super) const E_CAS: usize = 8;
pub(super) const E_KLEN: usize = 12;
pub(super) const E_VLEN: usize = 16;
pub(super) const E_CONT: usize = 20;
pub(super) const E_STAMP: usize = 24;
pub(super) const E_DATA: usize = 32;
// Continuation and free blocks.
pub(super) const C_NEXT: usize = 0;
pub(super) const C_DATA: usize = 4;

/// What a full zone does (ngx_wasm_module's `eviction=` option of `shm_kv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// `eviction=none`: a set that does not fit fails with [`KvError::NoSpace`].
    None,
    /// `eviction=lru` (and `slru`, see the module documentation): approximate LRU by sampling.
    Lru,
}

/// An `eviction=` value this crate does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedEviction(pub String);

impl std::fmt::Display for UnsupportedEviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid eviction policy \"{}\" (expected lru, slru or none)",
            self.0
        )
    }
}

impl std::error::Error for UnsupportedEviction {}

impl Eviction {
    /// Parses the optional third argument of `shm_kv` (`eviction=lru|slru|none`), for `nginx -t`:
    /// what the zone does ([`EvictionPolicy::from_directive`], then
    /// [`EvictionPolicy::eviction`]).
    ///
    /// # Errors
    /// [`UnsupportedEviction`] for any other value (ngx_wasm_module rejects those too).
    pub fn from_directive(arg: Option<&str>) -> Result<Eviction, UnsupportedEviction> {
        EvictionPolicy::from_directive(arg).map(EvictionPolicy::eviction)
    }
}

/// The eviction policy a `shm_kv` zone was declared with, as the operator wrote it
/// (`eviction=`; absent: [`EvictionPolicy::Lru`]). [`Eviction`] is what the zone does about it:
/// `slru` runs as `lru` here (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// `eviction=none`: nothing is ever evicted; a full zone refuses new values.
    None,
    /// `eviction=lru`, or no `eviction=`: least recently used entries make room.
    Lru,
    /// `eviction=slru` (ngx_wasm_module's default): evicts like `lru` here.
    Slru,
}

impl EvictionPolicy {
    /// Parses the optional third argument of `shm_kv` (`eviction=lru|slru|none`). Absent:
    /// [`EvictionPolicy::Lru`], this host's default (the closest to ngx_wasm_module's, `slru`).
    ///
    /// # Errors
    /// [`UnsupportedEviction`] for any other value (ngx_wasm_module rejects those too).
    pub fn from_directive(arg: Option<&str>) -> Result<EvictionPolicy, UnsupportedEviction> {
        match arg {
            None | Some("eviction=lru") => Ok(EvictionPolicy::Lru),
            Some("eviction=slru") => Ok(EvictionPolicy::Slru),
            Some("eviction=none") => Ok(EvictionPolicy::None),
            Some(other) => Err(UnsupportedEviction(
                other.strip_prefix("eviction=").unwrap_or(other).to_string(),
            )),
        }
    }

    /// What a zone of this policy does when full.
    pub fn eviction(self) -> Eviction {
        match self {
            EvictionPolicy::None => Eviction::None,
            EvictionPolicy::Lru | EvictionPolicy::Slru => Eviction::Lru,
        }
    }

    /// The policy's name in the directive: `none`, `lru` or `slru`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionPolicy::None => "none",
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Slru => "slru",
        }
    }
}

/// Errors of [`KvZone`] and [`ZoneSet`] operations, each with the proxy-wasm status the host
/// adapter should report (after the arrow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvError {
    /// The key does not exist (get, delete) → `NotFound`.
    NotFound,
    /// The CAS token does not match (see the module documentation) → `CasMismatch`.
    CasMismatch,
    /// The zone has no room for the value, even after eviction (ngx_wasm_module traps the
    /// filter here, "could not write to slab"; Envoy never fails) → `InternalFailure`.
    NoSpace,
    /// Key and value together are larger than the whole zone (or than 4 GiB) → `BadArgument`.
    TooLarge,
    /// No zone for the key: no `NAME/` zone and no `*` zone (ngx_wasm_module traps the filter
    /// with "could not resolve namespace") → `NotFound` for get, `BadArgument` for set.
    NoZone,
    /// The zone's memory holds an impossible value (an offset out of range, a cycle): a worker
    /// probably died mid-write; the operation did nothing further → `InternalFailure`.
    Corrupt,
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            KvError::NotFound => "key not found",
            KvError::CasMismatch => "CAS mismatch",
            KvError::NoSpace => "shm_kv zone full",
            KvError::TooLarge => "key and value larger than the shm_kv zone",
            KvError::NoZone => "no shm_kv zone for the key's namespace and no \"*\" zone",
            KvError::Corrupt => "shm_kv zone corrupted",
        };
        f.write_str(s)
    }
}

impl std::error::Error for KvError {}

/// The block geometry of a zone of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// 64-byte blocks (the maximum number of keys, when each key+value fits in 32 bytes).
    pub blocks: u32,
    /// Stripes (lock + 15 buckets each).
    pub stripes: u32,
}

impl KvLayout {
    /// The layout of a zone of `len` bytes; `None` below [`MIN_ZONE_BYTES`].
    pub fn for_len(len: usize) -> Option<KvLayout> {
        if len < MIN_ZONE_BYTES {
            return None;
        }
        let usable = len.checked_sub(STRIPES_OFF)?;
        // N blocks need ceil(N/30) stripe lines: about 31 lines per 30 blocks.
        let estimate = usable.checked_div(LINE)?.checked_mul(30)?.checked_div(31)?;
        let stripes = estimate.div_ceil(30).max(1);
        let blocks = usable
            .checked_sub(stripes.checked_mul(LINE)?)?
            .checked_div(LINE)?
            .min(usize::try_from(NIL.saturating_sub(1)).ok()?);
        if blocks < 2 {
            return None;
        }
        Some(KvLayout {
            blocks: u32::try_from(blocks).ok()?,
            stripes: u32::try_from(stripes).ok()?,
        })
    }

    /// Blocks one entry with a `key_len`-byte key and a `value_len`-byte value takes.
    pub fn blocks_for(key_len: usize, value_len: usize) -> usize {
        let total = key_len.saturating_add(value_len);
        total
            .saturating_sub(HEAD_INLINE)
            .div_ceil(CONT_DATA)
            .saturating_add(1)
    }
}

/// Counters of a zone, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvStats {
    /// Total blocks.
    pub blocks: u32,
    /// Free blocks.
    pub free_blocks: u32,
    /// Keys stored.
    pub keys: u32,
    /// Entries evicted since the zone was initialised.
    pub evictions: u64,
    /// Locks taken over from dead owner processes.
    pub lock_takeovers: u32,
}
