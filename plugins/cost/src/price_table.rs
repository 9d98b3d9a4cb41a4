//! The price table: LiteLLM's price file (`model_prices_and_context_window.json`, shipped in the
//! `litellm` package as `model_prices_and_context_window_backup.json`) read as it is, and the
//! lookup of the model names responses carry.
//!
//! # Loading
//! The file is a JSON object of entries by model name. An entry priced per token (both
//! `input_cost_per_token` and `output_cost_per_token`; an `embedding` entry needs only the input
//! price) is loaded with the fields of [`PRICE_FIELDS`] and its context tier (see
//! [`ContextTier`]). Other entries are **skipped**, counted per [`SkipReason`], never refused:
//! - `sample_spec`, LiteLLM's description of the schema;
//! - entries without a per-token price (priced per image, pixel, second, character, query,
//!   page..., or without a price at all);
//! - entries with more than one context tier, or with `tiered_pricing` (prices by prompt-length
//!   ranges, which this filter does not implement).
//!
//! An entry without a per-token price of its own that has `alias_of` (LiteLLM's
//! `"bedrock/claude-opus-latest": {"alias_of": "global.anthropic.claude-opus-5-5"}`) is priced
//! as the entry it names, followed once the whole file is read, through at most
//! [`MAX_ALIAS_HOPS`] aliases; an alias whose chain ends on no per-token price, loops or is
//! longer is skipped ([`SkipReason::AliasUnpriced`]). Names are matched exactly there; a name
//! the file also gives with a price of its own keeps that price.
//!
//! Every other member of an entry (`max_tokens`, `mode`, `litellm_provider`, `supports_*`,
//! `source`, service-tier prices such as `input_cost_per_token_priority` or `_batches`, ...) is
//! ignored. A price field that is present but negative, not a number, or absurd (see
//! [`parse_usd_per_token`]) refuses the whole table, naming `<label>.<model>.<field>`: a
//! table with a wrong number in it is not trusted. Values are read from the JSON text, never
//! through a float (floating-point noise is rounded to the nearest atto-USD).
//!
//! # Lookup ([`PriceTable::get`])
//! A response (or request) names a model; the first of these that is a key of the table wins,
//! and nothing else is tried (no prefix matching, no guessing):
//! 1. the name exactly (`gpt-4o-mini-2024-07-18` has its own LiteLLM entry, used as is);
//! 2. without a provider prefix `openai/` or `anthropic/` (the APIs this filter reads);
//! 3. without a trailing date of a dated snapshot: `-YYYY-MM-DD` (OpenAI,
//!    `gpt-4o-mini-2024-07-18` → `gpt-4o-mini`) or `-YYYYMMDD` (Anthropic,
//!    `claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`), on the name of step 2;
//!
//! else the model has no price (the `unknown_model` policy applies). At most three hash
//! lookups and no allocation: O(1) in the size of the table.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use tollgate_common::config::ConfigError;
// (IncrementalParse's scanner works on bytes; entries are read by serde_json.)

use crate::price::{parse_usd_per_token, ContextTier, ModelPrice};

/// The LiteLLM price fields read (USD per token), besides the context tier's.
pub const PRICE_FIELDS: [&str; 5] = [
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "cache_creation_input_token_cost",
    "output_cost_per_reasoning_token",
];

/// The context-tier fields, before `_above_<N>[k]_tokens`.
const TIER_FIELDS: [&str; 4] = [
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "cache_creation_input_token_cost",
];

/// The most `alias_of` links followed from one entry (LiteLLM's own are one link).
pub const MAX_ALIAS_HOPS: usize = 8;

/// LiteLLM's schema description, not a model.
pub const SAMPLE_SPEC: &str = "sample_spec";

/// Why an entry of the file was not loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// `sample_spec`.
    SchemaExample,
    /// Priced per image or pixel.
    PerImage,
    /// Priced per second (audio, video).
    PerSecond,
    /// Priced per character (speech).
    PerCharacter,
    /// Priced per query, page, request, session or other unit.
    PerCall,
    /// An input price per token but no output price (not an embedding).
    NoOutputPrice,
    /// No price at all.
    NoPrice,
    /// Context tiers at more than one threshold.
    SeveralTiers,
    /// LiteLLM's `tiered_pricing` (prices by prompt-length ranges), not implemented: priced at
    /// its base rates it would be under-charged.
    TieredPricing,
    /// `alias_of` names no entry priced per token here (missing, unpriced, a loop, or more than
    /// [`MAX_ALIAS_HOPS`] links).
    AliasUnpriced,
}

impl SkipReason {
    /// The label in the summary log line.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::SchemaExample => "schema_example",
            SkipReason::PerImage => "per_image",
            SkipReason::PerSecond => "per_second",
            SkipReason::PerCharacter => "per_character",
            SkipReason::PerCall => "per_call",
            SkipReason::NoOutputPrice => "no_output_price",
            SkipReason::NoPrice => "no_price",
            SkipReason::SeveralTiers => "several_context_tiers",
            SkipReason::TieredPricing => "tiered_pricing",
            SkipReason::AliasUnpriced => "alias_unpriced",
        }
    }
}

/// Entries skipped by reason: how many and the first name met (in the file's order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// `(reason, count, example)`, in [`SkipReason`] order.
    pub reasons: Vec<(SkipReason, usize, String)>,
}

impl Skipped {
    fn add(&mut self, reason: SkipReason, model: &str) {
        match self.reasons.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, n, _)) => *n = n.saturating_add(1),
            None => {
                self.reasons.push((reason, 1, model.to_string()));
                self.reasons.sort_by_key(|(r, _, _)| *r);
            }
        }
    }

    /// Entries skipped in all.
    pub fn total(&self) -> usize {
        self.reasons.iter().map(|(_, n, _)| n).sum()
    }
}

impl fmt::Display for Skipped {
    /// `345 per_image (e.g. dall-e-3), 1 schema_example (e.g. sample_spec)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (reason, n, example)) in self.reasons.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n} {} (e.g. {example})", reason.label())?;
        }
        Ok(())
    }
}

/// Prices by model name (atto-USD per token).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    models: HashMap<String, ModelPrice>,
}

/// A loaded table and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The table.
    pub table: PriceTable,
    /// The entries not loaded.
    pub skipped: Skipped,
    /// Models priced through `alias_of`.
    pub aliases: usize,
    /// `(alias, target)` of the entries met with `alias_of` and no price, followed at the end.
    pending_aliases: Vec<(String, String)>,
}

impl Loaded {
    /// The summary log line of a load (`source`: where the table came from).
    pub fn summary(&self, source: &str) -> String {
        let mut line = format!("prices from {source}: {} models loaded", self.table.len());
        if self.skipped.total() > 0 {
            line.push_str(&format!(
                "; {} entries skipped (not priced per token here): {}",
                self.skipped.total(),
                self.skipped
            ));
        }
        if self.aliases > 0 {
            line.push_str(&format!(
                "; {} of the models loaded are aliases (alias_of)",
                self.aliases
            ));
        }
        line
    }

    /// Prices the aliases met while reading (see the module documentation): called once the
    /// whole document is read.
    fn follow_aliases(&mut self) {
        let pending = std::mem::take(&mut self.pending_aliases);
        let links: HashMap<&str, &str> = pending
            .iter()
            .map(|(a, t)| (a.as_str(), t.as_str()))
            .collect();
        // Looked up among the entries priced by their own fields only (an alias priced here is
        // no shortcut for a later one: the hop bound holds whatever the file's order).
        let mut priced = Vec::with_capacity(pending.len());
        for (alias, target) in &pending {
            if self.table.models.contains_key(alias) {
                // The name is also an entry with a price of its own (a key given twice): that
                // price wins, whichever came first.
                continue;
            }
            let mut name = target.as_str();
            let mut price = None;
            for _ in 0..MAX_ALIAS_HOPS {
                if let Some(p) = self.table.models.get(name) {
                    price = Some(*p);
                    break;
                }
                match links.get(name) {
                    Some(next) => name = next,
                    None => break,
                }
            }
            match price {
                Some(p) => priced.push((alias.clone(), p)),
                None => self.skipped.add(SkipReason::AliasUnpriced, alias),
            }
        }
        self.aliases = self.aliases.saturating_add(priced.len());
        self.table.models.extend(priced);
    }
}

impl PriceTable {
    /// A table of the given prices (tests, benchmarks).
    pub fn from_prices(models: impl IntoIterator<Item = (String, ModelPrice)>) -> Self {
        PriceTable {
            models: models.into_iter().collect(),
        }
    }

    /// Models in the table.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Every price in the table (in no order).
    pub fn prices(&self) -> impl Iterator<Item = &ModelPrice> {
        self.models.values()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The price of `model` by the rules of the module documentation.
    pub fn get(&self, model: &str) -> Option<&ModelPrice> {
        if let Some(p) = self.models.get(model) {
            return Some(p);
        }
        let bare = ["openai/", "anthropic/"]
            .iter()
            .find_map(|prefix| model.strip_prefix(prefix));
        if let Some(p) = bare.and_then(|b| self.models.get(b)) {
            return Some(p);
        }
        let name = bare.unwrap_or(model);
        without_date(name).and_then(|undated| self.models.get(undated))
    }

    /// Parses a LiteLLM price file (a JSON object of entries by model name). Errors name
    /// `<label>.<model>.<field>` (or `<label>` when the document is not such an object).
    pub fn parse(json: &[u8], label: &str) -> Result<Loaded, ConfigError> {
        let mut loaded = Loaded::default();
        read_object(json, label, &mut loaded)?;
        loaded.follow_aliases();
        Ok(loaded)
    }
}

/// Reads the JSON object `json` of entries into `loaded`.
fn read_object(json: &[u8], label: &str, loaded: &mut Loaded) -> Result<(), ConfigError> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let read = de
        .deserialize_map(FileVisitor { label, loaded })
        .map_err(|e| ConfigError::new(label, e.to_string()))?;
    de.end()
        .map_err(|e| ConfigError::new(label, format!("trailing characters: {e}")))?;
    read.map_err(|(field, message)| ConfigError::new(field, message))
}

/// JSON's whitespace (RFC 8259 section 2: space, tab, LF, CR; not form feed).
fn json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Deepest nesting of a price file read by [`IncrementalParse`] (serde_json's own limit).
const MAX_DEPTH: u32 = 128;

/// A price file read a slice at a time, so that no single proxy-wasm callback reads megabytes
/// (nginx bounds each callback by `tollgate_guest_deadline`, 100 ms by default; LiteLLM's 3.2 MB
/// file takes 50-130 ms in one go there). A byte scanner (strings, escapes, depth) finds each
/// top-level member; each member is then read as [`PriceTable::parse`] reads it, with the same
/// rules and errors. The result is the same as [`PriceTable::parse`]'s on any document.
#[derive(Debug)]
pub struct IncrementalParse {
    doc: Vec<u8>,
    label: String,
    pos: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the current top-level member starts (after `{` or `,`).
    member: usize,
    opened: bool,
    had_comma: bool,
    /// The open brackets, innermost last (at most MAX_DEPTH).
    open: Vec<u8>,
    loaded: Loaded,
}

/// What [`IncrementalParse::step`] got to.
#[derive(Debug)]
pub enum Step {
    /// More to read.
    More,
    /// Read whole: the table, or why it is refused.
    Done(Result<Loaded, ConfigError>),
}

impl IncrementalParse {
    /// Starts reading `doc`; errors will name `label`.
    pub fn new(doc: Vec<u8>, label: &str) -> Self {
        IncrementalParse {
            doc,
            label: label.to_string(),
            pos: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            member: 0,
            opened: false,
            had_comma: false,
            open: Vec::new(),
            loaded: Loaded::default(),
        }
    }

    /// The document (bytes).
    pub fn document(&self) -> &[u8] {
        &self.doc
    }

    /// Reads at least `budget` more bytes of the document (up to the end of the member they end
    /// in).
    pub fn step(&mut self, budget: usize) -> Step {
        match self.scan(budget) {
            Ok(false) => Step::More,
            Ok(true) => {
                let mut loaded = std::mem::take(&mut self.loaded);
                loaded.follow_aliases();
                Step::Done(Ok(loaded))
            }
            Err(e) => Step::Done(Err(e)),
        }
    }

    fn error(&self, message: &str) -> ConfigError {
        ConfigError::new(
            self.label.clone(),
            format!("{message} at byte {}", self.pos),
        )
    }

    /// `Ok(true)` when the document has been read whole.
    fn scan(&mut self, budget: usize) -> Result<bool, ConfigError> {
        let stop = self.pos.saturating_add(budget);
        while let Some(&b) = self.doc.get(self.pos) {
            let at = self.pos;
            self.pos = self.pos.saturating_add(1);
            if !self.opened {
                match b {
                    b if json_whitespace(b) => continue,
                    b'{' => {
                        self.opened = true;
                        self.depth = 1;
                        self.open.push(b'{');
                        self.member = self.pos;
                        continue;
                    }
                    _ => return Err(self.error("expected a JSON object of price entries")),
                }
            }
            if self.depth == 0 {
                if json_whitespace(b) {
                    continue;
                }
                return Err(self.error("trailing characters after the object"));
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth = self.depth.saturating_add(1);
                    if self.depth > MAX_DEPTH {
                        return Err(self.error("nested too deeply"));
                    }
                    self.open.push(b);
                }
                b'}' | b']' => {
                    let opener = if b == b'}' { b'{' } else { b'[' };
                    if self.open.pop() != Some(opener) {
                        return Err(self.error("mismatched brackets"));
                    }
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.member_done(at, true)?;
                    }
                }
                b',' if self.depth == 1 => {
                    self.member_done(at, false)?;
                    self.had_comma = true;
                    self.member = self.pos;
                    if self.pos >= stop {
                        return Ok(false);
                    }
                }
                _ => {}
            }
        }
        if !self.opened || self.depth != 0 || self.in_string {
            return Err(self.error("the document ends early"));
        }
        Ok(true)
    }

    /// Reads the member `doc[member..end]` (`"model": {...}`) into the table.
    fn member_done(&mut self, end: usize, closing: bool) -> Result<(), ConfigError> {
        let text = self.doc.get(self.member..end).unwrap_or_default();
        if text.iter().copied().all(json_whitespace) {
            // `{}` is an empty table; a member missing before or after a comma is an error.
            if closing && !self.had_comma {
                return Ok(());
            }
            return Err(self.error("a member is missing around a comma"));
        }
        let mut wrapped = Vec::with_capacity(text.len().saturating_add(2));
        wrapped.push(b'{');
        wrapped.extend_from_slice(text);
        wrapped.push(b'}');
        read_object(&wrapped, &self.label, &mut self.loaded)
    }
}

/// One price entry that must be priced per token (`unknown_model.default_price`); errors name
/// `label` and the field.
pub fn single_price(entry: &Entry, label: &str) -> Result<ModelPrice, ConfigError> {
    match entry_price(entry, &|| label.to_string()) {
        Ok(Ok(price)) => Ok(price),
        Ok(Err(reason)) => Err(ConfigError::new(
            label,
            format!(
                "input_cost_per_token and output_cost_per_token are required ({})",
                reason.label()
            ),
        )),
        Err((field, message)) => Err(ConfigError::new(field, message)),
    }
}

/// `name` without a trailing `-YYYY-MM-DD` or `-YYYYMMDD`, if it has one (a year 19xx or 20xx)
/// and something before it.
fn without_date(name: &str) -> Option<&str> {
    let date = |tail: &[u8], dashed: bool| {
        let year_ok = tail.starts_with(b"19") || tail.starts_with(b"20");
        let shape_ok = tail.iter().enumerate().all(|(i, b)| {
            if dashed && (i == 4 || i == 7) {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
        year_ok && shape_ok
    };
    for (len, dashed) in [(10usize, true), (8, false)] {
        let Some(cut) = name.len().checked_sub(len.saturating_add(1)) else {
            continue;
        };
        if cut == 0 || !name.is_char_boundary(cut) {
            continue;
        }
        let (head, tail) = name.split_at(cut);
        if let Some(digits) = tail.strip_prefix('-') {
            if date(digits.as_bytes(), dashed) {
                return Some(head);
            }
        }
    }
    None
}

/// The fields of one entry this filter reads, as JSON text; other members skipped unread
/// (`IgnoredAny`), and the units other prices are given in, for the skip reason.
#[derive(Debug, Default)]
pub struct Entry {
    fields: Vec<(String, Box<RawValue>)>,
    mode_embedding: bool,
    per_image: bool,
    per_second: bool,
    per_character: bool,
    per_call: bool,
    tiered_pricing: bool,
    /// `alias_of`, when a string.
    alias_of: Option<String>,
}

/// A context-tier field: `(base field, threshold in tokens)`.
fn tier_field(name: &str) -> Option<(&'static str, u64)> {
    // Cheap rejections first: this runs on every member name of a 3 MB file.
    if !name.ends_with("_tokens") {
        return None;
    }
    let (base, rest) = TIER_FIELDS
        .iter()
        .find_map(|f| Some((*f, name.strip_prefix(f)?.strip_prefix("_above_")?)))?;
    let n = rest.strip_suffix("_tokens")?;
    let (digits, scale) = match n.strip_suffix('k') {
        Some(d) => (d, 1000),
        None => (n, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 12 {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some((base, value.checked_mul(scale)?))
}

/// Whether `haystack` contains `needle` (short needles; no searcher set-up per call).
fn has(haystack: &str, needle: &[u8]) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w == needle)
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a LiteLLM price entry (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let mut entry = Entry::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Price(name) => {
                    let value: Box<RawValue> = map.next_value()?;
                    entry.fields.push((name, value));
                    continue;
                }
                Key::Mode => {
                    let mode: serde_json::Value = map.next_value()?;
                    entry.mode_embedding = mode.as_str() == Some("embedding");
                    continue;
                }
                Key::AliasOf => {
                    let target: serde_json::Value = map.next_value()?;
                    entry.alias_of = target.as_str().map(str::to_string);
                    continue;
                }
                Key::PerImage => entry.per_image = true,
                Key::PerSecond => entry.per_second = true,
                Key::PerCharacter => entry.per_character = true,
                Key::PerCall => entry.per_call = true,
                Key::TieredPricing => entry.tiered_pricing = true,
                Key::Other => {}
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(entry)
    }
}

/// A member name of an entry, classified as it is read (no allocation but for price fields).
enum Key {
    Price(String),
    Mode,
    AliasOf,
    PerImage,
    PerSecond,
    PerCharacter,
    PerCall,
    TieredPricing,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        let priced =
            (key.starts_with("input_") || key.starts_with("output_") || key.starts_with("cache_"))
                && (PRICE_FIELDS.contains(&key) || tier_field(key).is_some());
        Ok(if priced {
            Key::Price(key.to_string())
        } else if key == "mode" {
            Key::Mode
        } else if key == "alias_of" {
            Key::AliasOf
        } else if key == "tiered_pricing" {
            Key::TieredPricing
        } else if !has(key, b"cost") {
            Key::Other
        } else if has(key, b"per_image") || has(key, b"per_pixel") {
            Key::PerImage
        } else if has(key, b"per_second") {
            Key::PerSecond
        } else if has(key, b"per_character") {
            Key::PerCharacter
        } else if !has(key, b"per_token") && !has(key, b"token_cost") {
            Key::PerCall
        } else {
            Key::Other
        })
    }
}

/// `(field, message)` of a refused table.
type FieldError = (String, String);

struct FileVisitor<'a> {
    label: &'a str,
    loaded: &'a mut Loaded,
}

impl<'de> Visitor<'de> for FileVisitor<'_> {
    type Value = Result<(), FieldError>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of LiteLLM price entries by model name")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let loaded = self.loaded;
        while let Some(model) = map.next_key::<String>()? {
            let entry = map.next_value_seed(EntrySeed {
                label: self.label,
                model: &model,
            })?;
            if let Err(e) = add_entry(loaded, &model, &entry, self.label) {
                // The table is refused; the rest is read (unchecked) so the error is this one.
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }
}

/// An entry, with the model named in a type error.
struct EntrySeed<'a> {
    label: &'a str,
    model: &'a str,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = Entry;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entry, D::Error> {
        d.deserialize_map(EntryVisitor)
            .map_err(|e: D::Error| de::Error::custom(format!("{}.{}: {e}", self.label, self.model)))
    }
}

fn add_entry(
    loaded: &mut Loaded,
    model: &str,
    entry: &Entry,
    label: &str,
) -> Result<(), FieldError> {
    if model == SAMPLE_SPEC {
        loaded.skipped.add(SkipReason::SchemaExample, model);
        return Ok(());
    }
    match entry_price(entry, &|| format!("{label}.{model}"))? {
        Ok(price) => {
            loaded.table.models.insert(model.to_string(), price);
        }
        Err(_) if entry.alias_of.is_some() => {
            let target = entry.alias_of.clone().unwrap_or_default();
            loaded.pending_aliases.push((model.to_string(), target));
        }
        Err(reason) => loaded.skipped.add(reason, model),
    }
    Ok(())
}

/// The price of an entry, or why it is skipped; `Err` refuses the table.
/// (`label` makes the entry's JSON path, for an error only.)
fn entry_price(
    entry: &Entry,
    label: &dyn Fn() -> String,
) -> Result<Result<ModelPrice, SkipReason>, FieldError> {
    let mut base: [Option<u64>; 5] = [None; 5];
    let mut tier = ContextTier::default();
    let mut threshold: Option<u64> = None;
    let mut several = false;
    for (name, raw) in &entry.fields {
        let Some(value) =
            price_value(raw).map_err(|message| (format!("{}.{name}", label()), message))?
        else {
            continue;
        };
        if let Some(i) = PRICE_FIELDS.iter().position(|f| f == name) {
            if let Some(slot) = base.get_mut(i) {
                *slot = Some(value);
            }
        } else if let Some((field, above)) = tier_field(name) {
            match threshold {
                Some(t) if t != above => several = true,
                _ => threshold = Some(above),
            }
            match field {
                "input_cost_per_token" => tier.input = Some(value),
                "output_cost_per_token" => tier.output = Some(value),
                "cache_read_input_token_cost" => tier.cache_read = Some(value),
                _ => tier.cache_creation = Some(value),
            }
        }
    }
    let [input, output, cache_read, cache_creation, reasoning] = base;
    let output = match (input, output) {
        (Some(_), None) if entry.mode_embedding => Some(0),
        (_, o) => o,
    };
    let (Some(input), Some(output)) = (input, output) else {
        let reason = if entry.tiered_pricing {
            SkipReason::TieredPricing
        } else if input.is_some() {
            SkipReason::NoOutputPrice
        } else if entry.per_image {
            SkipReason::PerImage
        } else if entry.per_second {
            SkipReason::PerSecond
        } else if entry.per_character {
            SkipReason::PerCharacter
        } else if entry.per_call {
            SkipReason::PerCall
        } else {
            SkipReason::NoPrice
        };
        return Ok(Err(reason));
    };
    if several {
        return Ok(Err(SkipReason::SeveralTiers));
    }
    if entry.tiered_pricing {
        return Ok(Err(SkipReason::TieredPricing));
    }
    Ok(Ok(ModelPrice {
        input,
        output,
        cache_read,
        cache_creation,
        reasoning,
        tier: threshold.map(|above_input_tokens| ContextTier {
            above_input_tokens,
            ..tier
        }),
    }))
}

/// A price field's value: `None` for `null`; the error's message.
fn price_value(raw: &RawValue) -> Result<Option<u64>, String> {
    let text = raw.get().trim();
    if text == "null" {
        return Ok(None);
    }
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        let shown: String = text.chars().take(40).collect();
        return Err(format!("expected a number of USD per token, got {shown}"));
    }
    parse_usd_per_token(text).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> Result<Loaded, ConfigError> {
        PriceTable::parse(json.as_bytes(), "prices")
    }

    #[test]
    fn loads_per_token_entries_and_skips_the_others_with_reasons() {
        let loaded = load(
            r#"{
            "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                            "max_tokens": "LEGACY parameter", "mode": "one of: chat, ..."},
            "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
                            "cache_read_input_token_cost": 7.5e-08, "mode": "chat",
                            "input_cost_per_token_priority": 2.5e-07,
                            "search_context_cost_per_query": {"search_context_size_low": 0.025},
                            "supported_regions": ["global"], "unknown_future_field": {"a": [1]}},
            "dall-e-3": {"output_cost_per_image": 0.04, "mode": "image_generation"},
            "whisper-1": {"input_cost_per_second": 0.0001, "mode": "audio_transcription"},
            "tts-1": {"input_cost_per_character": 1.5e-05, "mode": "audio_speech"},
            "text-embedding-3-small": {"input_cost_per_token": 2e-08, "mode": "embedding"},
            "odd": {"input_cost_per_token": 1e-06, "mode": "chat"},
            "nothing": {"mode": "chat"},
            "ranges": {"mode": "chat", "tiered_pricing": [{"input_cost_per_token": 5e-08,
                       "output_cost_per_token": 4e-07, "range": [0, 256000.0]}]},
            "two-tiers": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
                          "input_cost_per_token_above_32k_tokens": 2e-06,
                          "input_cost_per_token_above_256k_tokens": 4e-06},
            "noisy": {"input_cost_per_token": 1.0000000000000001e-07,
                      "output_cost_per_token": 8.900000000000001e-07}
        }"#,
        )
        .unwrap();
        let t = &loaded.table;
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.get("gpt-4o-mini").unwrap().cache_read,
            Some(75_000_000_000)
        );
        assert_eq!(t.get("text-embedding-3-small").unwrap().output, 0);
        assert_eq!(
            (
                t.get("noisy").unwrap().input,
                t.get("noisy").unwrap().output
            ),
            (100_000_000_000, 890_000_000_000)
        );
        assert!(t.get("sample_spec").is_none());
        assert_eq!(
            loaded.skipped.to_string(),
            "1 schema_example (e.g. sample_spec), 1 per_image (e.g. dall-e-3), \
             1 per_second (e.g. whisper-1), 1 per_character (e.g. tts-1), \
             1 no_output_price (e.g. odd), 1 no_price (e.g. nothing), \
             1 several_context_tiers (e.g. two-tiers), 1 tiered_pricing (e.g. ranges)"
        );
        assert!(loaded
            .summary("the configuration")
            .starts_with("prices from the configuration: 3 models loaded; 8 entries skipped"));
    }

    #[test]
    fn refuses_bad_numbers_naming_the_field() {
        for (json, field) in [
            (
                r#"{"m": {"input_cost_per_token": -1e-6, "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": "1e-6", "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e9}}"#,
                "prices.m.output_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6, "cache_read_input_token_cost_above_200k_tokens": true}}"#,
                "prices.m.cache_read_input_token_cost_above_200k_tokens",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-30, "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
        ] {
            assert_eq!(load(json).unwrap_err().field, field, "{json}");
        }
        assert!(load("[]").is_err());
        assert!(load(r#"{"m": 3}"#)
            .unwrap_err()
            .message
            .contains("prices.m"));
        assert!(load(r#"{"m": {}} x"#).is_err());
        assert!(load(r#"{"m": {"input_cost_per_token": 1e-6"#).is_err());
    }

    /// Reads `json` with IncrementalParse in steps of `budget` bytes.
    fn incremental(json: &str, budget: usize) -> Result<Loaded, ConfigError> {
        let mut p = IncrementalParse::new(json.as_bytes().to_vec(), "prices");
        for _ in 0..100_000 {
            if let Step::Done(r) = p.step(budget) {
                return r;
            }
        }
        panic!("never done");
    }

    #[test]
    fn incremental_reads_as_the_whole_parse() {
        let docs = [
            r#"{"a": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6, "s": "x,}{]\"\\", "n": [1, {"b": [2]}]},
               "sample_spec": {"input_cost_per_token": 0.0}, "c": {"mode": "chat"},
               "d": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6}}  "#,
            "{}",
            " { } ",
            "{\u{c}}",
            "{]",
            r#"{"m": {"a": [1}]}"#,
            "{}\u{c}",
            r#"{"m": {"input_cost_per_token": -1, "output_cost_per_token": 1}, "n": {}}"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1}, }"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1},, "n": {}}"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "#,
            r#"{"m": {}} x"#,
            r#"[]"#,
            "",
            r#"{"m": "#,
            r#"{"m": {"a": "unterminated}}"#,
            // An alias before its target, one after, a chain, a loop.
            r#"{"x": {"alias_of": "t"}, "t": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
               "y": {"alias_of": "x"}, "l1": {"alias_of": "l2"}, "l2": {"alias_of": "l1"}}"#,
        ];
        for doc in docs {
            let whole = PriceTable::parse(doc.as_bytes(), "prices");
            for budget in [1, 7, 64, 1 << 20] {
                let part = incremental(doc, budget);
                match (&whole, &part) {
                    (Ok(w), Ok(p)) => {
                        assert_eq!(w.table, p.table, "{doc}");
                        assert_eq!(w.skipped, p.skipped, "{doc}");
                        assert_eq!(w.aliases, p.aliases, "{doc}");
                    }
                    (Err(w), Err(p)) => {
                        if w.field != "prices" {
                            assert_eq!(w.field, p.field, "{doc}");
                        }
                    }
                    _ => panic!("{doc} (budget {budget}): {whole:?} vs {part:?}"),
                }
            }
        }
        let deep = format!(r#"{{"m": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert!(PriceTable::parse(deep.as_bytes(), "prices").is_err());
        assert!(incremental(&deep, 64).is_err());
    }

    /// LiteLLM 1.110's `alias_of` entries (`"bedrock/claude-opus-latest": {"alias_of":
    /// "global.anthropic.claude-opus-5-5"}`): priced as their target, wherever it stands in the
    /// file, through chains; never through a loop, a missing or unpriced target, or a chain
    /// longer than MAX_ALIAS_HOPS; an entry's own price wins over its alias.
    #[test]
    fn aliases_are_priced_as_their_target() {
        let mut doc = String::from(
            r#"{"latest": {"alias_of": "model-5"},
                "model-5": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6, "mode": "chat"},
                "chained": {"alias_of": "latest"},
                "own": {"alias_of": "model-5", "input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "nowhere": {"alias_of": "no-such-model"},
                "image": {"output_cost_per_image": 0.04},
                "to-image": {"alias_of": "image"},
                "loop-a": {"alias_of": "loop-b"}, "loop-b": {"alias_of": "loop-a"},
                "self": {"alias_of": "self"},
                "number": {"alias_of": 5},"#,
        );
        // A chain of MAX_ALIAS_HOPS links ends on the price; one more does not.
        for i in 0..=MAX_ALIAS_HOPS {
            let next = if i == 0 {
                "model-5".to_string()
            } else {
                format!("hop{}", i - 1)
            };
            doc.push_str(&format!(r#""hop{i}": {{"alias_of": "{next}"}},"#));
        }
        doc.push_str(r#""end": {"alias_of": "model-5"}}"#);
        let loaded = PriceTable::parse(doc.as_bytes(), "prices").unwrap();
        let price = |m: &str| loaded.table.get(m).map(|p| (p.input, p.output));
        let target = price("model-5");
        assert!(target.is_some());
        for m in ["latest", "chained", "end", "hop0"] {
            assert_eq!(price(m), target, "{m}");
        }
        assert_eq!(price(&format!("hop{}", MAX_ALIAS_HOPS - 1)), target);
        assert_eq!(price(&format!("hop{MAX_ALIAS_HOPS}")), None);
        assert_ne!(price("own"), target);
        assert!(price("own").is_some());
        for m in ["nowhere", "to-image", "loop-a", "loop-b", "self"] {
            assert_eq!(price(m), None, "{m}");
        }
        // Through the lookup's own rules too: a provider prefix before the alias.
        assert_eq!(
            loaded.table.get("openai/latest").map(|p| p.input),
            target.map(|t| t.0)
        );
        let unpriced = loaded
            .skipped
            .reasons
            .iter()
            .find(|(r, _, _)| *r == SkipReason::AliasUnpriced)
            .map(|(_, n, _)| *n);
        // nowhere, to-image, loop-a, loop-b, self, hop<MAX>.
        assert_eq!(unpriced, Some(6));
        // latest, chained, end, hop0..hop<MAX-1>.
        assert_eq!(loaded.aliases, 3 + MAX_ALIAS_HOPS);
        let line = loaded.summary("the configuration");
        assert!(line.contains("6 alias_unpriced (e.g. "), "{line}");
        assert!(
            line.contains(&format!(
                "; {} of the models loaded are aliases (alias_of)",
                3 + MAX_ALIAS_HOPS
            )),
            "{line}"
        );
        // A non-string alias_of is no alias: no price.
        assert_eq!(price("number"), None);
        // A name given twice, once priced and once as an alias: its own price, in either order.
        for doc in [
            r#"{"t": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}, "x": {"alias_of": "t"}}"#,
            r#"{"t": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "x": {"alias_of": "t"}, "x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}"#,
        ] {
            let loaded = PriceTable::parse(doc.as_bytes(), "prices").unwrap();
            let own = loaded.table.get("x").map(|p| p.input);
            assert_eq!(
                own,
                PriceTable::parse(
                    br#"{"x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}"#,
                    "prices"
                )
                .unwrap()
                .table
                .get("x")
                .map(|p| p.input),
                "{doc}"
            );
            assert_eq!(loaded.aliases, 0, "{doc}");
        }
    }

    #[test]
    fn context_tier_as_litellm() {
        let t = load(
            r#"{"claude-sonnet-4-5": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
                "cache_read_input_token_cost": 3e-07,
                "input_cost_per_token_above_200k_tokens": 6e-06,
                "output_cost_per_token_above_200k_tokens": 2.25e-05}}"#,
        )
        .unwrap()
        .table;
        let p = t.get("claude-sonnet-4-5").unwrap();
        let tier = p.tier.unwrap();
        assert_eq!(tier.above_input_tokens, 200_000);
        const U: u64 = 1_000_000;
        // At the threshold: base rates; above: the tier's, cache reads keep the base cache rate.
        assert_eq!(
            p.rates(200_000),
            [3 * U * U, 300_000 * U, 3 * U * U, 15 * U * U, 15 * U * U]
        );
        assert_eq!(
            p.rates(200_001),
            [
                6 * U * U,
                300_000 * U,
                6 * U * U,
                22_500_000 * U,
                22_500_000 * U
            ]
        );
    }

    #[test]
    fn lookup_rules() {
        let price = |input| ModelPrice {
            input,
            output: 1,
            ..ModelPrice::default()
        };
        let t = PriceTable::from_prices([
            ("gpt-4o-mini".to_string(), price(1)),
            ("gpt-4o-mini-2024-07-18".to_string(), price(2)),
            ("claude-sonnet-4-5".to_string(), price(3)),
            ("openai/special".to_string(), price(4)),
        ]);
        let input = |m: &str| t.get(m).map(|p| p.input);
        assert_eq!(input("gpt-4o-mini"), Some(1));
        assert_eq!(
            input("gpt-4o-mini-2024-07-18"),
            Some(2),
            "an exact key wins"
        );
        assert_eq!(input("gpt-4o-mini-2025-01-31"), Some(1), "dated snapshot");
        assert_eq!(input("openai/gpt-4o-mini"), Some(1));
        assert_eq!(input("openai/gpt-4o-mini-2024-07-18"), Some(2));
        assert_eq!(input("openai/gpt-4o-mini-2099-12-31"), Some(1));
        assert_eq!(input("claude-sonnet-4-5-20250929"), Some(3));
        assert_eq!(input("anthropic/claude-sonnet-4-5-20250929"), Some(3));
        assert_eq!(input("openai/special"), Some(4));
        for unknown in [
            "gpt-4o",
            "gpt-4o-mini-fast",
            "gpt-4o-mini-2024-07",
            "gpt-4o-mini-0718",
            "gpt-4o-mini-30240718",
            "azure/gpt-4o-mini",
            "openai/anthropic/claude-sonnet-4-5",
            "",
            "-20250929",
        ] {
            assert_eq!(input(unknown), None, "{unknown}");
        }
    }
}
