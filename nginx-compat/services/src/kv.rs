//! `shm_kv` zones: proxy-wasm shared data (`proxy_get_shared_data`, `proxy_set_shared_data`) in
//! nginx shared memory, shared by every worker process, with ngx_wasm_module's semantics
//! (directive `shm_kv NAME SIZE [eviction=lru|slru|none]`, docs/DIRECTIVES.md; set logic
//! `ngx_wa_shm_kv_set_locked` in src/common/shm/ngx_wa_shm_kv.c).
//!
//! # CAS semantics (ngx_wasm_module's, stricter than Envoy's)
//! Every key carries a CAS token, a `u32` that starts at 1 when the key is created and grows by
//! one on every write (skipping 0 when it wraps: 0 means "no CAS" on the ABI). A write passes
//! `cas`:
//!
//! | key      | `cas`            | result                       |
//! |----------|------------------|------------------------------|
//! | missing  | 0                | created with token 1         |
//! | missing  | not 0            | [`KvError::CasMismatch`]     |
//! | existing | 0                | [`KvError::CasMismatch`]     |
//! | existing | its token        | written, token + 1           |
//! | existing | another token    | [`KvError::CasMismatch`]     |
//!
//! Envoy (proxy-wasm-cpp-host `SharedData::set`) differs: `cas` 0 overwrites an existing key and
//! a missing key is inserted whatever `cas` is. ngx_wasm_module's rules make "create if absent"
//! and every update atomic; filters written for both hosts read first and pass the token they
//! got (see `plugins/common/src/shared_data.rs`).
//!
//! # Layout (all offsets from the region's 64-byte-aligned base; every field little-endian
//! native `u32`/`u64` accessed atomically)
//! ```text
//! line 0   header: magic "TGSHMKV1", layout version, line size, zone size (bytes), block size,
//!          blocks, stripes, buckets per stripe, hash seeds, inline/continuation data sizes
//!          (the sentinel: attaching an existing zone whose header differs in any field is
//!          refused instead of reading the memory with the wrong layout)
//! line 1   allocator: lock word, free-list head, free count, key count, lock takeovers,
//!          evictions
//! stripes  S lines, one per stripe: lock word + 15 bucket heads (u32 block index, NIL = !0)
//! blocks   N lines of 64 bytes:
//!   entry head   next entry in bucket, hash tag, CAS, key length, value length, first
//!                continuation block, last access (ms of CLOCK_MONOTONIC_COARSE; kept only
//!                with eviction), 32 bytes of key+value
//!   continuation next block, 60 bytes of key+value
//!   free         next free block
//! ```
//! A key and its value are stored as one byte stream (key then value) across the entry head
//! (32 bytes) and as many chained continuation blocks as needed (60 bytes each), so any value
//! size up to the zone's capacity works (a 16 KiB JWKS takes about 275 blocks) and memory is never
//! fragmented: every free block fits every request. One block per cache line means two workers
//! updating different keys never write the same cache line except for their stripes' lock words
//! (one stripe = one line, 15 buckets).
//!
//! Sizing: `S = ceil(N / 30)` (on average half a bucket per block), so a zone of `L` bytes has
//! `N ≈ (L - 128) / 66.1` blocks: 64 KiB → 989 blocks, 1 MiB → 15 853. An entry whose key and
//! value together fit in 32 bytes takes one block (the maximum number of keys is `N`), 92 bytes
//! two, `32 + 60k` bytes `k + 1`. See [`KvLayout`].
//!
//! # Concurrency
//! One spinlock per stripe (see `lock.rs`: pid in the lock word, takeover from dead owners) and
//! one for the block allocator, always taken in the order stripe → allocator. Get and set are
//! O(1) expected: hash (SipHash with a per-zone random seed, so clients cannot aim keys at one
//! bucket), walk one bucket chain under the stripe lock. No lock covers the whole table; the
//! only walks across stripes (eviction sampling) hold one foreign stripe at a time and only with
//! `try_lock`, so they never wait on, or deadlock with, another worker.
//!
//! # When the zone is full
//! [`Eviction::None`]: the set fails with [`KvError::NoSpace`] and changes nothing. [`Eviction::Lru`]
//! evicts approximately least-recently-used entries (Redis-style sampling: the oldest "last
//! access" among the entries of up to 8 stripes, from a random start) until the new value fits
//! or 1024 entries were evicted. ngx_wasm_module's `slru` (one LRU queue per slab size class,
//! so that the evicted memory fits the new item) is accepted as [`Eviction::Lru`]: with a single
//! block size every eviction frees reusable memory, which is what slru approximates.

use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::lock::{lock, try_lock, Guard};
use crate::shm::SharedRegion;

const LINE: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"TGSHMKV1");
/// Layout version; bump on any change of the layout below.
const VERSION: u32 = 1;
const NIL: u32 = u32::MAX;
const BUCKETS_PER_STRIPE: usize = 15;
/// Key+value bytes in an entry's head block.
const HEAD_INLINE: usize = 32;
/// Key+value bytes in a continuation block.
const CONT_DATA: usize = 60;
/// Smallest zone accepted (bytes).
pub const MIN_ZONE_BYTES: usize = 4096;
/// Stripes with entries sampled per eviction.
const SAMPLE_STRIPES: usize = 8;
/// Evictions one set may perform before giving up with `NoSpace`.
const MAX_EVICTIONS_PER_SET: u32 = 1024;

// Header (line 0).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_LINE: usize = 12;
const H_ZONE_SIZE: usize = 16;
const H_BLOCK: usize = 24;
const H_NBLOCKS: usize = 28;
const H_NSTRIPES: usize = 32;
const H_BPS: usize = 36;
const H_SEED0: usize = 40;
const H_SEED1: usize = 48;
const H_HEAD_INLINE: usize = 56;
const H_CONT_DATA: usize = 60;
// Allocator line (line 1).
const G_ALLOC_LOCK: usize = 64;
const G_FREE_HEAD: usize = 68;
const G_FREE_COUNT: usize = 72;
const G_KEYS: usize = 76;
const G_STEALS: usize = 80;
const G_EVICTIONS: usize = 88;
const STRIPES_OFF: usize = 128;
// Entry head block fields.
const E_NEXT: usize = 0;
const E_HASH: usize = 4;
const E_CAS: usize = 8;
const E_KLEN: usize = 12;
const E_VLEN: usize = 16;
const E_CONT: usize = 20;
const E_STAMP: usize = 24;
const E_DATA: usize = 32;
// Continuation and free blocks.
const C_NEXT: usize = 0;
const C_DATA: usize = 4;

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
    /// Parses the optional third argument of `shm_kv` (`eviction=lru|slru|none`), for `nginx -t`.
    /// Absent: [`Eviction::Lru`], the closest to ngx_wasm_module's default (`slru`).
    ///
    /// # Errors
    /// [`UnsupportedEviction`] for any other value (ngx_wasm_module rejects those too).
    pub fn from_directive(arg: Option<&str>) -> Result<Eviction, UnsupportedEviction> {
        match arg {
            None => Ok(Eviction::Lru),
            Some("eviction=lru") | Some("eviction=slru") => Ok(Eviction::Lru),
            Some("eviction=none") => Ok(Eviction::None),
            Some(other) => Err(UnsupportedEviction(
                other.strip_prefix("eviction=").unwrap_or(other).to_string(),
            )),
        }
    }
}

/// Whether nginx gave a new zone or one that already holds data (reused across a reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Initialise the zone (erases whatever the memory held).
    Fresh,
    /// Check the header sentinel and use the data in place.
    Existing,
}

/// Why a zone could not be attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// The region is smaller than the minimum (bytes).
    TooSmall {
        /// Region length.
        len: usize,
        /// Minimum for this kind of zone.
        min: usize,
    },
    /// [`Init::Existing`] on memory that holds no zone of this kind (wrong magic).
    NotInitialized,
    /// [`Init::Existing`] on a zone written with another layout (version, size, counts): the
    /// header field that differs, what this build expects and what the zone holds.
    Mismatch {
        /// Header field.
        field: &'static str,
        /// Value this build computes.
        expected: u64,
        /// Value in the zone.
        found: u64,
    },
    /// A worker index beyond the number of worker slices (metrics zones).
    WorkerOutOfRange {
        /// The index given.
        worker: u32,
        /// Worker slices in the zone.
        workers: u32,
    },
    /// Invalid layout parameters (metrics zones): which one.
    BadLayout(&'static str),
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::TooSmall { len, min } => {
                write!(
                    f,
                    "shared zone of {len} bytes is too small (minimum {min} bytes)"
                )
            }
            AttachError::NotInitialized => write!(f, "shared zone holds no data of this kind"),
            AttachError::Mismatch {
                field,
                expected,
                found,
            } => write!(
                f,
                "shared zone layout mismatch: {field} is {found}, this build expects {expected}"
            ),
            AttachError::WorkerOutOfRange { worker, workers } => {
                write!(
                    f,
                    "worker index {worker} out of range ({workers} worker slices)"
                )
            }
            AttachError::BadLayout(what) => write!(f, "invalid shared zone layout: {what}"),
        }
    }
}

impl std::error::Error for AttachError {}

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

/// One `shm_kv` zone attached in this process. Cheap to clone; `Send + Sync` (all state is in
/// the shared region, behind its locks).
#[derive(Debug)]
pub struct KvZone {
    region: SharedRegion,
    name: String,
    eviction: Eviction,
    layout: KvLayout,
    blocks_off: usize,
    seeds: (u64, u64),
    rng: AtomicU64,
}

impl Clone for KvZone {
    fn clone(&self) -> Self {
        KvZone {
            region: self.region.clone(),
            name: self.name.clone(),
            eviction: self.eviction,
            layout: self.layout,
            blocks_off: self.blocks_off,
            seeds: self.seeds,
            rng: AtomicU64::new(self.rng.load(Ordering::Relaxed) ^ 0x9e37_79b9_7f4a_7c15),
        }
    }
}

fn random_u64(salt: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.finish()
}

fn now_ms() -> u64 {
    crate::shm::coarse_now_ms()
}

impl KvZone {
    /// Attaches the zone `name` in `region` (the whole region: nginx's zone address and size).
    ///
    /// With [`Init::Fresh`] the region is formatted (O(blocks) writes: do it once, in the nginx
    /// master's zone `init`, before workers fork). With [`Init::Existing`] the header written by
    /// a previous `Fresh` attach must match this build's layout for this region size exactly.
    ///
    /// # Errors
    /// [`AttachError::TooSmall`] below [`MIN_ZONE_BYTES`]; for `Existing`,
    /// [`AttachError::NotInitialized`] or [`AttachError::Mismatch`] (the size/version sentinel).
    pub fn attach(
        region: SharedRegion,
        name: &str,
        init: Init,
        eviction: Eviction,
    ) -> Result<KvZone, AttachError> {
        let len = region.len();
        let layout = KvLayout::for_len(len).ok_or(AttachError::TooSmall {
            len,
            min: MIN_ZONE_BYTES,
        })?;
        let blocks_off = usize::try_from(layout.stripes)
            .ok()
            .and_then(|s| s.checked_mul(LINE))
            .and_then(|s| s.checked_add(STRIPES_OFF))
            .ok_or(AttachError::BadLayout("stripes"))?;
        let mut zone = KvZone {
            region,
            name: name.to_string(),
            eviction,
            layout,
            blocks_off,
            seeds: (0, 0),
            rng: AtomicU64::new(random_u64(3) | 1),
        };
        match init {
            Init::Fresh => zone
                .format()
                .map_err(|_| AttachError::BadLayout("format"))?,
            Init::Existing => zone.verify()?,
        }
        Ok(zone)
    }

    /// The zone's name (the `NAME` of `shm_kv NAME SIZE`; `*` for the default zone).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zone's geometry.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The eviction policy this process applies.
    pub fn eviction(&self) -> Eviction {
        self.eviction
    }

    fn header_values(&self) -> [crate::header::Field; 9] {
        // (field, offset, expected value, is u64)
        [
            ("layout version", H_VERSION, u64::from(VERSION), false),
            ("line size", H_LINE, LINE as u64, false),
            ("zone size", H_ZONE_SIZE, self.region.len() as u64, true),
            ("block size", H_BLOCK, LINE as u64, false),
            ("blocks", H_NBLOCKS, u64::from(self.layout.blocks), false),
            ("stripes", H_NSTRIPES, u64::from(self.layout.stripes), false),
            (
                "buckets per stripe",
                H_BPS,
                BUCKETS_PER_STRIPE as u64,
                false,
            ),
            ("inline bytes", H_HEAD_INLINE, HEAD_INLINE as u64, false),
            ("continuation bytes", H_CONT_DATA, CONT_DATA as u64, false),
        ]
    }

    fn format(&mut self) -> Result<(), KvError> {
        let r = &self.region;
        self.f64(H_MAGIC)?.store(0, Ordering::Release);
        if !r.zero(0, self.blocks_off) {
            return Err(KvError::Corrupt);
        }
        for s in 0..self.layout.stripes as usize {
            let off = self.stripe_off(s)?;
            self.f32(off)?.store(0, Ordering::Relaxed);
            for b in 0..BUCKETS_PER_STRIPE {
                self.f32(off.saturating_add(4).saturating_add(b.saturating_mul(4)))?
                    .store(NIL, Ordering::Relaxed);
            }
        }
        let n = self.layout.blocks;
        for i in 0..n {
            let next = if i.saturating_add(1) == n {
                NIL
            } else {
                i.saturating_add(1)
            };
            self.put(i, C_NEXT, next)?;
        }
        self.f32(G_FREE_HEAD)?.store(0, Ordering::Relaxed);
        self.f32(G_FREE_COUNT)?.store(n, Ordering::Relaxed);
        let seeds = (random_u64(1), random_u64(2));
        self.f64(H_SEED0)?.store(seeds.0, Ordering::Relaxed);
        self.f64(H_SEED1)?.store(seeds.1, Ordering::Relaxed);
        self.seeds = seeds;
        if !crate::header::publish(&self.region, H_MAGIC, MAGIC, &self.header_values()) {
            return Err(KvError::Corrupt);
        }
        Ok(())
    }

    fn verify(&mut self) -> Result<(), AttachError> {
        crate::header::verify(&self.region, H_MAGIC, MAGIC, &self.header_values())?;
        let s0 = self
            .region
            .u64_at(H_SEED0)
            .map(|a| a.load(Ordering::Relaxed));
        let s1 = self
            .region
            .u64_at(H_SEED1)
            .map(|a| a.load(Ordering::Relaxed));
        self.seeds = (s0.unwrap_or(0), s1.unwrap_or(0));
        Ok(())
    }

    // ---- raw field access --------------------------------------------------------------

    fn f32(&self, off: usize) -> Result<&AtomicU32, KvError> {
        self.region.u32_at(off).ok_or(KvError::Corrupt)
    }

    fn f64(&self, off: usize) -> Result<&AtomicU64, KvError> {
        self.region.u64_at(off).ok_or(KvError::Corrupt)
    }

    fn stripe_off(&self, stripe: usize) -> Result<usize, KvError> {
        stripe
            .checked_mul(LINE)
            .and_then(|o| o.checked_add(STRIPES_OFF))
            .ok_or(KvError::Corrupt)
    }

    fn block_off(&self, block: u32) -> Result<usize, KvError> {
        if block >= self.layout.blocks {
            return Err(KvError::Corrupt);
        }
        (block as usize)
            .checked_mul(LINE)
            .and_then(|o| o.checked_add(self.blocks_off))
            .ok_or(KvError::Corrupt)
    }

    fn fld(&self, block: u32, field: usize) -> Result<u32, KvError> {
        let off = self.block_off(block)?.saturating_add(field);
        Ok(self.f32(off)?.load(Ordering::Relaxed))
    }

    fn put(&self, block: u32, field: usize, value: u32) -> Result<(), KvError> {
        let off = self.block_off(block)?.saturating_add(field);
        self.f32(off)?.store(value, Ordering::Relaxed);
        Ok(())
    }

    fn stamp(&self, block: u32) -> Result<&AtomicU64, KvError> {
        self.f64(self.block_off(block)?.saturating_add(E_STAMP))
    }

    /// The "last access" stamp of a new entry (0 without eviction: nothing reads it).
    fn stamp_now(&self) -> u64 {
        match self.eviction {
            Eviction::Lru => now_ms(),
            Eviction::None => 0,
        }
    }

    fn steals(&self) -> Option<&AtomicU32> {
        self.region.u32_at(G_STEALS)
    }

    // ---- hashing and buckets -----------------------------------------------------------

    /// (stripe, offset of the bucket head word, hash tag)
    fn locate(&self, key: &[u8]) -> Result<(usize, usize, u32), KvError> {
        #[allow(deprecated)] // SipHash-2-4 with explicit keys; std offers no other keyed hasher
        let mut h = std::hash::SipHasher::new_with_keys(self.seeds.0, self.seeds.1);
        h.write(key);
        let hash = h.finish();
        let buckets = (self.layout.stripes as usize).saturating_mul(BUCKETS_PER_STRIPE);
        let bucket = usize::try_from(hash >> 32)
            .ok()
            .and_then(|b| b.checked_rem(buckets))
            .ok_or(KvError::Corrupt)?;
        let stripe = bucket / BUCKETS_PER_STRIPE;
        let slot = bucket % BUCKETS_PER_STRIPE;
        let head = self
            .stripe_off(stripe)?
            .saturating_add(4)
            .saturating_add(slot.saturating_mul(4));
        Ok((stripe, head, hash as u32))
    }

    fn lock_stripe(&self, stripe: usize) -> Result<Guard<'_>, KvError> {
        Ok(lock(self.f32(self.stripe_off(stripe)?)?, self.steals()))
    }

    // ---- key/value byte stream ---------------------------------------------------------

    /// Calls `f(region offset, range of the caller's buffer)` for each piece of the entry's
    /// byte stream `start..start+len`.
    fn segments(
        &self,
        head: u32,
        start: usize,
        len: usize,
        mut f: impl FnMut(usize, Range<usize>) -> bool,
    ) -> Result<(), KvError> {
        let mut block = head;
        let mut data_off = self.block_off(head)?.saturating_add(E_DATA);
        let mut cap = HEAD_INLINE;
        let mut pos = 0usize;
        let mut done = 0usize;
        let mut hops = 0u32;
        while done < len {
            let want = start.saturating_add(done);
            let block_end = pos.saturating_add(cap);
            if want < block_end {
                let within = want.saturating_sub(pos);
                let n = cap.saturating_sub(within).min(len.saturating_sub(done));
                let end = done.saturating_add(n);
                if !f(data_off.saturating_add(within), done..end) {
                    return Err(KvError::Corrupt);
                }
                done = end;
                if done >= len {
                    break;
                }
            }
            let next = if block == head {
                self.fld(head, E_CONT)?
            } else {
                self.fld(block, C_NEXT)?
            };
            hops = hops.saturating_add(1);
            if next == NIL || hops > self.layout.blocks {
                return Err(KvError::Corrupt);
            }
            block = next;
            data_off = self.block_off(next)?.saturating_add(C_DATA);
            pos = block_end;
            cap = CONT_DATA;
        }
        Ok(())
    }

    fn read_stream(&self, head: u32, start: usize, dst: &mut [u8]) -> Result<(), KvError> {
        let len = dst.len();
        self.segments(head, start, len, |off, range| {
            dst.get_mut(range).is_some_and(|d| self.region.read(off, d))
        })
    }

    fn write_stream(&self, head: u32, start: usize, src: &[u8]) -> Result<(), KvError> {
        self.segments(head, start, src.len(), |off, range| {
            src.get(range).is_some_and(|s| self.region.write(off, s))
        })
    }

    fn key_matches(&self, entry: u32, tag: u32, key: &[u8]) -> Result<bool, KvError> {
        if self.fld(entry, E_HASH)? != tag || self.fld(entry, E_KLEN)? as usize != key.len() {
            return Ok(false);
        }
        // Compare piece by piece through a stack buffer (no allocation on the hot path).
        let mut equal = true;
        let mut piece = [0u8; CONT_DATA];
        self.segments(entry, 0, key.len(), |off, range| {
            let n = range.len();
            let (Some(dst), Some(want)) = (piece.get_mut(..n), key.get(range)) else {
                return false;
            };
            if !self.region.read(off, dst) {
                return false;
            }
            equal = equal && dst == want;
            true
        })?;
        Ok(equal)
    }

    /// The entry holding `key` in the chain at `head_off`, with its predecessor (`None`: the
    /// entry is first). The stripe lock is held by the caller.
    fn find(
        &self,
        head_off: usize,
        tag: u32,
        key: &[u8],
    ) -> Result<Option<(Option<u32>, u32)>, KvError> {
        let mut prev = None;
        let mut cur = self.f32(head_off)?.load(Ordering::Relaxed);
        let mut steps = 0u32;
        while cur != NIL {
            steps = steps.saturating_add(1);
            if steps > self.layout.blocks {
                return Err(KvError::Corrupt);
            }
            if self.key_matches(cur, tag, key)? {
                return Ok(Some((prev, cur)));
            }
            prev = Some(cur);
            cur = self.fld(cur, E_NEXT)?;
        }
        Ok(None)
    }

    // ---- block allocator ---------------------------------------------------------------

    /// Pops `n` blocks (already chained through their first word) from the free list; `None`
    /// when fewer than `n` are free.
    fn alloc_chain(&self, n: u32) -> Result<Option<u32>, KvError> {
        let _g = lock(self.f32(G_ALLOC_LOCK)?, self.steals());
        let free = self.f32(G_FREE_COUNT)?.load(Ordering::Relaxed);
        if free < n || n == 0 {
            return Ok(None);
        }
        let first = self.f32(G_FREE_HEAD)?.load(Ordering::Relaxed);
        let mut last = first;
        for _ in 1..n {
            last = self.fld(last, C_NEXT)?;
            if last == NIL {
                return Err(KvError::Corrupt);
            }
        }
        let rest = self.fld(last, C_NEXT)?;
        self.put(last, C_NEXT, NIL)?;
        self.f32(G_FREE_HEAD)?.store(rest, Ordering::Relaxed);
        self.f32(G_FREE_COUNT)?
            .store(free.saturating_sub(n), Ordering::Relaxed);
        Ok(Some(first))
    }

    /// Returns a chain of blocks linked through their first word (`first`..NIL) to the free
    /// list.
    fn free_chain(&self, first: u32) -> Result<(), KvError> {
        if first == NIL {
            return Ok(());
        }
        let mut last = first;
        let mut n = 1u32;
        loop {
            let next = self.fld(last, C_NEXT)?;
            if next == NIL {
                break;
            }
            n = n.saturating_add(1);
            if n > self.layout.blocks {
                return Err(KvError::Corrupt);
            }
            last = next;
        }
        let _g = lock(self.f32(G_ALLOC_LOCK)?, self.steals());
        let head = self.f32(G_FREE_HEAD)?;
        self.put(last, C_NEXT, head.load(Ordering::Relaxed))?;
        head.store(first, Ordering::Relaxed);
        let count = self.f32(G_FREE_COUNT)?;
        count.store(
            count.load(Ordering::Relaxed).saturating_add(n),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Frees an unlinked entry (head and continuation blocks).
    fn free_entry(&self, entry: u32) -> Result<(), KvError> {
        let cont = self.fld(entry, E_CONT)?;
        self.put(entry, C_NEXT, cont)?;
        self.free_chain(entry)
    }

    fn alloc(&self, n: usize, own_stripe: usize, exclude: Option<u32>) -> Result<u32, KvError> {
        let n = u32::try_from(n).map_err(|_| KvError::TooLarge)?;
        if n > self.layout.blocks {
            return Err(KvError::TooLarge);
        }
        let mut evictions = 0u32;
        loop {
            if let Some(first) = self.alloc_chain(n)? {
                return Ok(first);
            }
            if self.eviction == Eviction::None || evictions >= MAX_EVICTIONS_PER_SET {
                return Err(KvError::NoSpace);
            }
            evictions = evictions.saturating_add(1);
            if !self.evict_one(own_stripe, exclude)? {
                return Err(KvError::NoSpace);
            }
        }
    }

    fn next_random(&self) -> u64 {
        // xorshift64; per-handle state, no shared writes.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Evicts the least recently used entry among a sample of stripes. `own_stripe` is locked
    /// by the caller; `exclude` is the entry being updated. False when nothing can be evicted.
    fn evict_one(&self, own_stripe: usize, exclude: Option<u32>) -> Result<bool, KvError> {
        let stripes = self.layout.stripes as usize;
        let start = usize::try_from(self.next_random())
            .ok()
            .and_then(|r| r.checked_rem(stripes))
            .unwrap_or(0);
        let mut best: Option<(usize, u32, u64)> = None;
        let mut sampled = 0usize;
        for i in 0..stripes {
            let s = start.saturating_add(i).checked_rem(stripes).unwrap_or(0);
            let _g = if s == own_stripe {
                None
            } else {
                match try_lock(self.f32(self.stripe_off(s)?)?) {
                    Some(g) => Some(g),
                    None => continue,
                }
            };
            let mut any = false;
            self.for_each_entry(s, |_, entry| {
                if Some(entry) != exclude {
                    any = true;
                    let stamp = self.stamp(entry)?.load(Ordering::Relaxed);
                    if best.is_none_or(|(_, _, b)| stamp < b) {
                        best = Some((s, entry, stamp));
                    }
                }
                Ok(true)
            })?;
            if any {
                sampled = sampled.saturating_add(1);
                if sampled >= SAMPLE_STRIPES {
                    break;
                }
            }
        }
        let Some((s, victim, stamp)) = best else {
            return Ok(false);
        };
        let _g = if s == own_stripe {
            None
        } else {
            match try_lock(self.f32(self.stripe_off(s)?)?) {
                Some(g) => Some(g),
                None => return Ok(true), // busy now: sample again
            }
        };
        let mut unlinked = false;
        self.for_each_entry(s, |(head_off, prev), entry| {
            if entry != victim {
                return Ok(true);
            }
            if self.stamp(entry)?.load(Ordering::Relaxed) == stamp {
                self.unlink(head_off, prev, entry)?;
                unlinked = true;
            }
            Ok(false)
        })?;
        if unlinked {
            self.free_entry(victim)?;
            self.f32(G_KEYS)?.fetch_sub(1, Ordering::Relaxed);
            self.f64(G_EVICTIONS)?.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Calls `f((bucket head offset, predecessor), entry)` for every entry of a stripe (lock
    /// held by the caller) until `f` returns false.
    fn for_each_entry(
        &self,
        stripe: usize,
        mut f: impl FnMut((usize, Option<u32>), u32) -> Result<bool, KvError>,
    ) -> Result<(), KvError> {
        let base = self.stripe_off(stripe)?;
        for b in 0..BUCKETS_PER_STRIPE {
            let head_off = base.saturating_add(4).saturating_add(b.saturating_mul(4));
            let mut prev = None;
            let mut cur = self.f32(head_off)?.load(Ordering::Relaxed);
            let mut steps = 0u32;
            while cur != NIL {
                steps = steps.saturating_add(1);
                if steps > self.layout.blocks {
                    return Err(KvError::Corrupt);
                }
                let next = self.fld(cur, E_NEXT)?;
                if !f((head_off, prev), cur)? {
                    return Ok(());
                }
                prev = Some(cur);
                cur = next;
            }
        }
        Ok(())
    }

    fn unlink(&self, head_off: usize, prev: Option<u32>, entry: u32) -> Result<(), KvError> {
        let next = self.fld(entry, E_NEXT)?;
        match prev {
            None => self.f32(head_off)?.store(next, Ordering::Relaxed),
            Some(p) => self.put(p, E_NEXT, next)?,
        }
        Ok(())
    }

    // ---- operations --------------------------------------------------------------------

    /// `proxy_get_shared_data`: the value of `key` (bytes) and its CAS token (≥ 1).
    ///
    /// # Errors
    /// [`KvError::NotFound`]; [`KvError::Corrupt`] (see its documentation).
    pub fn get(&self, key: &[u8]) -> Result<(Vec<u8>, u32), KvError> {
        let (stripe, head_off, tag) = self.locate(key)?;
        let _g = self.lock_stripe(stripe)?;
        let Some((_, entry)) = self.find(head_off, tag, key)? else {
            return Err(KvError::NotFound);
        };
        let vlen = self.fld(entry, E_VLEN)? as usize;
        let mut value = Vec::new();
        value
            .try_reserve_exact(vlen)
            .map_err(|_| KvError::Corrupt)?;
        value.resize(vlen, 0);
        self.read_stream(entry, key.len(), &mut value)?;
        let cas = self.fld(entry, E_CAS)?;
        if self.eviction == Eviction::Lru {
            self.stamp(entry)?.store(now_ms(), Ordering::Relaxed);
        }
        Ok((value, cas))
    }

    /// `proxy_set_shared_data` with ngx_wasm_module's CAS rules (module documentation): `cas`
    /// 0 creates a missing key, otherwise it must equal the key's current token. On success the
    /// token grows by one (a new key gets 1).
    ///
    /// # Errors
    /// [`KvError::CasMismatch`]; [`KvError::NoSpace`] (zone full even after eviction: nothing
    /// changed, the old value stays); [`KvError::TooLarge`]; [`KvError::Corrupt`].
    pub fn set(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), KvError> {
        let klen = u32::try_from(key.len()).map_err(|_| KvError::TooLarge)?;
        let vlen = u32::try_from(value.len()).map_err(|_| KvError::TooLarge)?;
        let need = KvLayout::blocks_for(key.len(), value.len());
        if need > self.layout.blocks as usize {
            return Err(KvError::TooLarge);
        }
        let (stripe, head_off, tag) = self.locate(key)?;
        let _g = self.lock_stripe(stripe)?;
        match self.find(head_off, tag, key)? {
            None if cas == 0 => {
                let entry = self.alloc(need, stripe, None)?;
                let cont = self.fld(entry, C_NEXT)?;
                self.put(entry, E_CONT, cont)?;
                self.put(entry, E_HASH, tag)?;
                self.put(entry, E_CAS, 1)?;
                self.put(entry, E_KLEN, klen)?;
                self.put(entry, E_VLEN, vlen)?;
                self.stamp(entry)?
                    .store(self.stamp_now(), Ordering::Relaxed);
                self.write_stream(entry, 0, key)?;
                self.write_stream(entry, key.len(), value)?;
                let head = self.f32(head_off)?;
                self.put(entry, E_NEXT, head.load(Ordering::Relaxed))?;
                head.store(entry, Ordering::Relaxed);
                self.f32(G_KEYS)?.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Some((_, entry)) if cas != 0 && self.fld(entry, E_CAS)? == cas => {
                self.resize(entry, need.saturating_sub(1), stripe)?;
                self.put(entry, E_VLEN, vlen)?;
                self.write_stream(entry, key.len(), value)?;
                let next = cas.wrapping_add(1).max(1);
                self.put(entry, E_CAS, next)?;
                if self.eviction == Eviction::Lru {
                    self.stamp(entry)?.store(now_ms(), Ordering::Relaxed);
                }
                Ok(())
            }
            _ => Err(KvError::CasMismatch),
        }
    }

    /// Gives `entry` exactly `want` continuation blocks (allocating first, so a failure leaves
    /// the entry unchanged).
    fn resize(&self, entry: u32, want: usize, stripe: usize) -> Result<(), KvError> {
        // Count the continuation blocks and find the last one.
        let mut have = 0usize;
        let mut last = NIL;
        let mut cur = self.fld(entry, E_CONT)?;
        while cur != NIL {
            have = have.saturating_add(1);
            if have > self.layout.blocks as usize {
                return Err(KvError::Corrupt);
            }
            last = cur;
            cur = self.fld(cur, C_NEXT)?;
        }
        if want > have {
            let extra = self.alloc(want.saturating_sub(have), stripe, Some(entry))?;
            if last == NIL {
                self.put(entry, E_CONT, extra)?;
            } else {
                self.put(last, C_NEXT, extra)?;
            }
        } else if want < have {
            let rest = if want == 0 {
                let rest = self.fld(entry, E_CONT)?;
                self.put(entry, E_CONT, NIL)?;
                rest
            } else {
                let mut keep = self.fld(entry, E_CONT)?;
                for _ in 1..want {
                    keep = self.fld(keep, C_NEXT)?;
                }
                let rest = self.fld(keep, C_NEXT)?;
                self.put(keep, C_NEXT, NIL)?;
                rest
            };
            self.free_chain(rest)?;
        }
        Ok(())
    }

    /// Deletes `key` (ngx_wasm_module: `proxy_set_shared_data` with a null value pointer) if its
    /// token is `cas`; the proxy-wasm `Host` trait of this project has no delete, this is for
    /// administration and tests.
    ///
    /// # Errors
    /// [`KvError::NotFound`], [`KvError::CasMismatch`], [`KvError::Corrupt`].
    pub fn delete(&self, key: &[u8], cas: u32) -> Result<(), KvError> {
        let (stripe, head_off, tag) = self.locate(key)?;
        let _g = self.lock_stripe(stripe)?;
        let Some((prev, entry)) = self.find(head_off, tag, key)? else {
            return Err(KvError::NotFound);
        };
        if self.fld(entry, E_CAS)? != cas {
            return Err(KvError::CasMismatch);
        }
        self.unlink(head_off, prev, entry)?;
        self.free_entry(entry)?;
        self.f32(G_KEYS)?.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// The zone's counters.
    pub fn stats(&self) -> KvStats {
        let load32 = |off| {
            self.region
                .u32_at(off)
                .map_or(0, |a| a.load(Ordering::Relaxed))
        };
        KvStats {
            blocks: self.layout.blocks,
            free_blocks: load32(G_FREE_COUNT),
            keys: load32(G_KEYS),
            evictions: self
                .region
                .u64_at(G_EVICTIONS)
                .map_or(0, |a| a.load(Ordering::Relaxed)),
            lock_takeovers: load32(G_STEALS),
        }
    }
}

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

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn zone(len: usize, eviction: Eviction) -> KvZone {
        let region = SharedRegion::anonymous(len).unwrap();
        KvZone::attach(region, "*", Init::Fresh, eviction).unwrap()
    }

    #[test]
    fn cas_semantics_follow_ngx_wasm_module() {
        let z = zone(64 * 1024, Eviction::None);
        assert_eq!(z.get(b"k"), Err(KvError::NotFound));
        // missing key, cas != 0: mismatch
        assert_eq!(z.set(b"k", b"v", 7), Err(KvError::CasMismatch));
        // missing key, cas 0: created with token 1
        z.set(b"k", b"v1", 0).unwrap();
        assert_eq!(z.get(b"k").unwrap(), (b"v1".to_vec(), 1));
        // existing key, cas 0: mismatch (Envoy would overwrite)
        assert_eq!(z.set(b"k", b"x", 0), Err(KvError::CasMismatch));
        // existing key, wrong token: mismatch
        assert_eq!(z.set(b"k", b"x", 2), Err(KvError::CasMismatch));
        // existing key, its token: written, token + 1
        z.set(b"k", b"v2", 1).unwrap();
        assert_eq!(z.get(b"k").unwrap(), (b"v2".to_vec(), 2));
        // stale token after a write: mismatch
        assert_eq!(z.set(b"k", b"v3", 1), Err(KvError::CasMismatch));
        // tokens are per key
        z.set(b"other", b"o", 0).unwrap();
        assert_eq!(z.get(b"other").unwrap().1, 1);
        // empty key and empty value are fine
        z.set(b"", b"", 0).unwrap();
        assert_eq!(z.get(b"").unwrap(), (Vec::new(), 1));
        // delete needs the token
        assert_eq!(z.delete(b"k", 1), Err(KvError::CasMismatch));
        z.delete(b"k", 2).unwrap();
        assert_eq!(z.get(b"k"), Err(KvError::NotFound));
        assert_eq!(z.delete(b"k", 2), Err(KvError::NotFound));
    }

    #[test]
    fn token_skips_zero_when_it_wraps() {
        let z = zone(8192, Eviction::None);
        z.set(b"k", b"v", 0).unwrap();
        let (stripe, head_off, tag) = z.locate(b"k").unwrap();
        let entry = {
            let _g = z.lock_stripe(stripe).unwrap();
            z.find(head_off, tag, b"k").unwrap().unwrap().1
        };
        z.put(entry, E_CAS, u32::MAX).unwrap();
        z.set(b"k", b"w", u32::MAX).unwrap();
        assert_eq!(z.get(b"k").unwrap(), (b"w".to_vec(), 1));
    }

    fn increment(z: &KvZone, key: &[u8]) -> u32 {
        let mut mismatches = 0;
        loop {
            let (n, cas) = match z.get(key) {
                Ok((v, cas)) => (u64::from_le_bytes(v.try_into().unwrap()), cas),
                Err(KvError::NotFound) => (0, 0),
                Err(e) => panic!("{e}"),
            };
            match z.set(key, &(n + 1).to_le_bytes(), cas) {
                Ok(()) => return mismatches,
                Err(KvError::CasMismatch) => mismatches += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn count(z: &KvZone, key: &[u8]) -> u64 {
        u64::from_le_bytes(z.get(key).unwrap().0.try_into().unwrap())
    }

    #[test]
    fn threads_incrementing_by_cas_lose_no_update() {
        let z = zone(64 * 1024, Eviction::None);
        const THREADS: usize = 4;
        const EACH: u64 = 3000;
        let mismatches: u32 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let z = z.clone();
                    s.spawn(move || (0..EACH).map(|_| increment(&z, b"counter")).sum::<u32>())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(count(&z, b"counter"), THREADS as u64 * EACH);
        assert_eq!(z.get(b"counter").unwrap().1, (THREADS as u64 * EACH) as u32);
        eprintln!("threads: {mismatches} CAS mismatches retried");
    }

    #[test]
    fn forked_processes_incrementing_by_cas_lose_no_update() {
        let region = SharedRegion::anonymous(64 * 1024).unwrap();
        let z = KvZone::attach(region.clone(), "*", Init::Fresh, Eviction::None).unwrap();
        const CHILDREN: usize = 3;
        const EACH: u64 = 3000;
        let codes = crate::shm::fork_children(CHILDREN, |i| {
            // Each child attaches the existing zone, as an nginx worker would.
            let Ok(z) = KvZone::attach(region.clone(), "*", Init::Existing, Eviction::None) else {
                return false;
            };
            for _ in 0..EACH {
                increment(&z, b"shared");
                // a per-child key too, in other stripes
                increment(&z, format!("child-{i}").as_bytes());
            }
            true
        });
        assert_eq!(codes, vec![0; CHILDREN]);
        assert_eq!(count(&z, b"shared"), CHILDREN as u64 * EACH);
        for i in 0..CHILDREN {
            assert_eq!(count(&z, format!("child-{i}").as_bytes()), EACH);
        }
        assert_eq!(z.stats().keys, 1 + CHILDREN as u32);
    }

    #[test]
    fn a_worker_dying_with_a_lock_does_not_wedge_the_zone() {
        let region = SharedRegion::anonymous(64 * 1024).unwrap();
        let z = KvZone::attach(region.clone(), "*", Init::Fresh, Eviction::None).unwrap();
        z.set(b"k", b"v", 0).unwrap();
        // The parent's pid is cached before the fork; the child must not reuse it.
        let parent = crate::shm::current_pid();
        let codes = crate::shm::fork_children(1, |_| {
            if crate::shm::current_pid() == parent
                || crate::shm::current_pid() != std::process::id()
            {
                return false;
            }
            // Take k's stripe lock and exit without releasing it (a crashed worker).
            let Ok((stripe, _, _)) = z.locate(b"k") else {
                return false;
            };
            let Ok(guard) = z.lock_stripe(stripe) else {
                return false;
            };
            std::mem::forget(guard);
            true
        });
        assert_eq!(codes, vec![0]);
        // The child is dead and reaped: the next writer takes the lock over.
        z.set(b"k", b"w", 1).unwrap();
        assert_eq!(z.get(b"k").unwrap(), (b"w".to_vec(), 2));
        assert_eq!(z.stats().lock_takeovers, 1);
    }

    #[test]
    fn sentinel_mismatch_refuses_to_attach() {
        let region = SharedRegion::anonymous(64 * 1024).unwrap();
        let z = KvZone::attach(region.clone(), "a", Init::Fresh, Eviction::None).unwrap();
        z.set(b"k", b"v", 0).unwrap();
        // Same memory, same size: attaches and sees the data.
        let again = KvZone::attach(region.clone(), "a", Init::Existing, Eviction::None).unwrap();
        assert_eq!(again.get(b"k").unwrap().0, b"v");
        // Another size (e.g. the directive changed): refused.
        let smaller = region.prefix(32 * 1024).unwrap();
        assert_eq!(
            KvZone::attach(smaller, "a", Init::Existing, Eviction::None).unwrap_err(),
            AttachError::Mismatch {
                field: "zone size",
                expected: 32 * 1024,
                found: 64 * 1024
            }
        );
        // Another layout version: refused.
        region
            .u32_at(H_VERSION)
            .unwrap()
            .store(VERSION + 1, Ordering::Relaxed);
        assert!(matches!(
            KvZone::attach(region.clone(), "a", Init::Existing, Eviction::None),
            Err(AttachError::Mismatch {
                field: "layout version",
                ..
            })
        ));
        // Memory that never held a zone: refused.
        let blank = SharedRegion::anonymous(64 * 1024).unwrap();
        assert_eq!(
            KvZone::attach(blank, "a", Init::Existing, Eviction::None).unwrap_err(),
            AttachError::NotInitialized
        );
        // Too small.
        let tiny = SharedRegion::anonymous(1024).unwrap();
        assert_eq!(
            KvZone::attach(tiny, "a", Init::Fresh, Eviction::None).unwrap_err(),
            AttachError::TooSmall {
                len: 1024,
                min: MIN_ZONE_BYTES
            }
        );
    }

    #[test]
    fn full_zone_refuses_without_corruption() {
        let z = zone(MIN_ZONE_BYTES, Eviction::None);
        let blocks = z.layout().blocks;
        // Each entry: 8-byte key + 100-byte value = 108 bytes = 3 blocks.
        let value = [7u8; 100];
        let mut stored = Vec::new();
        loop {
            let key = format!("key{:05}", stored.len());
            match z.set(key.as_bytes(), &value, 0) {
                Ok(()) => stored.push(key),
                Err(KvError::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(stored.len(), blocks as usize / 3);
        // Everything stored reads back intact; the zone is still usable.
        for key in &stored {
            assert_eq!(z.get(key.as_bytes()).unwrap(), (value.to_vec(), 1));
        }
        // Growing a value that no longer fits fails and leaves the old value.
        let big = vec![1u8; 500];
        assert_eq!(z.set(stored[0].as_bytes(), &big, 1), Err(KvError::NoSpace));
        assert_eq!(z.get(stored[0].as_bytes()).unwrap(), (value.to_vec(), 1));
        // Larger than the zone: TooLarge.
        assert_eq!(
            z.set(b"huge", &vec![0u8; MIN_ZONE_BYTES * 2], 0),
            Err(KvError::TooLarge)
        );
        // Freeing makes room again, and all blocks come back.
        for key in &stored {
            z.delete(key.as_bytes(), 1).unwrap();
        }
        let s = z.stats();
        assert_eq!((s.keys, s.free_blocks), (0, blocks));
        z.set(stored[0].as_bytes(), &big, 0).unwrap();
    }

    #[test]
    fn lru_evicts_old_entries_to_make_room() {
        let z = zone(16 * 1024, Eviction::Lru);
        let value = [3u8; 100];
        // Stamps have the coarse clock's resolution (a few ms): make k0 strictly the oldest.
        z.set(b"k0", &value, 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        for i in 1..2000u32 {
            z.set(format!("k{i}").as_bytes(), &value, 0).unwrap();
        }
        let s = z.stats();
        assert!(s.evictions > 0, "{s:?}");
        // The most recent key is there; the very first ones were evicted.
        assert_eq!(z.get(b"k1999").unwrap().0, value);
        assert_eq!(z.get(b"k0"), Err(KvError::NotFound));
        // A value needing many blocks evicts several entries.
        let jwks = vec![b'j'; 4096];
        z.set(b"jwks", &jwks, 0).unwrap();
        assert_eq!(z.get(b"jwks").unwrap().0, jwks);
    }

    #[test]
    fn eviction_directive_values() {
        assert_eq!(Eviction::from_directive(None), Ok(Eviction::Lru));
        assert_eq!(
            Eviction::from_directive(Some("eviction=none")),
            Ok(Eviction::None)
        );
        assert_eq!(
            Eviction::from_directive(Some("eviction=lru")),
            Ok(Eviction::Lru)
        );
        assert_eq!(
            Eviction::from_directive(Some("eviction=slru")),
            Ok(Eviction::Lru)
        );
        assert_eq!(
            Eviction::from_directive(Some("eviction=fifo")),
            Err(UnsupportedEviction("fifo".into()))
        );
    }

    #[test]
    fn large_values_round_trip_and_resize() {
        let z = zone(256 * 1024, Eviction::None);
        let initial_free = z.stats().free_blocks;
        let jwks: Vec<u8> = (0..16 * 1024).map(|i| (i % 251) as u8).collect();
        z.set(b"jwks/issuer", &jwks, 0).unwrap();
        assert_eq!(z.get(b"jwks/issuer").unwrap(), (jwks.clone(), 1));
        assert_eq!(
            initial_free - z.stats().free_blocks,
            KvLayout::blocks_for(11, jwks.len()) as u32
        );
        // shrink, grow, shrink to inline
        z.set(b"jwks/issuer", b"small", 1).unwrap();
        assert_eq!(z.get(b"jwks/issuer").unwrap(), (b"small".to_vec(), 2));
        let mid = vec![9u8; 1000];
        z.set(b"jwks/issuer", &mid, 2).unwrap();
        assert_eq!(z.get(b"jwks/issuer").unwrap(), (mid, 3));
        z.set(b"jwks/issuer", &jwks, 3).unwrap();
        assert_eq!(z.get(b"jwks/issuer").unwrap(), (jwks, 4));
        z.delete(b"jwks/issuer", 4).unwrap();
        assert_eq!(z.stats().free_blocks, initial_free);
    }

    #[test]
    fn random_operations_match_a_model() {
        let z = zone(32 * 1024, Eviction::None);
        let initial_free = z.stats().free_blocks;
        let mut model: HashMap<Vec<u8>, (Vec<u8>, u32)> = HashMap::new();
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            let key = format!("key-{}", rnd(200)).into_bytes();
            match rnd(10) {
                0..=5 => {
                    let len = match rnd(4) {
                        0 => rnd(20),
                        1 => rnd(100),
                        2 => rnd(400),
                        _ => 0,
                    } as usize;
                    let value: Vec<u8> = (0..len).map(|i| (i as u8) ^ (len as u8)).collect();
                    let cas = model.get(&key).map_or(0, |(_, c)| *c);
                    match z.set(&key, &value, cas) {
                        Ok(()) => {
                            model.insert(key, (value, cas + 1));
                        }
                        Err(KvError::NoSpace) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                6 => {
                    if let Some((_, cas)) = model.get(&key) {
                        z.delete(&key, *cas).unwrap();
                        model.remove(&key);
                    }
                }
                _ => match model.get(&key) {
                    Some(v) => assert_eq!(&z.get(&key).unwrap(), v),
                    None => assert_eq!(z.get(&key), Err(KvError::NotFound)),
                },
            }
        }
        assert_eq!(z.stats().keys as usize, model.len());
        let used: usize = model
            .iter()
            .map(|(k, (v, _))| KvLayout::blocks_for(k.len(), v.len()))
            .sum();
        assert_eq!((initial_free - z.stats().free_blocks) as usize, used);
    }

    #[test]
    fn zone_set_routes_like_ngx_wasm_module() {
        let mk = |name: &str| {
            KvZone::attach(
                SharedRegion::anonymous(8192).unwrap(),
                name,
                Init::Fresh,
                Eviction::None,
            )
            .unwrap()
        };
        let mut set = ZoneSet::new();
        set.insert(mk("rl")).unwrap();
        assert_eq!(set.insert(mk("rl")), Err(DuplicateZone("rl".into())));
        // No default zone yet: keys outside "rl/" have nowhere to go.
        assert_eq!(set.set(b"other/x", b"v", 0), Err(KvError::NoZone));
        assert_eq!(set.get(b"x"), Err(KvError::NoZone));
        set.insert(mk("*")).unwrap();
        set.set(b"rl/a", b"1", 0).unwrap();
        set.set(b"other/x", b"2", 0).unwrap();
        set.set(b"/x", b"3", 0).unwrap();
        set.set(b"plain", b"4", 0).unwrap();
        assert_eq!(set.route(b"rl/a").unwrap().name(), "rl");
        assert_eq!(set.route(b"rl").unwrap().name(), "*");
        assert_eq!(set.route(b"rlx/a").unwrap().name(), "*");
        assert_eq!(set.zone("rl").unwrap().get(b"rl/a").unwrap().0, b"1");
        assert_eq!(set.zone("*").unwrap().get(b"other/x").unwrap().0, b"2");
        assert_eq!(set.zone("*").unwrap().get(b"/x").unwrap().0, b"3");
        assert_eq!(set.get(b"plain").unwrap().0, b"4");
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod bench {
    use super::*;
    use crate::metrics::{MetricKind, MetricsConfig, MetricsLayout, MetricsZone};

    /// Rough costs, for the record: `cargo test -p tollgate-services --release -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn costs() {
        let z = KvZone::attach(
            SharedRegion::anonymous(1 << 20).unwrap(),
            "*",
            Init::Fresh,
            Eviction::Lru,
        )
        .unwrap();
        for i in 0..1000 {
            z.set(
                format!("ratelimit/rule/tenant-{i}").as_bytes(),
                &[0u8; 24],
                0,
            )
            .unwrap();
        }
        let n = 1_000_000;
        let t = std::time::Instant::now();
        for i in 0..n {
            let key = format!("ratelimit/rule/tenant-{}", i % 1000);
            let (v, cas) = z.get(key.as_bytes()).unwrap();
            z.set(key.as_bytes(), &v, cas).unwrap();
        }
        eprintln!("kv get+set: {:?} per pair", t.elapsed() / n);
        let l = MetricsLayout::new(1024, 2, 4096).unwrap();
        let m = MetricsZone::attach(
            SharedRegion::anonymous(l.bytes().unwrap()).unwrap(),
            &l,
            Init::Fresh,
            0,
            MetricsConfig::default(),
        )
        .unwrap();
        let c = m.define(MetricKind::Counter, "c_total").unwrap();
        let h = m.define(MetricKind::Histogram, "h").unwrap();
        let t = std::time::Instant::now();
        for i in 0..n {
            m.increment(c, 1).unwrap();
            m.record(h, u64::from(i) * 7).unwrap();
        }
        eprintln!("metrics increment+record: {:?} per pair", t.elapsed() / n);
    }
}
