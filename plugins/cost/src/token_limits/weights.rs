//! The weighted token count of one response: each class of token (uncached input, cached input,
//! cache creation, visible output, reasoning) times its weight, summed and rounded up to a whole
//! token (the idea of Envoy AI Gateway's `llmRequestCosts` CEL expressions and APISIX
//! ai-rate-limiting's `cost_expr`, with fixed weights instead of an expression).
//!
//! Weights are **fixed-point, 1/1000 of a token** ([`MILLI`]): written in the configuration as
//! JSON numbers with at most three decimals (`1`, `0.1`, `2.5`, `0.125`), read from the number's
//! text, never through a float. The sum is exact (`u128`), divided by 1000 once and rounded up,
//! then saturated to `u64::MAX`: no usage figure can overflow it or trap.

use serde::Deserialize;
use serde_json::value::RawValue;
use tollgate_common::config::ConfigError;

use crate::usage::Usage;

/// Fixed-point scale of a weight: 1000 = one token per token.
pub const MILLI: u32 = 1_000;
/// Largest weight (1000 tokens per token), in milli-units.
pub const MAX_WEIGHT_MILLI: u32 = 1_000 * MILLI;

/// The weights of one limit, in milli-units per token ([`MILLI`] = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    /// Input tokens neither read from nor written to the prompt cache.
    pub input: u32,
    /// Input tokens read from the prompt cache (default: `input`'s weight).
    pub cached_input: u32,
    /// Input tokens written to the prompt cache (default: `input`'s weight).
    pub cache_creation: u32,
    /// Output tokens other than reasoning tokens.
    pub output: u32,
    /// Reasoning tokens (default: `output`'s weight).
    pub reasoning: u32,
}

impl Default for Weights {
    /// Every token weighs one: the total, input + output.
    fn default() -> Self {
        Weights {
            input: MILLI,
            cached_input: MILLI,
            cache_creation: MILLI,
            output: MILLI,
            reasoning: MILLI,
        }
    }
}

/// `weights` as written: every member optional (see [`Weights`] for the defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeights {
    #[serde(default)]
    input: Option<Box<RawValue>>,
    #[serde(default)]
    output: Option<Box<RawValue>>,
    #[serde(default)]
    cached_input: Option<Box<RawValue>>,
    #[serde(default)]
    cache_creation: Option<Box<RawValue>>,
    #[serde(default)]
    reasoning: Option<Box<RawValue>>,
}

/// A weight's JSON number text in milli-units: digits, optionally `.` and one to three more
/// digits, at most [`MAX_WEIGHT_MILLI`]. `None` for anything else (a sign, an exponent, a
/// string, more decimals: a weight is exact or refused).
pub fn parse_milli(text: &str) -> Option<u32> {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) if !f.is_empty() && f.len() <= 3 => (w, f),
        Some(_) => return None,
        None => (text, ""),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (!fraction.is_empty() && !digits(fraction)) || whole.len() > 7 {
        return None;
    }
    let whole: u32 = whole.parse().ok()?;
    let mut milli = 0u32;
    let mut scale = 100u32;
    for b in fraction.bytes() {
        milli = milli.checked_add(u32::from(b.wrapping_sub(b'0')).checked_mul(scale)?)?;
        scale /= 10;
    }
    let value = whole.checked_mul(MILLI)?.checked_add(milli)?;
    (value <= MAX_WEIGHT_MILLI).then_some(value)
}

impl RawWeights {
    /// The weights, checked; `field` is the JSON path of `weights` (for errors).
    ///
    /// # Errors
    /// A weight that is not a number with at most three decimals from 0 to 1000, naming it.
    pub fn checked(&self, field: &str) -> Result<Weights, ConfigError> {
        let one = |raw: &Option<Box<RawValue>>, name: &str, default: u32| match raw {
            None => Ok(default),
            Some(v) => parse_milli(v.get()).ok_or_else(|| {
                ConfigError::new(
                    format!("{field}.{name}"),
                    format!(
                        "{}: must be a number from 0 to 1000 with at most three decimals",
                        v.get()
                    ),
                )
            }),
        };
        let input = one(&self.input, "input", MILLI)?;
        let output = one(&self.output, "output", MILLI)?;
        Ok(Weights {
            input,
            output,
            cached_input: one(&self.cached_input, "cached_input", input)?,
            cache_creation: one(&self.cache_creation, "cache_creation", input)?,
            reasoning: one(&self.reasoning, "reasoning", output)?,
        })
    }
}

impl Weights {
    /// The weighted tokens of `usage`, rounded up to a whole token:
    /// `⌈(input·(in − cached − creation) + cached_input·cached + cache_creation·creation +
    /// output·(out − reasoning) + reasoning·reasoning) / 1000⌉`, where `in` and `out` include
    /// the cache and reasoning figures (`crate::usage`). A breakdown larger than its total (a
    /// malformed usage) leaves that remainder at 0: every reported token is still counted once,
    /// at its class's weight. Saturates at `u64::MAX`.
    pub fn weighted(&self, usage: &Usage) -> u64 {
        let cache = usage
            .cached_input_tokens
            .saturating_add(usage.cache_creation_input_tokens);
        let terms = [
            (usage.input_tokens.saturating_sub(cache), self.input),
            (usage.cached_input_tokens, self.cached_input),
            (usage.cache_creation_input_tokens, self.cache_creation),
            (
                usage.output_tokens.saturating_sub(usage.reasoning_tokens),
                self.output,
            ),
            (usage.reasoning_tokens, self.reasoning),
        ];
        // Each term is below 2^64 · 2^20, five of them below 2^87: no u128 overflow.
        let milli: u128 = terms
            .iter()
            .map(|(n, w)| u128::from(*n).saturating_mul(u128::from(*w)))
            .fold(0u128, u128::saturating_add);
        u64::try_from(milli.div_ceil(u128::from(MILLI))).unwrap_or(u64::MAX)
    }

    /// An upper bound of what a response to a request of at most `input` input tokens and
    /// `output` output tokens can count: every input token at the highest input weight (plain,
    /// cache read, cache creation), every output token at the highest output weight (visible,
    /// reasoning), rounded up; saturating at `u64::MAX` (the reservation of
    /// `crate::reservation`'s estimate, in tokens).
    pub fn bound(&self, input: u64, output: u64) -> u64 {
        let input_weight = self.input.max(self.cached_input).max(self.cache_creation);
        let output_weight = self.output.max(self.reasoning);
        let milli = u128::from(input)
            .saturating_mul(u128::from(input_weight))
            .saturating_add(u128::from(output).saturating_mul(u128::from(output_weight)));
        u64::try_from(milli.div_ceil(u128::from(MILLI))).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, cached: u64, creation: u64, output: u64, reasoning: u64) -> Usage {
        Usage {
            model: None,
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            cache_creation_input_tokens: creation,
            reasoning_tokens: reasoning,
        }
    }

    fn weights(json: &str) -> Result<Weights, ConfigError> {
        let raw: RawWeights = serde_json::from_str(json).expect("json");
        raw.checked("token_limits.default[0].weights")
    }

    #[test]
    fn weights_are_read_exactly_from_the_text() {
        assert_eq!(parse_milli("1"), Some(1_000));
        assert_eq!(parse_milli("0"), Some(0));
        assert_eq!(parse_milli("0.1"), Some(100));
        assert_eq!(parse_milli("2.5"), Some(2_500));
        assert_eq!(parse_milli("0.125"), Some(125));
        assert_eq!(parse_milli("1000"), Some(MAX_WEIGHT_MILLI));
        for bad in [
            "1000.001",
            "0.1234",
            "-1",
            "1e3",
            "\"1\"",
            "true",
            "1.",
            ".5",
            "",
            "99999999",
            "4294967296",
            "null",
        ] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }

    #[test]
    fn defaults_follow_the_input_and_output_weights() {
        assert_eq!(weights("{}").expect("weights"), Weights::default());
        let w = weights(r#"{"input": 2, "output": 0.5, "cached_input": 0.1}"#).expect("weights");
        assert_eq!(
            w,
            Weights {
                input: 2_000,
                cached_input: 100,
                cache_creation: 2_000,
                output: 500,
                reasoning: 500
            }
        );
        let e = weights(r#"{"reasoning": 1e2}"#).expect_err("exponent");
        assert_eq!(e.field, "token_limits.default[0].weights.reasoning");
        assert!(serde_json::from_str::<RawWeights>(r#"{"speed": 1}"#).is_err());
    }

    #[test]
    fn the_default_weights_count_input_plus_output() {
        let w = Weights::default();
        // OpenAI: 100 prompt tokens (40 cached), 50 completion tokens (10 reasoning).
        assert_eq!(w.weighted(&usage(100, 40, 0, 50, 10)), 150);
        assert_eq!(w.weighted(&usage(0, 0, 0, 0, 0)), 0);
    }

    #[test]
    fn each_class_has_its_weight_and_the_sum_is_rounded_up_once() {
        let w = Weights {
            input: 1_000,
            cached_input: 100,
            cache_creation: 1_250,
            output: 4_000,
            reasoning: 3_000,
        };
        // 30 uncached·1 + 7 cached·0.1 + 3 created·1.25 + 40 visible·4 + 10 reasoning·3
        // = 30 + 0.7 + 3.75 + 160 + 30 = 224.45 → 225.
        assert_eq!(w.weighted(&usage(40, 7, 3, 50, 10)), 225);
        // 0.1 + 0.1 + 0.1 (three cached tokens): 0.3 → 1, rounded once, not per class.
        assert_eq!(w.weighted(&usage(3, 3, 0, 0, 0)), 1);
    }

    #[test]
    fn hostile_usage_figures_saturate_and_never_trap() {
        let max = Weights {
            input: MAX_WEIGHT_MILLI,
            cached_input: MAX_WEIGHT_MILLI,
            cache_creation: MAX_WEIGHT_MILLI,
            output: MAX_WEIGHT_MILLI,
            reasoning: MAX_WEIGHT_MILLI,
        };
        let m = u64::MAX;
        assert_eq!(max.weighted(&usage(m, m, m, m, m)), u64::MAX);
        assert_eq!(Weights::default().weighted(&usage(m, 0, 0, m, 0)), u64::MAX);
        // u64::MAX tokens at 0.001 each: exactly ⌈(2^64 − 1) / 1000⌉.
        let thin = Weights {
            input: 1,
            ..Weights::default()
        };
        assert_eq!(thin.weighted(&usage(m, 0, 0, 0, 0)), m.div_ceil(1_000));
        // Breakdowns above their totals: each reported token counted once at its weight.
        assert_eq!(
            Weights::default().weighted(&usage(10, 1_000, 5, 3, 9)),
            1_014
        );
        let free_cache = Weights {
            cached_input: 0,
            ..Weights::default()
        };
        assert_eq!(free_cache.weighted(&usage(10, m, 0, 0, 0)), 0);
    }

    #[test]
    fn the_bound_is_never_below_what_a_response_within_it_counts() {
        let w = Weights {
            input: 1_000,
            cached_input: 100,
            cache_creation: 1_250,
            output: 4_000,
            reasoning: 2_000,
        };
        assert_eq!(w.bound(1_000, 10), 1_250 + 40);
        // Any split of 1,000 input and 10 output tokens counts at most the bound.
        for (cached, creation, reasoning) in
            [(0, 0, 0), (1_000, 0, 10), (0, 1_000, 0), (300, 700, 5)]
        {
            let u = usage(1_000, cached, creation, 10, reasoning);
            assert!(w.weighted(&u) <= w.bound(1_000, 10));
        }
        assert_eq!(Weights::default().bound(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(Weights::default().bound(0, 0), 0);
    }
}
