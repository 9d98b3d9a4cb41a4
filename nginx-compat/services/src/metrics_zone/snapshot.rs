//! Reading every metric at once: [`MetricSnapshot`]s summed over the workers, their Prometheus
//! text, and the zone's usage and overflow counters.

use std::sync::atomic::Ordering;

use super::error::MetricsError;
use super::handle::MetricsZone;
use super::layout::{C_COUNT, C_NEXT_SLOT, C_OVERFLOW, D_GAUGE, D_SET};
use super::metric_kind::MetricKind;
use crate::exposition::{self, Series, Value};
/// One metric as read from the zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSnapshot {
    /// Id.
    pub id: u32,
    /// Name as defined.
    pub name: String,
    /// Kind.
    pub kind: MetricKind,
    /// Value summed over the workers.
    pub value: Value,
}

impl MetricsZone {
    /// Every metric with its value summed over the workers, in definition order.
    ///
    /// # Errors
    /// [`MetricsError::Corrupt`].
    pub fn snapshot(&self) -> Result<Vec<MetricSnapshot>, MetricsError> {
        let n = self.count()?.min(self.layout.max_metrics);
        let mut out = Vec::with_capacity(n as usize);
        for id in 0..n {
            let (kind, slot, nbuckets) = match self.def(id) {
                Ok(d) => d,
                Err(MetricsError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let name = String::from_utf8_lossy(&self.name_of(id)?).into_owned();
            let value = match kind {
                MetricKind::Counter => Value::Counter(self.sum_slot(slot)?),
                MetricKind::Gauge => Value::Gauge(
                    self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                        .load(Ordering::Relaxed) as i64,
                ),
                MetricKind::Histogram => {
                    let mut bounds = self.set_bounds(self.def32(id, D_SET)?)?;
                    bounds.truncate(nbuckets);
                    let counts = (0..=nbuckets)
                        .map(|b| self.sum_slot(slot.saturating_add(b)))
                        .collect::<Result<Vec<u64>, _>>()?;
                    let sum = self.sum_slot(slot.saturating_add(nbuckets).saturating_add(1))?;
                    Value::Histogram {
                        bounds,
                        counts,
                        sum,
                    }
                }
            };
            out.push(MetricSnapshot {
                id,
                name,
                kind,
                value,
            });
        }
        Ok(out)
    }

    /// Every metric in Prometheus text exposition format 0.0.4 (see [`crate::exposition`]);
    /// serve it with `Content-Type: text/plain; version=0.0.4`.
    ///
    /// # Errors
    /// [`MetricsError::Corrupt`].
    pub fn render(&self) -> Result<String, MetricsError> {
        let series: Vec<Series> = self
            .snapshot()?
            .into_iter()
            .map(|m| Series {
                name: m.name,
                value: m.value,
            })
            .collect();
        Ok(exposition::render(&series, &self.config.labels))
    }

    /// How many `define` calls were refused because the zone was full, since it was created
    /// (saturating at `u32::MAX`).
    pub fn overflow(&self) -> u32 {
        self.region
            .u32_at(C_OVERFLOW)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// Metrics defined so far, and slots used per worker.
    pub fn usage(&self) -> (u32, u32) {
        let load = |off| {
            self.region
                .u32_at(off)
                .map_or(0, |a| a.load(Ordering::Relaxed))
        };
        (load(C_COUNT), load(C_NEXT_SLOT))
    }
}
