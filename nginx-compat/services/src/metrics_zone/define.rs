//! `proxy_define_metric`: the name index (open addressing, FNV-1a), the zone's bucket sets,
//! and publishing a definition under the define lock (or counting the overflow when the zone is
//! full).

use std::sync::atomic::Ordering;

use super::error::MetricsError;
use super::handle::MetricsZone;
use super::layout::*;
use super::metric_kind::MetricKind;
use crate::lock::lock;
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl MetricsZone {
    /// Looks `name` up in the index: `Ok(Some(id))`, or `Ok(None)` with the empty index slot
    /// where it would go.
    fn lookup(&self, name: &[u8]) -> Result<Result<u32, usize>, MetricsError> {
        let mask = self.index_slots.saturating_sub(1);
        let mut i = (fnv1a(name) as usize) & mask;
        for _ in 0..self.index_slots {
            let v = self.f32(self.index_off(i))?.load(Ordering::Acquire);
            if v == 0 {
                return Ok(Err(i));
            }
            let id = v.saturating_sub(1);
            if self.def32(id, D_STATE)? == 1 && self.name_of(id)? == name {
                return Ok(Ok(id));
            }
            i = i.wrapping_add(1) & mask;
        }
        Err(MetricsError::NoSpace)
    }

    /// The index of the bucket set equal to `bounds`, adding it (define lock held).
    fn bucket_set(&self, bounds: &[u64]) -> Result<u32, MetricsError> {
        let sets = self.f32(C_SETS)?;
        let n = sets.load(Ordering::Relaxed);
        for s in 0..n {
            if self.set_bounds(s)? == bounds {
                return Ok(s);
            }
        }
        if n as usize >= MAX_SETS || bounds.len() > MAX_BUCKETS {
            return Err(MetricsError::NoSpace);
        }
        let off = SETS_OFF.saturating_add((n as usize).saturating_mul(SET_SIZE));
        self.f32(off)?.store(
            u32::try_from(bounds.len()).map_err(|_| MetricsError::Corrupt)?,
            Ordering::Relaxed,
        );
        for (i, b) in bounds.iter().enumerate() {
            self.f64(off.saturating_add(8).saturating_add(i.saturating_mul(8)))?
                .store(*b, Ordering::Relaxed);
        }
        sets.store(n.saturating_add(1), Ordering::Release);
        Ok(n)
    }

    /// Bound `i` of bucket set `set`.
    pub(super) fn set_bound(&self, set: u32, i: usize) -> Result<u64, MetricsError> {
        if set as usize >= MAX_SETS || i >= MAX_BUCKETS {
            return Err(MetricsError::Corrupt);
        }
        let off = SETS_OFF
            .saturating_add((set as usize).saturating_mul(SET_SIZE))
            .saturating_add(8)
            .saturating_add(i.saturating_mul(8));
        Ok(self.f64(off)?.load(Ordering::Relaxed))
    }

    pub(super) fn set_bounds(&self, set: u32) -> Result<Vec<u64>, MetricsError> {
        if set as usize >= MAX_SETS {
            return Err(MetricsError::Corrupt);
        }
        let off = SETS_OFF.saturating_add((set as usize).saturating_mul(SET_SIZE));
        let n = (self.f32(off)?.load(Ordering::Relaxed) as usize).min(MAX_BUCKETS);
        (0..n)
            .map(|i| {
                Ok(self
                    .f64(off.saturating_add(8).saturating_add(i.saturating_mul(8)))?
                    .load(Ordering::Relaxed))
            })
            .collect()
    }

    /// `proxy_define_metric`: the id of metric `name` (bytes ≤ [`MAX_NAME_BYTES`], the
    /// labels encoded in it, see [`crate::exposition`]), defining it on first use. Takes the
    /// zone's define lock only when the name is new.
    ///
    /// # Errors
    /// [`MetricsError::BadArgument`] for an empty or too long name or one defined with another
    /// kind; [`MetricsError::NoSpace`] when definitions, slots or bucket sets run out.
    pub fn define(&self, kind: MetricKind, name: &str) -> Result<u32, MetricsError> {
        let name_bytes = name.as_bytes();
        if name_bytes.is_empty() || name_bytes.len() > MAX_NAME_BYTES {
            return Err(MetricsError::BadArgument);
        }
        let existing = |id: u32| -> Result<u32, MetricsError> {
            if self.def32(id, D_KIND)? == kind as u32 {
                Ok(id)
            } else {
                Err(MetricsError::BadArgument)
            }
        };
        if let Ok(id) = self.lookup(name_bytes)? {
            return existing(id);
        }
        let _g = lock(self.f32(C_LOCK)?, self.region.u32_at(C_STEALS));
        let index_slot = match self.lookup(name_bytes)? {
            Ok(id) => return existing(id),
            Err(slot) => slot,
        };
        let id = self.f32(C_COUNT)?.load(Ordering::Relaxed);
        if id >= self.layout.max_metrics {
            return Err(self.overflowed());
        }
        let (set, nbuckets, slots) = match kind {
            MetricKind::Counter => (0, 0, 1usize),
            MetricKind::Gauge => (0, 0, 0),
            MetricKind::Histogram => {
                let bounds = self.config.buckets.for_name(name);
                let set = self.bucket_set(bounds).map_err(|e| match e {
                    MetricsError::NoSpace => self.overflowed(),
                    e => e,
                })?;
                (set, bounds.len(), bounds.len().saturating_add(2))
            }
        };
        let next_slot = self.f32(C_NEXT_SLOT)?;
        let first = next_slot.load(Ordering::Relaxed);
        let end = (first as usize).saturating_add(slots);
        if end > self.layout.slots_per_worker as usize {
            return Err(self.overflowed());
        }
        let def = self.def_off(id)?;
        let put = |field: usize, v: u32| -> Result<(), MetricsError> {
            self.f32(def.saturating_add(field))?
                .store(v, Ordering::Relaxed);
            Ok(())
        };
        put(D_KIND, kind as u32)?;
        put(
            D_NAME_LEN,
            u32::try_from(name_bytes.len()).map_err(|_| MetricsError::Corrupt)?,
        )?;
        put(D_SLOT, first)?;
        put(D_SET, set)?;
        put(
            D_NBUCKETS,
            u32::try_from(nbuckets).map_err(|_| MetricsError::Corrupt)?,
        )?;
        self.f64(def.saturating_add(D_GAUGE))?
            .store(0, Ordering::Relaxed);
        if !self.region.write(def.saturating_add(D_NAME), name_bytes) {
            return Err(MetricsError::Corrupt);
        }
        self.f32(def.saturating_add(D_STATE))?
            .store(1, Ordering::Release);
        next_slot.store(
            u32::try_from(end).map_err(|_| MetricsError::Corrupt)?,
            Ordering::Relaxed,
        );
        self.f32(self.index_off(index_slot))?
            .store(id.saturating_add(1), Ordering::Release);
        self.f32(C_COUNT)?
            .store(id.saturating_add(1), Ordering::Release);
        Ok(id)
    }

    /// (kind, first slot, bucket count) of a published metric.
    pub(super) fn def(&self, id: u32) -> Result<(MetricKind, usize, usize), MetricsError> {
        if id >= self.count()? || self.def32(id, D_STATE)? != 1 {
            return Err(MetricsError::NotFound);
        }
        let kind = MetricKind::from_u32(self.def32(id, D_KIND)?).ok_or(MetricsError::Corrupt)?;
        let slot = self.def32(id, D_SLOT)? as usize;
        let nbuckets = (self.def32(id, D_NBUCKETS)? as usize).min(MAX_BUCKETS);
        Ok((kind, slot, nbuckets))
    }

    /// Counts a `define` refused for lack of space; returns [`MetricsError::NoSpace`].
    pub(super) fn overflowed(&self) -> MetricsError {
        if let Ok(c) = self.f32(C_OVERFLOW) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
        }
        MetricsError::NoSpace
    }
}
