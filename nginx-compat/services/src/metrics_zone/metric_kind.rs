//! The proxy-wasm metric types (`MetricType`: counter, gauge, histogram).
/// proxy-wasm `MetricType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Monotonic counter.
    Counter = 0,
    /// Gauge.
    Gauge = 1,
    /// Histogram.
    Histogram = 2,
}

impl MetricKind {
    pub(super) fn from_u32(v: u32) -> Option<MetricKind> {
        match v {
            0 => Some(MetricKind::Counter),
            1 => Some(MetricKind::Gauge),
            2 => Some(MetricKind::Histogram),
            _ => None,
        }
    }
}
