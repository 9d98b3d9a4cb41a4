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
//! counter). The cache finds a series by what its labels are made of ([`Value`]): an index for a
//! value from a bounded set (method, status class, route, model, token type), the text for the
//! others (the other filters' signals, tenants). So the encoded name is written only when a
//! series is first defined, and a request whose series already exist allocates nothing here.
//! The number of series is bounded by the configuration (see the README); [`SeriesCache`] also
//! refuses to grow beyond `max` entries.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;

use tollgate_common::metrics::push_metric_name;

use crate::labels::Label;

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

/// A metric family (one of [`FAMILIES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// [`REQUESTS`].
    Requests,
    /// [`DURATION`].
    Duration,
    /// [`REQUEST_BYTES`].
    RequestBytes,
    /// [`RESPONSE_BYTES`].
    ResponseBytes,
    /// [`AUTH`].
    Auth,
    /// [`RATE_LIMIT`].
    RateLimit,
    /// [`LLM_TOKENS`].
    LlmTokens,
    /// [`LLM_COST`].
    LlmCost,
    /// [`LLM_REQUESTS`].
    LlmRequests,
}

impl Family {
    /// Every family, in the order of [`FAMILIES`].
    pub const ALL: [Family; 9] = [
        Family::Requests,
        Family::Duration,
        Family::RequestBytes,
        Family::ResponseBytes,
        Family::Auth,
        Family::RateLimit,
        Family::LlmTokens,
        Family::LlmCost,
        Family::LlmRequests,
    ];

    /// The family's metric name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Requests => REQUESTS,
            Family::Duration => DURATION,
            Family::RequestBytes => REQUEST_BYTES,
            Family::ResponseBytes => RESPONSE_BYTES,
            Family::Auth => AUTH,
            Family::RateLimit => RATE_LIMIT,
            Family::LlmTokens => LLM_TOKENS,
            Family::LlmCost => LLM_COST,
            Family::LlmRequests => LLM_REQUESTS,
        }
    }

    /// The family's metric type: a histogram for [`DURATION`], else a counter.
    pub fn kind(self) -> Kind {
        match self {
            Family::Duration => Kind::Histogram,
            _ => Kind::Counter,
        }
    }
}

/// The kind of a metric (proxy-wasm `MetricType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic counter.
    Counter,
    /// Histogram (Envoy: buckets from `stats_config.histogram_bucket_settings`).
    Histogram,
}

/// One label's value, as a series key holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// A value from a bounded set ([`Label`]): the key holds its index. The caller keeps the
    /// index-to-text mapping of each label of each family fixed (`crate::labels` does: the
    /// configuration does not change within a VM).
    Set(Label<'a>),
    /// Any other value (another filter's signal, a tenant): the key holds the text, already in
    /// the name encoding's form (`crate::labels::sanitize`), so that equal keys are equal names.
    Text(&'a str),
}

impl Value<'_> {
    /// The text the name encoding writes.
    pub fn text(&self) -> &str {
        match self {
            Value::Set(label) => label.text,
            Value::Text(text) => text,
        }
    }
}

/// Metric ids by series key, for one VM.
///
/// The key is the family and its labels' [`Value`]s (label names are compared, not hashed: they
/// are the fixed lists of `crate::record`). Hashes: a key made only of indices (family, route,
/// method, status class, model, token type) is hashed by [`mix`], a multiply-xorshift over the
/// indices, without a key: every index comes from a small set the configuration or this crate
/// fixes, so a client can pick among a few hundred keys at most, never craft colliding ones. A
/// key with text (signals, tenants: a tenant can be client-chosen through `unverified_header`)
/// is hashed with SipHash keyed per VM (`std::collections::hash_map::RandomState`, as
/// `HashMap`), so colliding texts cannot be computed from outside. Texts are compared with
/// [`same_bytes`], not `==`.
#[derive(Debug)]
pub struct SeriesCache {
    ids: HashTable<Series>,
    hasher: RandomState,
    buf: String,
    max: usize,
    refused: u64,
}

/// One defined series: its key, its encoded name and the host's id (`None`: refused by the host).
#[derive(Debug)]
struct Series {
    family: Family,
    labels: Box<[(&'static str, Part)]>,
    name: Box<str>,
    id: Option<u32>,
}

/// A stored [`Value`].
#[derive(Debug)]
enum Part {
    Index(u32),
    Text(Box<str>),
}

/// A key part, borrowed from a lookup's [`Value`] or a stored [`Part`]: the input of the hash.
#[derive(Clone, Copy)]
enum KeyPart<'a> {
    Index(u32),
    Text(&'a str),
}

impl<'a> From<&'a Value<'_>> for KeyPart<'a> {
    fn from(value: &'a Value<'_>) -> Self {
        match value {
            Value::Set(label) => KeyPart::Index(label.index),
            Value::Text(text) => KeyPart::Text(text),
        }
    }
}

impl<'a> From<&'a Part> for KeyPart<'a> {
    fn from(part: &'a Part) -> Self {
        match part {
            Part::Index(index) => KeyPart::Index(*index),
            Part::Text(text) => KeyPart::Text(text),
        }
    }
}

/// Mixes `value` into `hash` (the FxHash step: rotate, xor, multiply by an odd constant).
pub fn mix(hash: u64, value: u64) -> u64 {
    (hash.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// The key's hash: [`mix`] over the family, the indices (a text counts as a marker) and their
/// number, with a final avalanche so that hashbrown's bucket bits (low) and tag bits (high) both
/// depend on every part; when the key has text, SipHash (keyed by `hasher`) of that and the
/// texts.
fn key_hash<'a>(
    hasher: &RandomState,
    family: Family,
    parts: impl Iterator<Item = KeyPart<'a>> + Clone,
) -> u64 {
    const TEXT: u64 = u64::MAX;
    // A seed that is not 0 (which the step would keep at 0 through zero indices), the family,
    // each part, the number of parts.
    let mut hash = mix(0x243f_6a88_85a3_08d3, family as u64);
    let mut texts = false;
    let mut count = 0u64;
    for part in parts.clone() {
        count = count.wrapping_add(1);
        hash = match part {
            KeyPart::Index(index) => mix(hash, u64::from(index)),
            KeyPart::Text(_) => {
                texts = true;
                mix(hash, TEXT)
            }
        };
    }
    hash = mix(hash, count);
    hash ^= hash >> 32;
    hash = hash.wrapping_mul(0xd6e8_feb8_6659_fd93);
    hash ^= hash >> 32;
    if !texts {
        return hash;
    }
    let mut sip = hasher.build_hasher();
    sip.write_u64(hash);
    for part in parts {
        if let KeyPart::Text(text) = part {
            sip.write(text.as_bytes());
            sip.write_u8(0xff);
        }
    }
    sip.finish()
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

/// Whether a label name of a lookup is the stored one: the same literal (one address) or the
/// same bytes.
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || same_bytes(a.as_bytes(), b.as_bytes()))
}

impl Series {
    fn is(&self, family: Family, labels: &[(&'static str, Value<'_>)]) -> bool {
        self.family == family
            && self.labels.len() == labels.len()
            && self
                .labels
                .iter()
                .zip(labels)
                .all(|((name, part), (n, value))| {
                    same_name(name, n)
                        && match (part, value) {
                            (Part::Index(i), Value::Set(label)) => *i == label.index,
                            (Part::Text(t), Value::Text(text)) => {
                                same_bytes(t.as_bytes(), text.as_bytes())
                            }
                            _ => false,
                        }
                })
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

    /// The id of `family` with `labels` (in the family's fixed order); on first use, defines it
    /// with `define(kind, name)`, `name` as `tollgate_common::metrics::push_metric_name` writes
    /// it. `None` when the host refused the definition (then never retried: the cache keeps
    /// `None`) or the cache is full (then the value is dropped and counted in
    /// [`SeriesCache::refused`]).
    pub fn id(
        &mut self,
        family: Family,
        labels: &[(&'static str, Value<'_>)],
        define: impl FnOnce(Kind, &str) -> Option<u32>,
    ) -> Option<u32> {
        let hash = key_hash(
            &self.hasher,
            family,
            labels.iter().map(|(_, v)| KeyPart::from(v)),
        );
        if let Some(series) = self.ids.find(hash, |s| s.is(family, labels)) {
            return series.id;
        }
        if self.ids.len() >= self.max {
            self.refused = self.refused.saturating_add(1);
            return None;
        }
        let texts: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.text())).collect();
        push_metric_name(&mut self.buf, family.name(), &texts);
        let id = define(family.kind(), &self.buf);
        let stored = labels
            .iter()
            .map(|(name, value)| {
                let part = match value {
                    Value::Set(label) => Part::Index(label.index),
                    Value::Text(text) => Part::Text((*text).into()),
                };
                (*name, part)
            })
            .collect();
        let hasher = &self.hasher;
        self.ids.insert_unique(
            hash,
            Series {
                family,
                labels: stored,
                name: self.buf.as_str().into(),
                id,
            },
            |s| {
                key_hash(
                    hasher,
                    s.family,
                    s.labels.iter().map(|(_, p)| KeyPart::from(p)),
                )
            },
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

    /// xorshift64: a reproducible stream of choices.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn keys_find_the_series_their_names_name() {
        // Lookups drawn from small sets, with texts that share prefixes and lengths, against a
        // host that gives one id per encoded name (Envoy's idempotent define): every lookup must
        // return the id of the name `metric_name` writes for it, and every name is defined once.
        let routes = ["chat", "responses", "other"];
        let texts = [
            "acme",
            "acme-1",
            "acme-2",
            "beta",
            "ok",
            "okay",
            "a_b",
            "none-00000001",
        ];
        let names = ["result", "tenant"];
        let mut cache = SeriesCache::new(10_000);
        let mut host: std::collections::HashMap<String, u32> = Default::default();
        let mut defined = 0usize;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let r = next(&mut state);
            let family = Family::ALL[(r % 9) as usize];
            let pick = |shift: u32, n: usize| ((r >> shift) as usize) % n;
            let route = Label::nth(pick(8, 3), routes[pick(8, 3)]);
            let route = if route.text == "other" {
                Label::OTHER
            } else {
                route
            };
            let mut labels: Vec<(&'static str, Value<'_>)> = vec![("route", Value::Set(route))];
            if r >> 12 & 1 == 1 {
                labels.push((
                    names[pick(13, 2)],
                    Value::Text(texts[pick(16, texts.len())]),
                ));
            }
            if r >> 20 & 1 == 1 {
                labels.push(("decision", Value::Text(texts[pick(21, texts.len())])));
            }
            let want: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.text())).collect();
            let want = tollgate_common::metrics::metric_name(family.name(), &want);
            let got = cache.id(family, &labels, |kind, name| {
                assert_eq!(kind, family.kind());
                defined += 1;
                let next = u32::try_from(host.len()).unwrap();
                Some(*host.entry(name.to_string()).or_insert(next))
            });
            assert_eq!(got, host.get(&want).copied(), "{want}");
        }
        assert_eq!(defined, host.len(), "a name defined twice");
        assert_eq!(cache.len(), host.len());
        assert_eq!(cache.names().len(), host.len());
        assert!(host.len() > 500, "{} series", host.len());
    }

    #[test]
    fn index_only_keys_spread_over_the_table() {
        // The unkeyed hash of indices: distinct for every key of a large configuration (64
        // routes x 10 methods x 6 classes, 256 models x 2 types), so lookups never probe long.
        let mut seen = std::collections::HashSet::new();
        let hasher = RandomState::new();
        for family in Family::ALL {
            for a in (0..64).chain([u32::MAX]) {
                for b in (0..10).chain([u32::MAX]) {
                    for c in 0..6 {
                        let parts = [KeyPart::Index(a), KeyPart::Index(b), KeyPart::Index(c)];
                        assert!(seen.insert(key_hash(&hasher, family, parts.into_iter())));
                    }
                }
            }
            for m in (0..256).chain([u32::MAX]) {
                for t in 0..2 {
                    let parts = [KeyPart::Index(m), KeyPart::Index(t)];
                    assert!(seen.insert(key_hash(&hasher, family, parts.into_iter())));
                }
            }
        }
    }
}
