//! A `shm_kv` zone's operations: get, set (with ngx_wasm_module's CAS rules, see `kv/mod.rs`),
//! delete and the zone's counters.

use std::sync::atomic::Ordering;

use super::layout::*;

use super::table::{now_ms, KvZone};

impl KvZone {
    // ---- operations --------------------------------------------------------------------

    /// `proxy_get_shared_data`: the value of `key` (bytes) and its CAS token (≥ 1).
    ///
    /// # Errors
    /// [`KvError::NotFound`]; [`KvError::Corrupt`] (see its documentation).
    pub fn get(&self, key: &[u8]) -> Result<(Vec<u8>, u32), KvError> {
        let mut value = Vec::new();
        let cas = self.get_into(key, &mut value)?;
        Ok((value, cas))
    }

    /// [`KvZone::get`] into `value` (cleared first; its allocation is reused when large
    /// enough, so a caller that keeps one buffer allocates nothing per read). After an error
    /// its contents are unspecified.
    ///
    /// # Errors
    /// As [`KvZone::get`].
    pub fn get_into(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, KvError> {
        value.clear();
        let (stripe, head_off, tag) = self.locate(key)?;
        let _g = self.lock_stripe(stripe)?;
        let Some((_, entry)) = self.find(head_off, tag, key)? else {
            return Err(KvError::NotFound);
        };
        let vlen = self.fld(entry, E_VLEN)? as usize;
        value.try_reserve(vlen).map_err(|_| KvError::Corrupt)?;
        value.resize(vlen, 0);
        self.read_stream(entry, key.len(), value)?;
        let cas = self.fld(entry, E_CAS)?;
        if self.eviction == Eviction::Lru {
            self.stamp(entry)?.store(now_ms(), Ordering::Relaxed);
        }
        Ok(cas)
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
    pub(super) fn resize(&self, entry: u32, want: usize, stripe: usize) -> Result<(), KvError> {
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
