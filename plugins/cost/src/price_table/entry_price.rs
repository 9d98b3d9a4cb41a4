//! What one entry is priced at: its per-token fields and context tier read into a
//! [`ModelPrice`], or why it is skipped ([`SkipReason`]), or the error that refuses the table.

use serde_json::value::RawValue;
use tollgate_common::config::ConfigError;

use super::entry::{tier_field, Entry, PRICE_FIELDS};
use super::skipped::SkipReason;
use crate::price::{parse_usd_per_token, ContextTier, ModelPrice};

/// `(field, message)` of a refused table.
pub(super) type FieldError = (String, String);

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

/// The price of an entry, or why it is skipped; `Err` refuses the table.
/// (`label` makes the entry's JSON path, for an error only.)
pub(super) fn entry_price(
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
        max_output_tokens: entry.max_output_tokens.or(entry.max_tokens),
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
