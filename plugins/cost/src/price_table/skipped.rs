//! The entries of a price file that were not loaded: why ([`SkipReason`]), how many and an
//! example of each ([`Skipped`], the summary log line's part).

use std::fmt;

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
    /// [`MAX_ALIAS_HOPS`](super::MAX_ALIAS_HOPS) links).
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
    pub(super) fn add(&mut self, reason: SkipReason, model: &str) {
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
