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
//! O(1) expected: hash (SipHash-1-3 with a per-zone random seed, so clients cannot aim keys at one
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

mod layout;
mod ops;
mod space;
mod table;
mod zone_set;

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests;

pub use layout::{
    Eviction, EvictionPolicy, KvError, KvLayout, KvStats, UnsupportedEviction, MIN_ZONE_BYTES,
};
pub use table::KvZone;
pub use zone_set::{route_index, DuplicateZone, ZoneSet};
