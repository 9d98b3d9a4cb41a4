//! LLM responses that cannot be priced exactly: why ([`Reason`]), and what they are charged
//! instead ([`estimate`]).
//!
//! A response counts as an LLM call when its request named a model (the request body's `model`)
//! and it succeeded (2xx): that is what providers bill. Such a response that cannot be priced from
//! its own `usage` is counted by reason (`tollgate_cost_unpriced_total.reason.<reason>`), logged
//! at most once per interval, and, with `unpriced_charge: bytes` (the default), charged an
//! estimate: the model's price for one input token per byte of the request body and one output
//! token per byte of the (decoded) response body. Every token of the byte-level BPE tokenizers
//! the providers use stands for at least one byte of text, so for text the estimate is at least
//! the real charge; it can fall short for tokens that are not in the bytes: hidden reasoning
//! tokens, and images or audio given by URL (see the README's overspend bound).

use crate::price::{cost_nano, ModelPrice};
use crate::usage::Usage;

/// Why an LLM response could not be priced from its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The body had no usage (or usage without an input count).
    NoUsage,
    /// The body (or an SSE payload mentioning usage) was not well-formed JSON.
    Malformed,
    /// The body or stream ended early: truncated, reset, or a stream without its final usage.
    Incomplete,
    /// A stream that ended without its final usage after reporting part of it (its input
    /// count): charged the reported counts and an estimate of the output (`crate::partial`).
    PartialUsage,
    /// A `Content-Encoding` the filter cannot decode, or corrupt compressed data.
    Encoding,
    /// The decoded body exceeded `max_decoded_bytes`.
    DecodeLimit,
    /// A `usage` or `model` value longer than `max_event_bytes`.
    TooLarge,
    /// A content type that is neither JSON nor an event stream.
    ContentType,
    /// Neither the response's model nor the request's has a price (and no `default_price`).
    UnknownModel,
    /// Counts that contradict each other (more cached than input tokens, more reasoning than
    /// output tokens) or a cost beyond `u64` nano-USD.
    Inconsistent,
}

impl Reason {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::NoUsage => "no_usage",
            Reason::Malformed => "malformed",
            Reason::Incomplete => "incomplete",
            Reason::PartialUsage => "partial_usage",
            Reason::Encoding => "encoding",
            Reason::DecodeLimit => "decode_limit",
            Reason::TooLarge => "too_large",
            Reason::ContentType => "content_type",
            Reason::UnknownModel => "unknown_model",
            Reason::Inconsistent => "inconsistent",
        }
    }

    /// Every reason (for defining the counters).
    pub const ALL: [Reason; 10] = [
        Reason::NoUsage,
        Reason::Malformed,
        Reason::Incomplete,
        Reason::PartialUsage,
        Reason::Encoding,
        Reason::DecodeLimit,
        Reason::TooLarge,
        Reason::ContentType,
        Reason::UnknownModel,
        Reason::Inconsistent,
    ];
}

/// The estimate charged for an unpriceable LLM response (nano-USD, rounded half up once):
/// `request_bytes` input tokens and `response_bytes` output tokens at `price`. `None` on
/// overflow (more than `u64::MAX` nano-USD).
pub fn estimate(price: &ModelPrice, request_bytes: u64, response_bytes: u64) -> Option<u64> {
    let usage = Usage {
        input_tokens: request_bytes,
        output_tokens: response_bytes,
        ..Usage::default()
    };
    cost_nano(&usage, price).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_byte_at_the_model_price() {
        // 1.5e-07 and 6e-07 USD per token: 150 and 600 nano-USD.
        let p = ModelPrice {
            input: 150_000_000_000,
            output: 600_000_000_000,
            cache_read: Some(1),
            cache_creation: None,
            reasoning: Some(1),
            tier: None,
            max_output_tokens: None,
        };
        assert_eq!(estimate(&p, 1_000, 10), Some(156_000));
        assert_eq!(estimate(&p, 0, 0), Some(0));
        assert_eq!(estimate(&p, u64::MAX, u64::MAX), None);
        let labels: Vec<_> = Reason::ALL.iter().map(|r| r.label()).collect();
        let mut unique = labels.clone();
        unique.dedup();
        assert_eq!(labels, unique);
    }
}
