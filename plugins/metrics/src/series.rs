//! Metric families and the per-VM cache of metric ids.
//!
//! Names follow the Prometheus naming conventions (<https://prometheus.io/docs/practices/naming/>):
//! prefix `tollgate_`, counters end in `_total`, the unit is in the name. Labels are encoded in
//! the name by `tollgate_common::metrics::push_metric_name` (`family.label.value...`), in the
//! fixed order of each family's label list below; Envoy's `stats_tags` rules (`stats_tags.json`)
//! turn them back into labels.
//!
//! Series are defined lazily, once per VM per label combination (`proxy_define_metric` is
//! idempotent in Envoy: the same name gives the same stat, so the workers' VMs add to one
//! counter). The cache maps the encoded name to the id; a lookup reuses one buffer, so a request
//! whose series already exist allocates nothing here. The number of series is bounded by the
//! configuration (see the README); [`SeriesCache`] also refuses to grow beyond `max` entries.

use std::collections::HashMap;

use tollgate_common::metrics::push_metric_name;

/// Counter: requests, by `method`, `status_class`, `route`, `tenant` (as configured).
pub const REQUESTS: &str = "tollgate_requests_total";
/// Histogram: request duration in microseconds (integers: Envoy histograms record integers and
/// the ABI gives no unit, see the README), by `route`.
pub const DURATION: &str = "tollgate_request_duration_microseconds";
/// Counter: request body bytes, by `route`.
pub const REQUEST_BYTES: &str = "tollgate_request_body_bytes_total";
/// Counter: response body bytes, by `route`.
pub const RESPONSE_BYTES: &str = "tollgate_response_body_bytes_total";
/// Counter: jwt-auth outcomes, by `result`.
pub const AUTH: &str = "tollgate_auth_total";
/// Counter: rate-limit decisions, by `rule`, `decision`.
pub const RATE_LIMIT: &str = "tollgate_rate_limit_total";
/// Counter: LLM tokens, by `model`, `type` (`input`, `output`).
pub const LLM_TOKENS: &str = "tollgate_llm_tokens_total";
/// Counter: LLM spend in nano-USD (10^-9 USD), by `model`, `tenant`.
pub const LLM_COST: &str = "tollgate_llm_cost_nano_usd_total";
/// Counter: requests the cost filter saw, by `status` (`priced`, `unpriced`, `budget_exceeded`).
pub const LLM_REQUESTS: &str = "tollgate_llm_requests_total";

/// Every label name the families use (the `stats_tags` rules need one per name); kept in
/// tollgate-common so that the nginx host's exposition restores exactly these labels.
pub use tollgate_common::metrics::LABELS;

/// Every family.
pub const FAMILIES: [&str; 9] = [
    REQUESTS,
    DURATION,
    REQUEST_BYTES,
    RESPONSE_BYTES,
    AUTH,
    RATE_LIMIT,
    LLM_TOKENS,
    LLM_COST,
    LLM_REQUESTS,
];

/// The kind of a metric (proxy-wasm `MetricType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic counter.
    Counter,
    /// Histogram (Envoy: buckets from `stats_config.histogram_bucket_settings`).
    Histogram,
}

/// Metric ids by encoded name, for one VM.
#[derive(Debug)]
pub struct SeriesCache {
    ids: HashMap<String, Option<u32>>,
    buf: String,
    max: usize,
    refused: u64,
}

impl SeriesCache {
    /// An empty cache holding at most `max` series.
    pub fn new(max: usize) -> Self {
        SeriesCache {
            ids: HashMap::new(),
            buf: String::with_capacity(128),
            max,
            refused: 0,
        }
    }

    /// The id of `family` with `labels`; defines it with `define(kind, name)` on first use.
    /// `None` when the host refused the definition (then never retried: the cache keeps `None`)
    /// or the cache is full (then the value is dropped and counted in [`SeriesCache::refused`]).
    pub fn id(
        &mut self,
        kind: Kind,
        family: &str,
        labels: &[(&str, &str)],
        define: impl FnOnce(Kind, &str) -> Option<u32>,
    ) -> Option<u32> {
        push_metric_name(&mut self.buf, family, labels);
        if let Some(id) = self.ids.get(self.buf.as_str()) {
            return *id;
        }
        if self.ids.len() >= self.max {
            self.refused = self.refused.saturating_add(1);
            return None;
        }
        let id = define(kind, &self.buf);
        self.ids.insert(self.buf.clone(), id);
        id
    }

    /// Series defined (or refused by the host) so far.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no series was defined yet.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Values dropped because the cache was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The encoded names defined so far (sorted), for tests.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.ids.keys().cloned().collect();
        names.sort();
        names
    }
}
