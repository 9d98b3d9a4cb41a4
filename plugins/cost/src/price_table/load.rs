//! Loading a whole price file: the JSON object of entries read in one pass with `serde_json`
//! ([`PriceTable::parse`]), each entry priced or skipped as it is met, into a [`Loaded`] table.

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::Deserializer;
use std::fmt;
use tollgate_common::config::ConfigError;

use super::entry::{Entry, EntrySeed};
use super::entry_price::{entry_price, FieldError};
use super::lookup::PriceTable;
use super::skipped::{SkipReason, Skipped};

/// LiteLLM's schema description, not a model.
pub const SAMPLE_SPEC: &str = "sample_spec";

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
    pub(super) pending_aliases: Vec<(String, String)>,
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
}

impl PriceTable {
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
pub(super) fn read_object(
    json: &[u8],
    label: &str,
    loaded: &mut Loaded,
) -> Result<(), ConfigError> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let read = de
        .deserialize_map(FileVisitor { label, loaded })
        .map_err(|e| ConfigError::new(label, e.to_string()))?;
    de.end()
        .map_err(|e| ConfigError::new(label, format!("trailing characters: {e}")))?;
    read.map_err(|(field, message)| ConfigError::new(field, message))
}

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
            loaded.table.insert(model.to_string(), price);
        }
        Err(_) if entry.alias_of.is_some() => {
            let target = entry.alias_of.clone().unwrap_or_default();
            loaded.pending_aliases.push((model.to_string(), target));
        }
        Err(reason) => loaded.skipped.add(reason, model),
    }
    Ok(())
}
