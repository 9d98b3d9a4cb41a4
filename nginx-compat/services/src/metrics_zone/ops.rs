//! `proxy_increment_metric`, `proxy_record_metric` and `proxy_get_metric` on one metric
//! (the semantics in `metrics_zone/mod.rs`): writes go to the calling worker's slice, reads sum
//! the slices.

use std::sync::atomic::Ordering;

use super::error::MetricsError;
use super::handle::MetricsZone;
use super::layout::{D_GAUGE, D_SET};
use super::metric_kind::MetricKind;

impl MetricsZone {
    /// `proxy_increment_metric` (semantics in the module documentation).
    ///
    /// # Errors
    /// [`MetricsError::NotFound`], [`MetricsError::BadArgument`].
    pub fn increment(&self, id: u32, delta: i64) -> Result<(), MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => {
                let delta = u64::try_from(delta).map_err(|_| MetricsError::BadArgument)?;
                if delta == 0 {
                    return Err(MetricsError::BadArgument);
                }
                self.slot(self.worker, slot)?
                    .fetch_add(delta, Ordering::Relaxed);
                Ok(())
            }
            (MetricKind::Gauge, _, _) => {
                // Two's complement: adding the bit pattern of a negative delta subtracts.
                self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                    .fetch_add(delta as u64, Ordering::Relaxed);
                Ok(())
            }
            (MetricKind::Histogram, _, _) => Err(MetricsError::BadArgument),
        }
    }

    /// `proxy_record_metric` (semantics in the module documentation).
    ///
    /// # Errors
    /// [`MetricsError::NotFound`].
    pub fn record(&self, id: u32, value: u64) -> Result<(), MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => {
                self.slot(self.worker, slot)?
                    .fetch_add(value, Ordering::Relaxed);
            }
            (MetricKind::Gauge, _, _) => {
                self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                    .store(value, Ordering::Relaxed);
            }
            (MetricKind::Histogram, slot, nbuckets) => {
                let set = self.def32(id, D_SET)?;
                let mut bucket = nbuckets;
                for i in 0..nbuckets {
                    if value <= self.set_bound(set, i)? {
                        bucket = i;
                        break;
                    }
                }
                self.slot(self.worker, slot.saturating_add(bucket))?
                    .fetch_add(1, Ordering::Relaxed);
                self.slot(self.worker, slot.saturating_add(nbuckets).saturating_add(1))?
                    .fetch_add(value, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    pub(super) fn sum_slot(&self, slot: usize) -> Result<u64, MetricsError> {
        (0..self.layout.workers).try_fold(0u64, |acc, w| {
            Ok(acc.wrapping_add(self.slot(w, slot)?.load(Ordering::Relaxed)))
        })
    }

    /// `proxy_get_metric`: a counter summed over the workers, or a gauge's value.
    ///
    /// # Errors
    /// [`MetricsError::NotFound`]; [`MetricsError::BadArgument`] for a histogram (as Envoy).
    pub fn get(&self, id: u32) -> Result<u64, MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => self.sum_slot(slot),
            (MetricKind::Gauge, _, _) => Ok(self
                .f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                .load(Ordering::Relaxed)),
            (MetricKind::Histogram, _, _) => Err(MetricsError::BadArgument),
        }
    }
}
