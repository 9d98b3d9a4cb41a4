//! A `shm_kv` zone's table: [`KvZone`], attaching (format or verify the sentinel), raw field
//! access, hashing into stripes and buckets, the key/value byte stream across blocks, finding,
//! walking and unlinking entries.

use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::lock::{lock, Guard};
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};

use super::layout::*;

/// One `shm_kv` zone attached in this process. Cheap to clone; `Send + Sync` (all state is in
/// the shared region, behind its locks).
#[derive(Debug)]
pub struct KvZone {
    pub(super) region: SharedRegion,
    pub(super) name: String,
    pub(super) eviction: Eviction,
    pub(super) layout: KvLayout,
    pub(super) blocks_off: usize,
    pub(super) seeds: (u64, u64),
    pub(super) rng: AtomicU64,
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

pub(super) fn random_u64(salt: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.finish()
}

pub(super) fn now_ms() -> u64 {
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

    pub(super) fn header_values(&self) -> [crate::zone::Field; 9] {
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

    pub(super) fn format(&mut self) -> Result<(), KvError> {
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
        if !crate::zone::publish(&self.region, H_MAGIC, MAGIC, &self.header_values()) {
            return Err(KvError::Corrupt);
        }
        Ok(())
    }

    pub(super) fn verify(&mut self) -> Result<(), AttachError> {
        crate::zone::verify(&self.region, H_MAGIC, MAGIC, &self.header_values())?;
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

    pub(super) fn f32(&self, off: usize) -> Result<&AtomicU32, KvError> {
        self.region.u32_at(off).ok_or(KvError::Corrupt)
    }

    pub(super) fn f64(&self, off: usize) -> Result<&AtomicU64, KvError> {
        self.region.u64_at(off).ok_or(KvError::Corrupt)
    }

    pub(super) fn stripe_off(&self, stripe: usize) -> Result<usize, KvError> {
        stripe
            .checked_mul(LINE)
            .and_then(|o| o.checked_add(STRIPES_OFF))
            .ok_or(KvError::Corrupt)
    }

    pub(super) fn block_off(&self, block: u32) -> Result<usize, KvError> {
        if block >= self.layout.blocks {
            return Err(KvError::Corrupt);
        }
        (block as usize)
            .checked_mul(LINE)
            .and_then(|o| o.checked_add(self.blocks_off))
            .ok_or(KvError::Corrupt)
    }

    pub(super) fn fld(&self, block: u32, field: usize) -> Result<u32, KvError> {
        let off = self.block_off(block)?.saturating_add(field);
        Ok(self.f32(off)?.load(Ordering::Relaxed))
    }

    pub(super) fn put(&self, block: u32, field: usize, value: u32) -> Result<(), KvError> {
        let off = self.block_off(block)?.saturating_add(field);
        self.f32(off)?.store(value, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn stamp(&self, block: u32) -> Result<&AtomicU64, KvError> {
        self.f64(self.block_off(block)?.saturating_add(E_STAMP))
    }

    /// The "last access" stamp of a new entry (0 without eviction: nothing reads it).
    pub(super) fn stamp_now(&self) -> u64 {
        match self.eviction {
            Eviction::Lru => now_ms(),
            Eviction::None => 0,
        }
    }

    pub(super) fn steals(&self) -> Option<&AtomicU32> {
        self.region.u32_at(G_STEALS)
    }

    // ---- hashing and buckets -----------------------------------------------------------

    /// (stripe, offset of the bucket head word, hash tag)
    pub(super) fn locate(&self, key: &[u8]) -> Result<(usize, usize, u32), KvError> {
        // SipHash-1-3 keyed by the zone's seeds: clients cannot aim keys at one bucket.
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.seeds.0, self.seeds.1);
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

    pub(super) fn lock_stripe(&self, stripe: usize) -> Result<Guard<'_>, KvError> {
        Ok(lock(self.f32(self.stripe_off(stripe)?)?, self.steals()))
    }

    // ---- key/value byte stream ---------------------------------------------------------

    /// Calls `f(region offset, range of the caller's buffer)` for each piece of the entry's
    /// byte stream `start..start+len`.
    pub(super) fn segments(
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

    pub(super) fn read_stream(
        &self,
        head: u32,
        start: usize,
        dst: &mut [u8],
    ) -> Result<(), KvError> {
        let len = dst.len();
        self.segments(head, start, len, |off, range| {
            dst.get_mut(range).is_some_and(|d| self.region.read(off, d))
        })
    }

    pub(super) fn write_stream(&self, head: u32, start: usize, src: &[u8]) -> Result<(), KvError> {
        self.segments(head, start, src.len(), |off, range| {
            src.get(range).is_some_and(|s| self.region.write(off, s))
        })
    }

    pub(super) fn key_matches(&self, entry: u32, tag: u32, key: &[u8]) -> Result<bool, KvError> {
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
    pub(super) fn find(
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

    // ---- walking and unlinking entries -------------------------------------------------

    /// Calls `f((bucket head offset, predecessor), entry)` for every entry of a stripe (lock
    /// held by the caller) until `f` returns false.
    pub(super) fn for_each_entry(
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

    pub(super) fn unlink(
        &self,
        head_off: usize,
        prev: Option<u32>,
        entry: u32,
    ) -> Result<(), KvError> {
        let next = self.fld(entry, E_NEXT)?;
        match prev {
            None => self.f32(head_off)?.store(next, Ordering::Relaxed),
            Some(p) => self.put(p, E_NEXT, next)?,
        }
        Ok(())
    }
}
