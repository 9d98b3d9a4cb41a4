//! The table of prices by model name ([`PriceTable`]) and the lookup of the name a response
//! carries: exact, without a provider prefix, without a snapshot date (the rules of the module
//! documentation of `price_table`).

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::FxBuildHasher;
use tollgate_common::bytes::same_bytes;

use crate::price::ModelPrice;

/// Prices by model name (atto-USD per token). Hashed with FxHash, not SipHash: the names come
/// from the configuration and the price file only, so a client chooses only what is looked
/// up, never what collides in the table (a lookup is as long as the configured names make it).
/// Names are compared with `same_bytes`, a word at a time: `str`'s `==` calls the guest's
/// `memcmp`, a byte at a time (about 250 instructions for a 12-byte name, three lookups a
/// request).
#[derive(Debug, Clone, Default)]
pub struct PriceTable {
    models: HashTable<(String, ModelPrice)>,
}

fn hash(name: &str) -> u64 {
    FxBuildHasher.hash_one(name)
}

impl PartialEq for PriceTable {
    fn eq(&self, other: &PriceTable) -> bool {
        self.len() == other.len()
            && self
                .models
                .iter()
                .all(|(name, price)| other.exact(name) == Some(price))
    }
}

impl Eq for PriceTable {}

impl PriceTable {
    /// A table of the given prices (tests, benchmarks).
    pub fn from_prices(models: impl IntoIterator<Item = (String, ModelPrice)>) -> Self {
        let mut table = PriceTable::default();
        table.extend(models);
        table
    }

    /// Sets the price of `name` (a name given twice: the last price).
    pub(super) fn insert(&mut self, name: String, price: ModelPrice) {
        let at = hash(&name);
        match self.models.entry(
            at,
            |(k, _)| same_bytes(k.as_bytes(), name.as_bytes()),
            |(k, _)| hash(k),
        ) {
            Entry::Occupied(mut e) => e.get_mut().1 = price,
            Entry::Vacant(e) => {
                e.insert((name, price));
            }
        }
    }

    /// [`PriceTable::insert`] for each pair.
    pub(super) fn extend(&mut self, models: impl IntoIterator<Item = (String, ModelPrice)>) {
        for (name, price) in models {
            self.insert(name, price);
        }
    }

    /// The price of exactly `name`.
    pub(super) fn exact(&self, name: &str) -> Option<&ModelPrice> {
        self.models
            .find(hash(name), |(k, _)| {
                same_bytes(k.as_bytes(), name.as_bytes())
            })
            .map(|(_, price)| price)
    }

    /// Models in the table.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Every price in the table (in no order).
    pub fn prices(&self) -> impl Iterator<Item = &ModelPrice> {
        self.models.iter().map(|(_, price)| price)
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
        if let Some(p) = self.exact(model) {
            return Some(p);
        }
        let bare = ["openai/", "anthropic/"]
            .iter()
            .find_map(|prefix| model.strip_prefix(prefix));
        if let Some(p) = bare.and_then(|b| self.exact(b)) {
            return Some(p);
        }
        let name = bare.unwrap_or(model);
        without_date(name).and_then(|undated| self.exact(undated))
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
