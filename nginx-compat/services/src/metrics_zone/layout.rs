//! The geometry of a metrics zone: the offsets of its header, control line, bucket sets, name
//! index, definitions and worker slices (the layout in `metrics_zone/mod.rs`), and
//! [`MetricsLayout`], the size parameters they follow from.

use crate::zone::AttachError;
pub(super) const LINE: usize = 64;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"TGMETRC1");
/// Layout version; bump on any change of the layout (2: the overflow counter).
pub(super) const VERSION: u32 = 2;
/// Bytes per metric definition.
pub(super) const DEF_SIZE: usize = 256;
/// Longest metric name (bytes).
pub const MAX_NAME_BYTES: usize = 200;
/// Most bucket bounds per histogram.
pub const MAX_BUCKETS: usize = 31;
/// Distinct bucket sets per zone.
pub(super) const MAX_SETS: usize = 16;
pub(super) const SET_SIZE: usize = 256;
pub(super) const SETS_OFF: usize = 128;
pub(super) const INDEX_OFF: usize = SETS_OFF + MAX_SETS * SET_SIZE;

// Header.
pub(super) const H_MAGIC: usize = 0;
pub(super) const H_VERSION: usize = 8;
pub(super) const H_LINE: usize = 12;
pub(super) const H_BYTES: usize = 16;
pub(super) const H_MAX_METRICS: usize = 24;
pub(super) const H_WORKERS: usize = 28;
pub(super) const H_SLOTS: usize = 32;
pub(super) const H_DEF_SIZE: usize = 36;
pub(super) const H_INDEX_SLOTS: usize = 40;
pub(super) const H_MAX_BUCKETS: usize = 44;
pub(super) const H_MAX_NAME: usize = 48;
pub(super) const H_MAX_SETS: usize = 52;
// Control.
pub(super) const C_LOCK: usize = 64;
pub(super) const C_COUNT: usize = 68;
pub(super) const C_NEXT_SLOT: usize = 72;
pub(super) const C_STEALS: usize = 76;
pub(super) const C_SETS: usize = 80;
/// `define` calls refused because definitions or slots ran out (u32, saturating).
pub(super) const C_OVERFLOW: usize = 84;
// Definition fields.
pub(super) const D_STATE: usize = 0;
pub(super) const D_KIND: usize = 4;
pub(super) const D_NAME_LEN: usize = 8;
pub(super) const D_SLOT: usize = 12;
pub(super) const D_SET: usize = 16;
pub(super) const D_NBUCKETS: usize = 20;
pub(super) const D_GAUGE: usize = 24;
pub(super) const D_NAME: usize = 56;

/// The size parameters of a metrics zone; the same on every attach (checked by the sentinel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsLayout {
    /// Most metrics (definitions).
    pub max_metrics: u32,
    /// Worker slices (nginx `worker_processes`).
    pub workers: u32,
    /// `u64` slots per worker slice: a counter takes 1, a histogram with `b` bounds `b + 2`.
    pub slots_per_worker: u32,
}

fn align_line(n: usize) -> Option<usize> {
    n.checked_add(LINE - 1)
        .map(|v| v / LINE)
        .and_then(|v| v.checked_mul(LINE))
}

impl MetricsLayout {
    /// A layout for `workers` workers with room for `max_metrics` metrics and `slots_per_worker`
    /// slots (e.g. 2048 metrics and 8192 slots: 512 KiB of definitions, 64 KiB per worker).
    ///
    /// # Errors
    /// [`AttachError::BadLayout`] for a zero parameter or a zone above 4 GiB.
    pub fn new(
        max_metrics: u32,
        workers: u32,
        slots_per_worker: u32,
    ) -> Result<MetricsLayout, AttachError> {
        let layout = MetricsLayout {
            max_metrics,
            workers,
            slots_per_worker,
        };
        if max_metrics == 0 || workers == 0 || slots_per_worker == 0 {
            return Err(AttachError::BadLayout("zero metrics, workers or slots"));
        }
        match layout.bytes() {
            Some(b) if b <= u32::MAX as usize => Ok(layout),
            _ => Err(AttachError::BadLayout("zone larger than 4 GiB")),
        }
    }

    pub(super) fn index_slots(&self) -> Option<usize> {
        (self.max_metrics as usize)
            .checked_mul(2)?
            .checked_next_power_of_two()
    }

    pub(super) fn defs_off(&self) -> Option<usize> {
        align_line(INDEX_OFF.checked_add(self.index_slots()?.checked_mul(4)?)?)
    }

    pub(super) fn slices_off(&self) -> Option<usize> {
        self.defs_off()?
            .checked_add((self.max_metrics as usize).checked_mul(DEF_SIZE)?)
    }

    pub(super) fn slice_stride(&self) -> Option<usize> {
        align_line((self.slots_per_worker as usize).checked_mul(8)?)
    }

    /// Bytes the zone needs (ask nginx for at least this much; extra bytes are unused).
    pub fn bytes(&self) -> Option<usize> {
        self.slices_off()?
            .checked_add(self.slice_stride()?.checked_mul(self.workers as usize)?)
    }
}
