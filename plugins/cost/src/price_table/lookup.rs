//! The table of prices by model name ([`PriceTable`]) and the lookup of the name a response
//! carries: exact, without a provider prefix, without a snapshot date (the rules of the module
//! documentation of `price_table`).

use rustc_hash::FxHashMap;

use crate::price::ModelPrice;

/// Prices by model name (atto-USD per token). Hashed with FxHash, not SipHash: the names come
/// from the configuration and the price file only, so a client chooses only what is looked
/// up, never what collides in the table (a lookup is as long as the configured names make it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    pub(super) models: FxHashMap<String, ModelPrice>,
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

    /// The name `get` finally looks up when neither the exact name nor the name without its
    /// provider prefix is a key: `model` without an `openai/` or `anthropic/` prefix and without
    /// a snapshot date (`openai/gpt-4o-2024-05-13` → `gpt-4o`). Token limits match models by
    /// it (`crate::token_limits`), so that no spelling the table prices alike escapes a limit.
    pub fn family(model: &str) -> &str {
        let bare = ["openai/", "anthropic/"]
            .iter()
            .find_map(|prefix| model.strip_prefix(prefix))
            .unwrap_or(model);
        without_date(bare).unwrap_or(bare)
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
