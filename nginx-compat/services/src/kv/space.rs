//! A `shm_kv` zone's space: the block allocator (one free list, under the allocator lock) and
//! eviction (Redis-style sampling of a few stripes for the least recently used entry).

use std::sync::atomic::Ordering;

use crate::lock::{lock, try_lock};

use super::layout::*;

use super::table::KvZone;

impl KvZone {
    // ---- block allocator ---------------------------------------------------------------

    /// Pops `n` blocks (already chained through their first word) from the free list; `None`
    /// when fewer than `n` are free.
    pub(super) fn alloc_chain(&self, n: u32) -> Result<Option<u32>, KvError> {
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
    pub(super) fn free_chain(&self, first: u32) -> Result<(), KvError> {
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
    pub(super) fn free_entry(&self, entry: u32) -> Result<(), KvError> {
        let cont = self.fld(entry, E_CONT)?;
        self.put(entry, C_NEXT, cont)?;
        self.free_chain(entry)
    }

    pub(super) fn alloc(
        &self,
        n: usize,
        own_stripe: usize,
        exclude: Option<u32>,
    ) -> Result<u32, KvError> {
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

    pub(super) fn next_random(&self) -> u64 {
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
    pub(super) fn evict_one(
        &self,
        own_stripe: usize,
        exclude: Option<u32>,
    ) -> Result<bool, KvError> {
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
}
