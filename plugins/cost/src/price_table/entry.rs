//! Reading one entry of a price file ([`Entry`]): its price and context-tier fields kept as JSON
//! text, the units other prices are given in (for the skip reason), `mode`, `alias_of` and the
//! output bound (`max_output_tokens`, `max_tokens`); every other member skipped unread.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

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

/// The fields of one entry this filter reads, as JSON text; other members skipped unread
/// (`IgnoredAny`), and the units other prices are given in, for the skip reason.
#[derive(Debug, Default)]
pub struct Entry {
    pub(super) fields: Vec<(String, Box<RawValue>)>,
    pub(super) mode_embedding: bool,
    pub(super) per_image: bool,
    pub(super) per_second: bool,
    pub(super) per_character: bool,
    pub(super) per_call: bool,
    pub(super) tiered_pricing: bool,
    /// `alias_of`, when a string.
    pub(super) alias_of: Option<String>,
    /// `max_output_tokens`, when a non-negative integer.
    pub(super) max_output_tokens: Option<u64>,
    /// `max_tokens` (LiteLLM's older name of the same bound), when a non-negative integer.
    pub(super) max_tokens: Option<u64>,
}

/// A context-tier field: `(base field, threshold in tokens)`.
pub(super) fn tier_field(name: &str) -> Option<(&'static str, u64)> {
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
                // Informational in LiteLLM's file (never a reason to refuse it): a value that is
                // not a non-negative integer is ignored.
                Key::MaxOutputTokens | Key::MaxTokens => {
                    let value: serde_json::Value = map.next_value()?;
                    let slot = match key {
                        Key::MaxOutputTokens => &mut entry.max_output_tokens,
                        _ => &mut entry.max_tokens,
                    };
                    *slot = value.as_u64();
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
    MaxOutputTokens,
    MaxTokens,
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
        } else if key == "max_output_tokens" {
            Key::MaxOutputTokens
        } else if key == "max_tokens" {
            Key::MaxTokens
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

/// An entry, with the model named in a type error.
pub(super) struct EntrySeed<'a> {
    pub(super) label: &'a str,
    pub(super) model: &'a str,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = Entry;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entry, D::Error> {
        d.deserialize_map(EntryVisitor)
            .map_err(|e: D::Error| de::Error::custom(format!("{}.{}: {e}", self.label, self.model)))
    }
}
