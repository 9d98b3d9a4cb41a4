//! A stream that ended without its final usage but reported part of it before (Anthropic's
//! `message_start`: input and cache counts, then the stream cut before `message_delta`): the
//! reported counts are charged as they are, and only the unknown part, the output, is
//! estimated (README, "Usage never lost").
//!
//! The estimate is the one `unpriced_charge: bytes` makes for a response without usage (one
//! output token per byte of the decoded response body, `crate::unpriced`), applied to the
//! output alone; with `unpriced_charge: none` nothing is estimated and the reported counts are
//! charged alone. Cost and token limits both count [`completed`]'s figures.

use crate::config::UnpricedCharge;
use crate::usage::Usage;

/// The usage charged for a stream that reported `known` in part (`response_bytes`: its decoded
/// body bytes): `known`'s input, cache and reasoning counts; output tokens the larger of the
/// reported count and, with `unpriced_charge: bytes`, `response_bytes` (every output token is
/// at least one byte of the body, so the estimate is not below what was produced as text).
pub fn completed(known: &Usage, response_bytes: u64, unpriced_charge: UnpricedCharge) -> Usage {
    let estimated = match unpriced_charge {
        UnpricedCharge::Bytes => response_bytes,
        UnpricedCharge::None => 0,
    };
    Usage {
        output_tokens: known.output_tokens.max(estimated),
        ..known.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Usage {
        Usage {
            model: Some("claude".into()),
            input_tokens: 2_022,
            output_tokens: 1,
            cached_input_tokens: 2_000,
            ..Usage::default()
        }
    }

    #[test]
    fn the_reported_counts_stay_and_the_output_is_at_least_the_bytes() {
        let got = completed(&known(), 700, UnpricedCharge::Bytes);
        assert_eq!(
            got,
            Usage {
                output_tokens: 700,
                ..known()
            }
        );
        // A reported output count above the bytes is kept (never charged less than reported).
        assert_eq!(
            completed(&known(), 0, UnpricedCharge::Bytes).output_tokens,
            1
        );
        // No estimate: the reported counts alone.
        assert_eq!(completed(&known(), 700, UnpricedCharge::None), known());
    }
}
