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

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;

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
///
/// A hash table of names (SipHash keyed per VM, as `std::collections::HashMap`: label values come
/// from requests) whose lookups compare names with [`same_bytes`], not `==`.
#[derive(Debug)]
pub struct SeriesCache {
    ids: HashTable<Series>,
    hasher: RandomState,
    buf: String,
    max: usize,
    refused: u64,
}

/// One defined series: its encoded name and the host's id (`None`: refused by the host).
#[derive(Debug)]
struct Series {
    name: Box<str>,
    id: Option<u32>,
}

/// Byte equality, 8 bytes per step. In wasm, `==` on slices calls wasi-libc's `memcmp`, which
/// compares one byte per iteration: about 1,200 instructions for one ~80-byte encoded name, 10
/// names a request (bench/results/instructions_issue21_allocations.md).
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |w: &[u8; 8]| u64::from_ne_bytes(*w);
    // The last 8 bytes (overlapping the last whole word) stand for the tail; under 8 bytes, `==`.
    match (a.last_chunk::<8>(), b.last_chunk::<8>()) {
        (Some(a_last), Some(b_last)) => {
            word(a_last) == word(b_last)
                && a.as_chunks::<8>()
                    .0
                    .iter()
                    .zip(b.as_chunks::<8>().0)
                    .all(|(x, y)| word(x) == word(y))
        }
        _ => a == b,
    }
}

impl SeriesCache {
    /// An empty cache holding at most `max` series.
    pub fn new(max: usize) -> Self {
        SeriesCache {
            ids: HashTable::new(),
            hasher: RandomState::new(),
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
        let name = self.buf.as_bytes();
        let hash = self.hasher.hash_one(name);
        if let Some(series) = self.ids.find(hash, |s| same_bytes(s.name.as_bytes(), name)) {
            return series.id;
        }
        if self.ids.len() >= self.max {
            self.refused = self.refused.saturating_add(1);
            return None;
        }
        let id = define(kind, &self.buf);
        let hasher = &self.hasher;
        self.ids.insert_unique(
            hash,
            Series {
                name: self.buf.as_str().into(),
                id,
            },
            |s| hasher.hash_one(s.name.as_bytes()),
        );
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
        let mut names: Vec<String> = self.ids.iter().map(|s| s.name.to_string()).collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_agrees_with_slice_equality() {
        // Every length around the 8-byte steps, a difference at every position, and lengths
        // that differ by one (a name and its prefix).
        for len in 0..40usize {
            let a: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            assert!(same_bytes(&a, &a.clone()));
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert_eq!(same_bytes(&a, &b), a == b, "len {len}, at {at}");
                assert!(!same_bytes(&a, &b));
            }
            assert!(!same_bytes(&a, &a[..len.saturating_sub(1)]) || len == 0);
        }
    }
}
