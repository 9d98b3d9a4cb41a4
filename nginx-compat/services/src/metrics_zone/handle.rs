//! [`MetricsZone`], one process's handle on a metrics zone: attaching it (formatting a fresh
//! region, or checking the sentinel of an existing one), the worker slice it writes to, and the
//! bounds-checked access to the zone's fields that every operation goes through. Also
//! [`MetricsConfig`], the settings of this process's view (not stored in the zone).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::buckets::HistogramBuckets;
use super::error::MetricsError;
use super::layout::*;
use crate::exposition::LabelPolicy;
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};
/// Configuration of this process's view of the zone (not stored in shared memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Bucket bounds for histograms defined from now on.
    pub buckets: HistogramBuckets,
    /// Which name segments become labels in [`MetricsZone::render`].
    pub labels: LabelPolicy,
}

impl Default for MetricsConfig {
    /// [`DEFAULT_BUCKETS`](super::DEFAULT_BUCKETS) and [`LabelPolicy::tollgate`] (Envoy's output
    /// with `envoy/metrics.yaml`).
    fn default() -> Self {
        MetricsConfig {
            buckets: HistogramBuckets::default(),
            labels: LabelPolicy::tollgate(),
        }
    }
}

/// A metrics zone attached in one worker (or the master). `Send + Sync`.
#[derive(Debug, Clone)]
pub struct MetricsZone {
    pub(super) region: SharedRegion,
    pub(super) layout: MetricsLayout,
    pub(super) worker: u32,
    pub(super) config: MetricsConfig,
    pub(super) index_slots: usize,
    pub(super) defs_off: usize,
    pub(super) slices_off: usize,
    pub(super) slice_stride: usize,
}

impl MetricsZone {
    /// Attaches the zone for worker `worker` (0-based, `< layout.workers`; the master may use
    /// 0: it only defines and renders).
    ///
    /// [`Init::Fresh`] formats the region (zeroes it all); [`Init::Existing`] checks the header
    /// sentinel against `layout` and keeps the values (counters survive a reload).
    ///
    /// # Errors
    /// [`AttachError::TooSmall`] when the region is smaller than [`MetricsLayout::bytes`],
    /// [`AttachError::WorkerOutOfRange`], and for `Existing` [`AttachError::NotInitialized`] or
    /// [`AttachError::Mismatch`].
    pub fn attach(
        region: SharedRegion,
        layout: &MetricsLayout,
        init: Init,
        worker: u32,
        config: MetricsConfig,
    ) -> Result<MetricsZone, AttachError> {
        let bad = AttachError::BadLayout("size overflow");
        let bytes = layout.bytes().ok_or(bad.clone())?;
        if region.len() < bytes {
            return Err(AttachError::TooSmall {
                len: region.len(),
                min: bytes,
            });
        }
        if worker >= layout.workers {
            return Err(AttachError::WorkerOutOfRange {
                worker,
                workers: layout.workers,
            });
        }
        let zone = MetricsZone {
            region,
            layout: *layout,
            worker,
            config,
            index_slots: layout.index_slots().ok_or(bad.clone())?,
            defs_off: layout.defs_off().ok_or(bad.clone())?,
            slices_off: layout.slices_off().ok_or(bad.clone())?,
            slice_stride: layout.slice_stride().ok_or(bad)?,
        };
        match init {
            Init::Fresh => zone
                .format(bytes)
                .map_err(|_| AttachError::BadLayout("format"))?,
            Init::Existing => zone.verify(bytes)?,
        }
        Ok(zone)
    }

    /// The worker index this handle writes to.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The same zone, writing to another worker's slice (for a worker that learns its index
    /// after the master attached).
    ///
    /// # Errors
    /// [`AttachError::WorkerOutOfRange`].
    pub fn for_worker(&self, worker: u32) -> Result<MetricsZone, AttachError> {
        if worker >= self.layout.workers {
            return Err(AttachError::WorkerOutOfRange {
                worker,
                workers: self.layout.workers,
            });
        }
        let mut z = self.clone();
        z.worker = worker;
        Ok(z)
    }

    fn header_values(&self, bytes: usize) -> [crate::zone::Field; 11] {
        [
            ("layout version", H_VERSION, u64::from(VERSION), false),
            ("line size", H_LINE, LINE as u64, false),
            ("zone size", H_BYTES, bytes as u64, true),
            (
                "max metrics",
                H_MAX_METRICS,
                u64::from(self.layout.max_metrics),
                false,
            ),
            ("workers", H_WORKERS, u64::from(self.layout.workers), false),
            (
                "slots per worker",
                H_SLOTS,
                u64::from(self.layout.slots_per_worker),
                false,
            ),
            ("definition size", H_DEF_SIZE, DEF_SIZE as u64, false),
            ("index slots", H_INDEX_SLOTS, self.index_slots as u64, false),
            ("max buckets", H_MAX_BUCKETS, MAX_BUCKETS as u64, false),
            ("max name bytes", H_MAX_NAME, MAX_NAME_BYTES as u64, false),
            ("bucket sets", H_MAX_SETS, MAX_SETS as u64, false),
        ]
    }

    fn format(&self, bytes: usize) -> Result<(), MetricsError> {
        self.f64(H_MAGIC)?.store(0, Ordering::Release);
        if !self.region.zero(0, bytes) {
            return Err(MetricsError::Corrupt);
        }
        if !crate::zone::publish(&self.region, H_MAGIC, MAGIC, &self.header_values(bytes)) {
            return Err(MetricsError::Corrupt);
        }
        Ok(())
    }

    fn verify(&self, bytes: usize) -> Result<(), AttachError> {
        crate::zone::verify(&self.region, H_MAGIC, MAGIC, &self.header_values(bytes))
    }

    pub(super) fn f32(&self, off: usize) -> Result<&AtomicU32, MetricsError> {
        self.region.u32_at(off).ok_or(MetricsError::Corrupt)
    }

    pub(super) fn f64(&self, off: usize) -> Result<&AtomicU64, MetricsError> {
        self.region.u64_at(off).ok_or(MetricsError::Corrupt)
    }

    pub(super) fn def_off(&self, id: u32) -> Result<usize, MetricsError> {
        if id >= self.layout.max_metrics {
            return Err(MetricsError::Corrupt);
        }
        (id as usize)
            .checked_mul(DEF_SIZE)
            .and_then(|o| o.checked_add(self.defs_off))
            .ok_or(MetricsError::Corrupt)
    }

    pub(super) fn def32(&self, id: u32, field: usize) -> Result<u32, MetricsError> {
        Ok(self
            .f32(self.def_off(id)?.saturating_add(field))?
            .load(Ordering::Relaxed))
    }

    pub(super) fn slot(&self, worker: u32, slot: usize) -> Result<&AtomicU64, MetricsError> {
        let off = (worker as usize)
            .checked_mul(self.slice_stride)
            .and_then(|o| o.checked_add(self.slices_off))
            .and_then(|o| o.checked_add(slot.checked_mul(8)?))
            .ok_or(MetricsError::Corrupt)?;
        if slot >= self.layout.slots_per_worker as usize {
            return Err(MetricsError::Corrupt);
        }
        self.f64(off)
    }

    pub(super) fn count(&self) -> Result<u32, MetricsError> {
        Ok(self.f32(C_COUNT)?.load(Ordering::Acquire))
    }

    pub(super) fn name_of(&self, id: u32) -> Result<Vec<u8>, MetricsError> {
        let len = self.def32(id, D_NAME_LEN)? as usize;
        if len > MAX_NAME_BYTES {
            return Err(MetricsError::Corrupt);
        }
        let mut name = vec![0u8; len];
        if !self
            .region
            .read(self.def_off(id)?.saturating_add(D_NAME), &mut name)
        {
            return Err(MetricsError::Corrupt);
        }
        Ok(name)
    }

    pub(super) fn index_off(&self, slot: usize) -> usize {
        INDEX_OFF.saturating_add(slot.saturating_mul(4))
    }
}
