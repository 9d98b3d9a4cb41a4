//! Histogram bucket bounds: the default ([`DEFAULT_BUCKETS`]) and the bounds chosen by name
//! prefix ([`HistogramBuckets`]), stored in the zone when a histogram is defined.

use super::layout::{MAX_BUCKETS, MAX_SETS};
/// The buckets of `tollgate_request_duration_microseconds` in `envoy/metrics.yaml`
/// (`histogram_bucket_settings`), in microseconds: the default for every histogram.
pub const DEFAULT_BUCKETS: [u64; 13] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// An invalid bucket configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBuckets(pub String);

impl std::fmt::Display for BadBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadBuckets {}

/// Histogram bucket bounds by name prefix (the ABI carries none; Envoy's
/// `stats_config.histogram_bucket_settings`). The first rule whose prefix the metric's raw name
/// starts with applies, else the default. Bounds are inclusive upper bounds (`le`), strictly
/// increasing, 1 to [`MAX_BUCKETS`] of them. Applied when a histogram is defined: the bounds are
/// stored in the zone with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramBuckets {
    default: Vec<u64>,
    rules: Vec<(String, Vec<u64>)>,
}

impl Default for HistogramBuckets {
    /// [`DEFAULT_BUCKETS`] for every histogram.
    fn default() -> Self {
        HistogramBuckets {
            default: DEFAULT_BUCKETS.to_vec(),
            rules: Vec::new(),
        }
    }
}

fn check_bounds(bounds: &[u64]) -> Result<(), BadBuckets> {
    if bounds.is_empty() || bounds.len() > MAX_BUCKETS {
        return Err(BadBuckets(format!(
            "histogram buckets: {} bounds, expected 1 to {MAX_BUCKETS}",
            bounds.len()
        )));
    }
    if bounds.windows(2).any(|w| w.first() >= w.get(1)) {
        return Err(BadBuckets(
            "histogram buckets must be strictly increasing".into(),
        ));
    }
    Ok(())
}

impl HistogramBuckets {
    /// `bounds` for every histogram no rule matches.
    ///
    /// # Errors
    /// [`BadBuckets`] (see the type documentation).
    pub fn with_default(bounds: Vec<u64>) -> Result<HistogramBuckets, BadBuckets> {
        check_bounds(&bounds)?;
        Ok(HistogramBuckets {
            default: bounds,
            rules: Vec::new(),
        })
    }

    /// Adds a rule: histograms whose name starts with `prefix` get `bounds`.
    ///
    /// # Errors
    /// [`BadBuckets`] (see the type documentation), or more than 15 distinct bucket sets.
    pub fn rule(mut self, prefix: &str, bounds: Vec<u64>) -> Result<HistogramBuckets, BadBuckets> {
        check_bounds(&bounds)?;
        self.rules.push((prefix.to_string(), bounds));
        let mut distinct: Vec<&Vec<u64>> = vec![&self.default];
        for (_, b) in &self.rules {
            if !distinct.contains(&b) {
                distinct.push(b);
            }
        }
        if distinct.len() > MAX_SETS {
            return Err(BadBuckets(format!(
                "more than {MAX_SETS} distinct bucket sets"
            )));
        }
        Ok(self)
    }

    /// The bounds for a histogram named `name`.
    pub fn for_name(&self, name: &str) -> &[u64] {
        self.rules
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
            .map_or(&self.default, |(_, b)| b)
    }
}
