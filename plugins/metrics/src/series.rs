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
//! counter). The cache finds a series by what its labels are made of ([`Value`]): numbers for
//! values from bounded sets (a method, status class, route, model or token type's position; a
//! tenant's number in `crate::tenants`; the first [`MAX_WORDS`] values of another filter's
//! signal), the text for the rest. So the encoded name is written only when a series is first
//! defined, and a request whose series already exist allocates nothing here.
//! The number of series is bounded by the configuration (see the README); [`SeriesCache`] also
//! refuses to grow beyond `max` entries.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;

use tollgate_common::bytes::same_bytes;
use tollgate_common::metrics::push_metric_name;

use crate::labels::{signal_label, Label};

/// Counter: requests, by `method`, `status_class`, `route`, `tenant` (as configured).
pub const REQUESTS: &str = "tollgate_requests_total";
/// Histogram: request duration in microseconds (integers: Envoy histograms record integers and
/// the ABI gives no unit, see the README), by `route`.
pub const DURATION: &str = "tollgate_request_duration_microseconds";
/// Counter: request body bytes, by `route`.
pub const REQUEST_BYTES: &str = "tollgate_request_body_bytes_total";
/// Counter: response body bytes, by `route`.
pub const RESPONSE_BYTES: &str = "tollgate_response_body_bytes_total";
/// Counter: jwt-auth outcomes, by `outcome`.
pub const AUTH: &str = "tollgate_auth_total";
/// Counter: rate-limit decisions, by `rule`, `outcome`.
pub const RATE_LIMIT: &str = "tollgate_rate_limit_total";
/// Counter: LLM tokens, by `model`, `type` (`input`, `output`, `cached_input`,
/// `cache_creation`, `reasoning`: the last three are parts of the first two), `tenant`.
pub const LLM_TOKENS: &str = "tollgate_llm_tokens_total";
/// Counter: LLM spend in nano-USD (10^-9 USD), by `model`, `tenant`.
pub const LLM_COST: &str = "tollgate_llm_cost_nano_usd_total";
/// Counter: requests the cost filter saw, by `outcome` (`priced`, `unpriced`, `budget_exceeded`, ...).
pub const LLM_REQUESTS: &str = "tollgate_llm_requests_total";
/// Histogram: time to first token in microseconds (integers, as [`DURATION`]): from the request
/// headers to the first response body byte of a 2xx response to a request that named a model
/// (the cost filter's model signal), by `model`.
pub const TIME_TO_FIRST_TOKEN: &str = "tollgate_llm_time_to_first_token_microseconds";
/// Counter: requests a filter refused, by `filter` (`jwt_auth`, `rate_limit`, `cost`) and
/// `reason` (the refusing filter's outcome: `expired`, `limited`, `budget_exceeded`, ...).
pub const REFUSALS: &str = "tollgate_refusals_total";

/// Every label name the families use (the `stats_tags` rules need one per name); kept in
/// tollgate-common so that the nginx host's exposition restores exactly these labels.
pub use tollgate_common::metrics::LABELS;

/// Every family.
pub const FAMILIES: [&str; 11] = [
    REQUESTS,
    DURATION,
    REQUEST_BYTES,
    RESPONSE_BYTES,
    AUTH,
    RATE_LIMIT,
    LLM_TOKENS,
    LLM_COST,
    LLM_REQUESTS,
    TIME_TO_FIRST_TOKEN,
    REFUSALS,
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
    /// [`TIME_TO_FIRST_TOKEN`].
    TimeToFirstToken,
    /// [`REFUSALS`].
    Refusals,
}

impl Family {
    /// Every family, in the order of [`FAMILIES`].
    pub const ALL: [Family; 11] = [
        Family::Requests,
        Family::Duration,
        Family::RequestBytes,
        Family::ResponseBytes,
        Family::Auth,
        Family::RateLimit,
        Family::LlmTokens,
        Family::LlmCost,
        Family::LlmRequests,
        Family::TimeToFirstToken,
        Family::Refusals,
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
            Family::TimeToFirstToken => TIME_TO_FIRST_TOKEN,
            Family::Refusals => REFUSALS,
        }
    }

    /// The family's metric type: a histogram for [`DURATION`] and [`TIME_TO_FIRST_TOKEN`],
    /// else a counter.
    pub fn kind(self) -> Kind {
        match self {
            Family::Duration | Family::TimeToFirstToken => Kind::Histogram,
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
    /// A value from a bounded set ([`Label`]): the key holds its index, up to [`MAX_NUMBER`]
    /// (else its text, in the name encoding's form). The caller keeps the index-to-text mapping
    /// of each label of each family fixed (`crate::labels` and `crate::tenants` do: the
    /// configuration does not change within a VM, nor a tenant's number).
    Set(Label<'a>),
    /// A value from a small vocabulary another filter fixes (its signals: jwt-auth's results,
    /// rate-limit's decisions and rule names, cost's statuses), as published: the label is
    /// [`signal_label`] of it. The cache numbers the first [`MAX_WORDS`] distinct labels of each
    /// label of each family and keys them by number; any further one is keyed by its text.
    Word(&'a str),
}

impl Value<'_> {
    /// The text the name encoding writes.
    pub fn text(&self) -> &str {
        match self {
            Value::Set(label) => label.text,
            Value::Word(text) => text,
        }
    }
}

/// Most labels of one series.
pub const MAX_LABELS: usize = 4;
/// Most [`Value::Word`]s the cache numbers per label of a family.
pub const MAX_WORDS: usize = 16;

/// How a [`Value::Word`] is keyed.
enum Numbering {
    /// By its number.
    Number(u32),
    /// By its text (the label's words were numbered up to [`MAX_WORDS`]).
    Text,
    /// Not in [`signal_label`]'s form: keyed as its label.
    Sanitize,
}

/// Bits per label in a [`Key`].
const FIELD_BITS: u32 = 14;
/// The field of `other` ([`Label::OTHER`], index `u32::MAX`).
const OTHER_FIELD: u32 = (1 << FIELD_BITS) - 1;
/// The field of a label keyed by its text; numbers from here up are keyed by their text too.
const TEXT_FIELD: u32 = OTHER_FIELD - 1;
/// The largest number a series key holds as a number (larger ones: the label's text).
pub const MAX_NUMBER: u32 = TEXT_FIELD - 1;

/// A series key's family and numbers, packed: the family (bits 0-3), the number of labels
/// (4-6), then 14 bits per label: its number, [`OTHER_FIELD`] for `other`, [`TEXT_FIELD`] for a
/// label keyed by its text (whose texts go beside, in a [`Texted`] entry).
type Key = u64;

/// A series keyed by numbers only.
#[derive(Debug)]
struct Numbered {
    key: Key,
    id: Option<u32>,
}

/// A series with labels keyed by their text.
#[derive(Debug)]
struct Texted {
    key: Key,
    /// The texts of the labels whose field is [`TEXT_FIELD`], in label order.
    texts: Box<[Box<str>]>,
    id: Option<u32>,
}

/// Metric ids by series key, for one VM.
///
/// The key is the family and its labels' values ([`Value`]; a family's label names are the same
/// on every call, see [`SeriesCache::id`]): each value a number (a [`Value::Set`] index, a
/// numbered [`Value::Word`]) or, past the numbers, a text. Two tables:
///
/// - keys made only of numbers, packed into a `u64`, hashed by an unkeyed avalanche of that
///   ([`avalanche`], a bijection of `u64`): every number is a position in a set that the
///   configuration, this crate or this VM fixes, never a value a client writes: a route, a
///   method, a model; a word among the first [`MAX_WORDS`] of another filter's vocabulary; a
///   tenant's number, which the VM gives admitted tenants in the order it sees them (a client
///   with a tenant of its choosing decides how many are admitted, at most `max_tenants` per
///   generation, not which numbers they get). So the keys are small consecutive integers
///   combined, and a client cannot craft colliding ones;
/// - keys with text (a tenant past [`crate::tenants::MAX_NUMBERED`], which can be client-chosen
///   through `unverified_header`; a word past the first [`MAX_WORDS`]): hashed with SipHash
///   keyed per VM (`std::collections::hash_map::RandomState`, as `HashMap`), so colliding texts
///   cannot be computed from outside; texts compared with [`same_bytes`], not `==`.
///
/// Together they hold at most `max` series.
#[derive(Debug)]
pub struct SeriesCache<S = RandomState> {
    numbered: HashTable<Numbered>,
    texted: HashTable<Texted>,
    hasher: S,
    /// The label names of each family's first call (`Family as usize`).
    label_names: Vec<Option<Box<[&'static str]>>>,
    /// The numbered words of each label position of each family (`family * MAX_LABELS +
    /// position`), in the order first seen; a word's number is its position here.
    words: Vec<Vec<Box<str>>>,
    buf: String,
    max: usize,
    refused: u64,
}

/// An unkeyed 64-bit finaliser (MurmurHash3's `fmix64`): every bit of `key` reaches hashbrown's
/// bucket bits (low) and tag bits (high).
pub fn avalanche(key: u64) -> u64 {
    let mut h = key;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// SipHash (keyed by `hasher`) of a [`Texted`] key: the packed numbers and each text.
fn text_hash<'a>(hasher: &impl BuildHasher, key: Key, texts: impl Iterator<Item = &'a str>) -> u64 {
    let mut sip = hasher.build_hasher();
    sip.write_u64(key);
    for text in texts {
        sip.write(text.as_bytes());
        sip.write_u8(0xff);
    }
    sip.finish()
}

/// Whether two label name lists are the same: the same literals (one address each) or the same
/// bytes.
fn same_names(a: &[&str], b: &[(&'static str, Value<'_>)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, (y, _))| {
            x.len() == y.len()
                && (std::ptr::eq(x.as_ptr(), y.as_ptr()) || same_bytes(x.as_bytes(), y.as_bytes()))
        })
}

impl SeriesCache {
    /// An empty cache holding at most `max` series.
    pub fn new(max: usize) -> Self {
        SeriesCache::with_hasher(max, RandomState::new())
    }
}

impl<S: BuildHasher> SeriesCache<S> {
    /// An empty cache holding at most `max` series, hashing texts with `hasher` (tests: a
    /// hasher whose collisions leave every decision to the comparison).
    pub fn with_hasher(max: usize, hasher: S) -> Self {
        SeriesCache {
            numbered: HashTable::new(),
            texted: HashTable::new(),
            hasher,
            label_names: Family::ALL.iter().map(|_| None).collect(),
            words: (0..Family::ALL.len().saturating_mul(MAX_LABELS))
                .map(|_| Vec::new())
                .collect(),
            buf: String::with_capacity(128),
            max,
            refused: 0,
        }
    }

    /// The number of `word` at label `position` of `family`: its position among the words seen
    /// there, the next one while fewer than [`MAX_WORDS`] were. A word is first looked for as it
    /// is: the words kept are in the form [`signal_label`] gives (clean, 1 to 32 bytes), which
    /// leaves them as they are, so one found is its own label and needs no check.
    fn number(&mut self, family: Family, position: usize, word: &str) -> Numbering {
        let Some(words) = (family as usize)
            .checked_mul(MAX_LABELS)
            .and_then(|at| at.checked_add(position))
            .and_then(|at| self.words.get_mut(at))
        else {
            return Numbering::Text;
        };
        if let Some(n) = words
            .iter()
            .position(|w| same_bytes(w.as_bytes(), word.as_bytes()))
        {
            return u32::try_from(n).map_or(Numbering::Text, Numbering::Number);
        }
        if !matches!(signal_label(word), Cow::Borrowed(label) if std::ptr::eq(label, word)) {
            return Numbering::Sanitize;
        }
        if words.len() >= MAX_WORDS {
            return Numbering::Text;
        }
        words.push(word.into());
        u32::try_from(words.len().saturating_sub(1)).map_or(Numbering::Text, Numbering::Number)
    }

    /// [`SeriesCache::id`] of `labels` whose words are not all in [`signal_label`]'s form: the
    /// same with each word replaced by its label (apart: the other filters publish their
    /// signals in that form).
    #[cold]
    #[inline(never)]
    fn id_of_labels(
        &mut self,
        family: Family,
        labels: &[(&'static str, Value<'_>)],
        define: impl FnOnce(Kind, &str) -> Option<u32>,
    ) -> Option<u32> {
        let words: Vec<Cow<'_, str>> = labels
            .iter()
            .map(|(_, v)| match v {
                Value::Word(word) => signal_label(word),
                Value::Set(_) => Cow::Borrowed(""),
            })
            .collect();
        let labels: Vec<(&'static str, Value<'_>)> = labels
            .iter()
            .zip(&words)
            .map(|((name, value), word)| match value {
                Value::Word(_) => (*name, Value::Word(word)),
                other => (*name, *other),
            })
            .collect();
        self.id(family, &labels, define)
    }

    /// Whether `labels` has the label names of `family`'s first call (recording them then).
    fn names_match(&mut self, family: Family, labels: &[(&'static str, Value<'_>)]) -> bool {
        match self.label_names.get_mut(family as usize) {
            Some(Some(names)) => same_names(names, labels),
            Some(slot) => {
                *slot = Some(labels.iter().map(|(n, _)| *n).collect());
                true
            }
            None => false,
        }
    }

    /// The id of `family` with `labels` (in the family's fixed order, at most [`MAX_LABELS`]);
    /// on first use, defines it with `define(kind, name)`, `name` as
    /// `tollgate_common::metrics::push_metric_name` writes it. A family's label names are those
    /// of its first call on every call (`crate::record`'s fixed lists; for
    /// `tollgate_requests_total`, the configuration's): they are not part of the key. `None`
    /// when the host refused the definition (then never retried: the cache keeps `None`) or the
    /// cache is full (then the value is dropped and counted in [`SeriesCache::refused`]; so is a
    /// call with more than [`MAX_LABELS`] labels, or one that would define a series with other
    /// label names, which `crate::record` never makes; debug builds panic on any call with
    /// other names).
    pub fn id(
        &mut self,
        family: Family,
        labels: &[(&'static str, Value<'_>)],
        define: impl FnOnce(Kind, &str) -> Option<u32>,
    ) -> Option<u32> {
        // The label names are not part of the key: a family's are fixed (`crate::record`'s
        // lists). Checked on every call in debug builds (the tests), on a definition always.
        debug_assert!(
            self.names_match(family, labels),
            "{family:?}: label names differ from the first call's"
        );
        if labels.len() > MAX_LABELS {
            return self.refuse();
        }
        // Family, count and fields; a label keyed by its text also goes into `texts`.
        let mut key: Key = (family as u64) | ((labels.len() as u64) << 4);
        let mut texts: [&str; MAX_LABELS] = [""; MAX_LABELS];
        let mut text_count = 0usize;
        let mut shift = 7u32;
        for (position, (_, value)) in labels.iter().enumerate() {
            let number = match value {
                Value::Set(label) => Some(label.index),
                Value::Word(word) => match self.number(family, position, word) {
                    Numbering::Number(n) => Some(n),
                    Numbering::Text => None,
                    Numbering::Sanitize => return self.id_of_labels(family, labels, define),
                },
            };
            let field = match number {
                Some(u32::MAX) => OTHER_FIELD,
                Some(n) if n < TEXT_FIELD => n,
                _ => {
                    if let Some(slot) = texts.get_mut(text_count) {
                        *slot = value.text();
                        text_count = text_count.saturating_add(1);
                    }
                    TEXT_FIELD
                }
            };
            key |= u64::from(field).checked_shl(shift).unwrap_or(0);
            shift = shift.saturating_add(FIELD_BITS);
        }
        let texts = texts.get(..text_count).unwrap_or_default();
        let hash = if texts.is_empty() {
            let hash = avalanche(key);
            if let Some(series) = self.numbered.find(hash, |s| s.key == key) {
                return series.id;
            }
            hash
        } else {
            let hash = text_hash(&self.hasher, key, texts.iter().copied());
            let found = self.texted.find(hash, |s| {
                s.key == key
                    && s.texts.len() == texts.len()
                    && s.texts
                        .iter()
                        .zip(texts)
                        .all(|(a, b)| same_bytes(a.as_bytes(), b.as_bytes()))
            });
            if let Some(series) = found {
                return series.id;
            }
            hash
        };
        self.define(family, labels, key, hash, texts, define)
    }

    /// [`SeriesCache::id`] of a series not in the cache: defines and caches it (apart, so that
    /// the lookups' code stays small).
    #[cold]
    #[inline(never)]
    fn define(
        &mut self,
        family: Family,
        labels: &[(&'static str, Value<'_>)],
        key: Key,
        hash: u64,
        texts: &[&str],
        define: impl FnOnce(Kind, &str) -> Option<u32>,
    ) -> Option<u32> {
        if self.len() >= self.max || !self.names_match(family, labels) {
            return self.refuse();
        }
        let named: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.text())).collect();
        push_metric_name(&mut self.buf, family.name(), &named);
        let id = define(family.kind(), &self.buf);
        if texts.is_empty() {
            self.numbered
                .insert_unique(hash, Numbered { key, id }, |s| avalanche(s.key));
        } else {
            let hasher = &self.hasher;
            let texts = texts.iter().map(|t| Box::from(*t)).collect();
            self.texted
                .insert_unique(hash, Texted { key, texts, id }, |s| {
                    text_hash(hasher, s.key, s.texts.iter().map(|t| &**t))
                });
        }
        id
    }

    /// Counts a dropped value.
    #[cold]
    fn refuse(&mut self) -> Option<u32> {
        self.refused = self.refused.saturating_add(1);
        None
    }

    /// Series defined (or refused by the host) so far.
    pub fn len(&self) -> usize {
        self.numbered.len().saturating_add(self.texted.len())
    }

    /// Whether no series was defined yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values dropped because the cache was full (or the call was malformed).
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// xorshift64: a reproducible stream of choices.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// A hasher under which every text key collides.
    #[derive(Default)]
    struct Colliding;

    impl BuildHasher for Colliding {
        type Hasher = ConstantHasher;
        fn build_hasher(&self) -> ConstantHasher {
            ConstantHasher
        }
    }

    struct ConstantHasher;

    impl Hasher for ConstantHasher {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn keys_find_the_series_their_names_name() {
        lookups_agree_with_names(SeriesCache::new(10_000));
        lookups_agree_with_names(SeriesCache::with_hasher(10_000, Colliding));
    }

    fn lookups_agree_with_names<S: BuildHasher>(mut cache: SeriesCache<S>) {
        // Lookups drawn from small sets, with texts that share prefixes and lengths and more
        // words than the cache numbers per label (both kinds of key), against a
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
        let words: Vec<&'static str> = (0..MAX_WORDS + 8)
            .map(|i| &*format!("w{i}").leak())
            .collect();
        let mut host: std::collections::HashMap<String, u32> = Default::default();
        let mut defined = 0usize;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let r = next(&mut state);
            let family = Family::ALL[(r % Family::ALL.len() as u64) as usize];
            let pick = |shift: u32, n: usize| ((r >> shift) as usize) % n;
            let route = Label::nth(pick(8, 3), routes[pick(8, 3)]);
            let route = if route.text == "other" {
                Label::OTHER
            } else {
                route
            };
            // Each family its own fixed label list: route, then a text, a word, or both.
            let shape = family as usize % 4;
            let mut labels: Vec<(&'static str, Value<'_>)> = vec![("route", Value::Set(route))];
            if shape & 1 == 1 {
                labels.push((
                    names[family as usize % 2],
                    Value::Set(Label::unnumbered(texts[pick(16, texts.len())])),
                ));
            }
            if shape & 2 == 2 {
                // More words than the cache numbers: both the numbered and the text keys.
                labels.push(("decision", Value::Word(words[pick(21, words.len())])));
            }
            let want: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.text())).collect();
            let want = tollgate_common::metrics::metric_name(family.name(), &want);
            let got = cache.id(family, &labels, |kind, name| {
                assert_eq!(kind, family.kind());
                defined += 1;
                let next = u32::try_from(host.len()).unwrap();
                Some(*host.entry(name.to_string()).or_insert(next))
            });
            assert!(got.is_some(), "{want} refused");
            assert_eq!(got, host.get(&want).copied(), "{want}");
        }
        assert_eq!(cache.refused(), 0);
        assert_eq!(defined, host.len(), "a name defined twice");
        assert_eq!(cache.len(), host.len());
        assert!(host.len() > 500, "{} series", host.len());
    }

    #[test]
    fn a_family_keeps_its_label_names() {
        let mut cache = SeriesCache::new(10);
        let mut names = Vec::new();
        let mut define = |_: Kind, name: &str| {
            names.push(name.to_string());
            u32::try_from(names.len()).ok()
        };
        let ok = Value::Word("ok");
        assert_eq!(
            cache.id(Family::Auth, &[("result", ok)], &mut define),
            Some(1)
        );
        let same = String::from("result").leak();
        assert_eq!(cache.id(Family::Auth, &[(same, ok)], &mut define), Some(1));
        let five = [("a", ok), ("b", ok), ("c", ok), ("d", ok), ("e", ok)];
        assert_eq!(cache.id(Family::RateLimit, &five, &mut define), None);
        assert_eq!(cache.refused(), 1);
        assert_eq!(names, ["tollgate_auth_total.result.ok"]);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "label names differ")]
    fn other_label_names_are_a_bug() {
        let mut cache = SeriesCache::new(10);
        let ok = Value::Word("ok");
        cache.id(Family::Auth, &[("result", ok)], |_, _| Some(1));
        cache.id(Family::Auth, &[("status", ok)], |_, _| Some(2));
    }

    #[test]
    fn a_definition_with_other_label_names_is_refused() {
        // What release builds check: a new series is defined only with the family's names.
        let mut cache = SeriesCache::new(10);
        let mut names = Vec::new();
        let mut define = |_: Kind, name: &str| {
            names.push(name.to_string());
            u32::try_from(names.len()).ok()
        };
        let first = [("result", Value::Word("ok"))];
        assert_eq!(cache.id(Family::Auth, &first, &mut define), Some(1));
        let two = [
            ("result", Value::Word("no")),
            ("decision", Value::Word("x")),
        ];
        assert!(!cache.names_match(Family::Auth, &two));
        assert_eq!(
            cache.define(Family::Auth, &two, 0, 0, &[], &mut define),
            None
        );
        assert_eq!(cache.refused(), 1);
        assert_eq!(names, ["tollgate_auth_total.result.ok"]);
    }

    #[test]
    fn numbers_beyond_the_fields_are_keyed_by_text() {
        // An index too large for a 14-bit field and the 17th word of a label are keyed by their
        // text: still one series per name.
        let mut cache = SeriesCache::new(100);
        let mut n = 0;
        let mut define = |_: Kind, _: &str| {
            n += 1;
            Some(n)
        };
        let big = Value::Set(Label {
            index: 70_000,
            text: "big",
        });
        let big2 = Value::Set(Label {
            index: 70_001,
            text: "big2",
        });
        assert_eq!(
            cache.id(Family::Duration, &[("route", big)], &mut define),
            Some(1)
        );
        assert_eq!(
            cache.id(Family::Duration, &[("route", big2)], &mut define),
            Some(2)
        );
        assert_eq!(
            cache.id(Family::Duration, &[("route", big)], &mut define),
            Some(1)
        );
        let words: Vec<String> = (0..=MAX_WORDS).map(|i| format!("w{i}")).collect();
        for round in 0..2 {
            for (i, w) in words.iter().enumerate() {
                let id = cache.id(Family::Auth, &[("result", Value::Word(w))], &mut define);
                assert_eq!(id, Some(3 + i as u32), "round {round}, {w}");
            }
        }
        assert_eq!(cache.len(), 2 + MAX_WORDS + 1);
        assert_eq!(cache.texted.len(), 2 + 1);
        // The widest numbers that fit: all 14 bits count.
        let wide = Value::Set(Label {
            index: TEXT_FIELD - 1,
            text: "wide",
        });
        let low = Value::Set(Label {
            index: (TEXT_FIELD - 1) & 0xff,
            text: "low",
        });
        let bytes = |v| [("route", v)];
        let first = cache.id(Family::RequestBytes, &bytes(wide), &mut define);
        let second = cache.id(Family::RequestBytes, &bytes(low), &mut define);
        assert_ne!(first, second);
        assert_eq!(
            cache.id(Family::RequestBytes, &bytes(wide), &mut define),
            first
        );
        assert_eq!(cache.texted.len(), 2 + 1, "numbered");
    }

    #[test]
    fn words_are_keyed_as_their_labels() {
        // Published values in another form than signal_label's are the series of their label,
        // before and after the label's words are all numbered.
        let mut cache = SeriesCache::new(100);
        let mut host: std::collections::HashMap<String, u32> = Default::default();
        let mut defined = 0;
        let mut id = |cache: &mut SeriesCache, word: &str| {
            cache.id(Family::Auth, &[("result", Value::Word(word))], |_, name| {
                defined += 1;
                let next = host.len() as u32;
                Some(*host.entry(name.to_string()).or_insert(next))
            })
        };
        let long = "x".repeat(33);
        for round in 0..2 {
            assert_eq!(
                id(&mut cache, "Bad.Sig"),
                id(&mut cache, "bad_sig"),
                "{round}"
            );
            assert_eq!(id(&mut cache, ""), id(&mut cache, "other"), "{round}");
            assert_eq!(id(&mut cache, &long), id(&mut cache, "other"), "{round}");
            for i in 0..MAX_WORDS {
                id(&mut cache, &format!("w{i}"));
            }
        }
        assert_eq!(id(&mut cache, "LATE"), id(&mut cache, "late"));
        assert_eq!(id(&mut cache, "late"), id(&mut cache, "lAte"));
        assert!(
            !cache.texted.is_empty(),
            "words beyond MAX_WORDS keyed by text"
        );
        assert_eq!(defined, host.len(), "a name defined twice");
        assert_eq!(host.len(), cache.len(), "one series per name");
        assert!(host.contains_key("tollgate_auth_total.result.bad_sig"));
        assert!(!host.keys().any(|n| n.contains("Bad") || n.contains("LATE")));
    }
}
