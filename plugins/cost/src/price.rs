//! Exact money arithmetic.
//!
//! Units:
//! - **prices**: atto-USD (10^-18 USD) per token, `u64`. A LiteLLM price such as
//!   `1.5e-07` USD/token is 150,000,000,000 atto-USD/token. Any decimal price with at most 18
//!   digits after the decimal point and at most 18.4 USD/token is exact in this unit. A price
//!   written more precisely (binary floating-point noise, as in LiteLLM's
//!   `1.0000000000000001e-7`) is rounded to the nearest atto-USD, halves up; a non-zero price
//!   that rounds to 0 is refused, as are negative, non-numeric and absurd values
//!   ([`parse_usd_per_token`]).
//! - **costs and spend**: nano-USD (10^-9 USD), `u64` (up to 1.8·10^10 USD).
//!
//! A request's cost is the exact sum, in atto-USD with `u128` intermediates (every product of a
//! `u64` token count and a `u64` price fits; the sum is checked), converted once to nano-USD by
//! rounding half up (`floor((atto + 5·10^8) / 10^9)`). Ledgers then add nano-USD integers, so the
//! total over any number of requests is the exact sum of the rounded per-request costs: no
//! floating point anywhere.

use tollgate_common::arith::mul_wide;

use crate::usage::Usage;

/// atto-USD per USD.
pub const ATTO_PER_USD: u128 = 1_000_000_000_000_000_000;
/// atto-USD per nano-USD.
pub const ATTO_PER_NANO: u128 = 1_000_000_000;
/// Longest number text read as a price (characters); LiteLLM's longest is 23.
pub const MAX_NUMBER_CHARS: usize = 64;

/// One model's prices, atto-USD per token (LiteLLM field names in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelPrice {
    /// Uncached input token [`input_cost_per_token`].
    pub input: u64,
    /// Output token [`output_cost_per_token`].
    pub output: u64,
    /// Input token read from the prompt cache [`cache_read_input_token_cost`]; `None`: `input`.
    pub cache_read: Option<u64>,
    /// Input token written to the prompt cache [`cache_creation_input_token_cost`]; `None`:
    /// `input`.
    pub cache_creation: Option<u64>,
    /// Reasoning output token [`output_cost_per_reasoning_token`]; `None`: `output`.
    pub reasoning: Option<u64>,
    /// Prices of requests whose prompt is longer than a threshold (LiteLLM's
    /// `*_above_<N>k_tokens` fields).
    pub tier: Option<ContextTier>,
    /// The most output tokens one response of the model may have [`max_output_tokens`, else
    /// `max_tokens`]; `None`: not in the entry. Only bounds a reservation (`crate::reservation`),
    /// never a price.
    pub max_output_tokens: Option<u64>,
}

/// LiteLLM's context-length tier: when a request's input tokens (cache reads and writes
/// included) exceed `above_input_tokens`, every token of it is priced at these rates
/// (`input_cost_per_token_above_200k_tokens`, `output_cost_per_token_above_200k_tokens`,
/// `cache_read_input_token_cost_above_200k_tokens`,
/// `cache_creation_input_token_cost_above_200k_tokens`), each absent one falling back to the
/// base rate, as in LiteLLM's `_get_token_base_cost` (litellm 1.109.1). atto-USD per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextTier {
    /// The threshold (tokens, exclusive: `200k` is 200,000).
    pub above_input_tokens: u64,
    /// Uncached input token.
    pub input: Option<u64>,
    /// Output token.
    pub output: Option<u64>,
    /// Cache read.
    pub cache_read: Option<u64>,
    /// Cache creation.
    pub cache_creation: Option<u64>,
}

impl ModelPrice {
    /// The rates that apply to a request with `input_tokens` input tokens (its tier's when
    /// above the threshold), with every fallback resolved: `(input, cache_read,
    /// cache_creation, output, reasoning)`.
    pub fn rates(&self, input_tokens: u64) -> [u64; 5] {
        let tier = self
            .tier
            .filter(|t| input_tokens > t.above_input_tokens)
            .unwrap_or_default();
        let input = tier.input.unwrap_or(self.input);
        let output = tier.output.unwrap_or(self.output);
        [
            input,
            tier.cache_read.or(self.cache_read).unwrap_or(input),
            tier.cache_creation.or(self.cache_creation).unwrap_or(input),
            output,
            self.reasoning.unwrap_or(output),
        ]
    }
}

/// Why a usage could not be priced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceError {
    /// The cached/cache-creation tokens exceed the input tokens, or reasoning exceeds output.
    Inconsistent,
    /// The cost does not fit the units (absurd token counts).
    Overflow,
}

/// The cost of `usage` at `price`, in atto-USD (exact).
///
/// `usage` is normalised (see [`Usage`]): `input_tokens` includes the cache reads and cache
/// creations, `output_tokens` includes the reasoning tokens. Each part is priced once:
/// `(input − cached − creation)·input + cached·cache_read + creation·cache_creation +
/// (output − reasoning)·output + reasoning·reasoning`.
pub fn cost_atto(usage: &Usage, price: &ModelPrice) -> Result<u128, PriceError> {
    let uncached = usage
        .input_tokens
        .checked_sub(usage.cached_input_tokens)
        .and_then(|v| v.checked_sub(usage.cache_creation_input_tokens))
        .ok_or(PriceError::Inconsistent)?;
    let plain_output = usage
        .output_tokens
        .checked_sub(usage.reasoning_tokens)
        .ok_or(PriceError::Inconsistent)?;
    let [input, cache_read, cache_creation, output, reasoning] = price.rates(usage.input_tokens);
    let parts: [(u64, u64); 5] = [
        (uncached, input),
        (usage.cached_input_tokens, cache_read),
        (usage.cache_creation_input_tokens, cache_creation),
        (plain_output, output),
        (usage.reasoning_tokens, reasoning),
    ];
    let mut total: u128 = 0;
    for (tokens, unit) in parts {
        // u64 × u64 < 2^128: never overflows.
        let part = mul_wide(tokens, unit);
        total = total.checked_add(part).ok_or(PriceError::Overflow)?;
    }
    Ok(total)
}

/// atto-USD to nano-USD, rounded half up (…499 999 999 atto down, …500 000 000 up).
pub fn atto_to_nano(atto: u128) -> Result<u64, PriceError> {
    let half = ATTO_PER_NANO / 2;
    let nano = atto
        .checked_add(half)
        .ok_or(PriceError::Overflow)?
        .checked_div(ATTO_PER_NANO)
        .ok_or(PriceError::Overflow)?;
    u64::try_from(nano).map_err(|_| PriceError::Overflow)
}

/// The cost of `usage` at `price` in nano-USD, rounded half up once (see the module docs).
pub fn cost_nano(usage: &Usage, price: &ModelPrice) -> Result<u64, PriceError> {
    atto_to_nano(cost_atto(usage, price)?)
}

/// A JSON number's text (USD per token) as atto-USD per token, exactly.
///
/// Accepts the JSON number grammar (RFC 8259 section 6): `-`? digits (`.` digits)? (`e`|`E`
/// (`+`|`-`)? digits)?, at most [`MAX_NUMBER_CHARS`] characters. A value more precise than
/// 10^-18 USD is rounded to the nearest atto-USD, a half up (`1.0000000000000001e-7` is
/// 100,000,000,000 atto-USD; `2.5e-18` is 3). Errors (a message for the configuration error):
/// negative, not a number, non-zero but under half an atto-USD (rounds to 0: a unit error, not
/// noise), or larger than `u64::MAX` atto-USD (18.4 USD/token).
pub fn parse_usd_per_token(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.len() > MAX_NUMBER_CHARS {
        return Err(format!(
            "a number of {} characters is not a price (at most {MAX_NUMBER_CHARS})",
            text.len()
        ));
    }
    if text.starts_with('-') {
        // "-0" is zero, whatever its sign.
        let rest = text.trim_start_matches('-');
        return match parse_usd_per_token(rest) {
            Ok(0) => Ok(0),
            _ => Err(format!("{text} is negative: prices must be ≥ 0")),
        };
    }
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => {
            let (m, e) = text.split_at(at);
            let e = e.get(1..).unwrap_or("");
            let e: i64 = e
                .strip_prefix('+')
                .unwrap_or(e)
                .parse()
                .map_err(|_| format!("{text} is not a JSON number"))?;
            (m, e)
        }
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int_part.is_empty()
        || !digits_ok(int_part)
        || !digits_ok(frac_part)
        || (mantissa.contains('.') && frac_part.is_empty())
    {
        return Err(format!("{text} is not a JSON number"));
    }
    // value = digits · 10^(exponent − frac_len) USD = digits · 10^(exponent − frac_len + 18) atto.
    // (On the stack: the text is at most MAX_NUMBER_CHARS long.)
    let mut buf = [0u8; MAX_NUMBER_CHARS];
    let mut len = 0usize;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        if let Some(slot) = buf.get_mut(len) {
            *slot = b;
            len = len.saturating_add(1);
        }
    }
    let digits = std::str::from_utf8(buf.get(..len).unwrap_or_default())
        .map_err(|_| format!("{text} is not a JSON number"))?;
    let digits = digits.trim_start_matches('0');
    let trailing_zeros = digits
        .len()
        .saturating_sub(digits.trim_end_matches('0').len());
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    let frac_len = i64::try_from(frac_part.len()).map_err(|_| "too long".to_string())?;
    let zeros = i64::try_from(trailing_zeros).map_err(|_| "too long".to_string())?;
    let scale = exponent
        .checked_sub(frac_len)
        .and_then(|s| s.checked_add(18))
        .and_then(|s| s.checked_add(zeros))
        .ok_or_else(|| format!("{text}: exponent out of range"))?;
    let too_big = || format!("{text} USD/token is more than 18.4 USD per token");
    let (kept, round_up) = if scale < 0 {
        // Digits finer than an atto-USD: keep the others, round on the first one dropped.
        let drop = usize::try_from(scale.unsigned_abs()).unwrap_or(usize::MAX);
        let keep = significant.len().saturating_sub(drop);
        let first_dropped = if drop > significant.len() {
            b'0'
        } else {
            significant.as_bytes().get(keep).copied().unwrap_or(b'0')
        };
        (significant.get(..keep).unwrap_or(""), first_dropped >= b'5')
    } else {
        (significant, false)
    };
    let scale = scale.max(0);
    if kept.len() > 20 || scale > 20 {
        return Err(too_big());
    }
    let mut value: u128 = if kept.is_empty() {
        0
    } else {
        kept.parse().map_err(|_| too_big())?
    };
    if round_up {
        value = value.saturating_add(1);
    }
    if value == 0 {
        return Err(format!(
            "{text} USD/token is under half an atto-USD (10^-18 USD) per token: not a price"
        ));
    }
    for _ in 0..scale {
        value = value.checked_mul(10).ok_or_else(too_big)?;
    }
    u64::try_from(value).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_litellm_numbers_exactly() {
        assert_eq!(parse_usd_per_token("1.5e-07"), Ok(150_000_000_000));
        assert_eq!(parse_usd_per_token("0.00000015"), Ok(150_000_000_000));
        assert_eq!(parse_usd_per_token("7.5E-8"), Ok(75_000_000_000));
        assert_eq!(parse_usd_per_token("3e-06"), Ok(3_000_000_000_000));
        assert_eq!(parse_usd_per_token("1.25e-6"), Ok(1_250_000_000_000));
        assert_eq!(parse_usd_per_token("0"), Ok(0));
        assert_eq!(parse_usd_per_token("0.0"), Ok(0));
        assert_eq!(parse_usd_per_token("-0"), Ok(0));
        assert_eq!(parse_usd_per_token("1e-18"), Ok(1));
        assert_eq!(parse_usd_per_token("10e-19"), Ok(1));
        assert_eq!(parse_usd_per_token("18"), Ok(18_000_000_000_000_000_000));
        assert_eq!(parse_usd_per_token("1.0e+0"), Ok(ATTO_PER_USD as u64));
    }

    #[test]
    fn rounds_floating_point_noise_to_the_nearest_atto_usd() {
        // Seen in LiteLLM 1.109.1's price file.
        assert_eq!(
            parse_usd_per_token("1.0000000000000001e-7"),
            Ok(100_000_000_000)
        );
        assert_eq!(
            parse_usd_per_token("8.900000000000001e-7"),
            Ok(890_000_000_000)
        );
        assert_eq!(
            parse_usd_per_token("3.0001999999999996e-07"),
            Ok(300_020_000_000)
        );
        assert_eq!(
            parse_usd_per_token("2.9999900000000002e-06"),
            Ok(2_999_990_000_000)
        );
        // Halves up, at the unit.
        assert_eq!(parse_usd_per_token("2.5e-18"), Ok(3));
        assert_eq!(parse_usd_per_token("2.49e-18"), Ok(2));
        assert_eq!(parse_usd_per_token("5e-19"), Ok(1));
        assert_eq!(parse_usd_per_token("0.00000000000000000149"), Ok(1));
    }

    #[test]
    fn refuses_what_is_not_exact_or_not_a_price() {
        for bad in [
            "-1e-7",
            "-1.0000000000000001e-7",
            "1e-19",
            "4.9e-19",
            "1e-300",
            "0.0000000000000000001",
            "0.00000000000000000000000000000000000000000000000000000000000000001",
            "19",
            "1e300",
            "abc",
            "1.",
            ".5",
            "",
            "1e",
            "1e-99999999999999999999",
        ] {
            assert!(parse_usd_per_token(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rounds_half_up_once() {
        assert_eq!(atto_to_nano(0), Ok(0));
        assert_eq!(atto_to_nano(499_999_999), Ok(0));
        assert_eq!(atto_to_nano(500_000_000), Ok(1));
        assert_eq!(atto_to_nano(1_499_999_999), Ok(1));
        assert_eq!(atto_to_nano(1_500_000_000), Ok(2));
        assert!(atto_to_nano(u128::MAX).is_err());
    }

    #[test]
    fn prices_each_part_once() {
        let price = ModelPrice {
            input: 1_000,
            output: 10_000,
            cache_read: Some(100),
            cache_creation: Some(2_000),
            reasoning: Some(50_000),
            tier: None,
            max_output_tokens: None,
        };
        let usage = Usage {
            input_tokens: 100,
            cached_input_tokens: 30,
            cache_creation_input_tokens: 20,
            output_tokens: 40,
            reasoning_tokens: 10,
            ..Usage::default()
        };
        // 50·1000 + 30·100 + 20·2000 + 30·10000 + 10·50000
        assert_eq!(
            cost_atto(&usage, &price),
            Ok(50_000 + 3_000 + 40_000 + 300_000 + 500_000)
        );
        let bare = ModelPrice {
            input: 1_000,
            output: 10_000,
            ..ModelPrice::default()
        };
        // Missing cache/reasoning prices fall back to input/output.
        assert_eq!(cost_atto(&usage, &bare), Ok(100 * 1_000 + 40 * 10_000));
        let bad = Usage {
            input_tokens: 10,
            cached_input_tokens: 11,
            ..Usage::default()
        };
        assert_eq!(cost_atto(&bad, &bare), Err(PriceError::Inconsistent));
        let max = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            ..Usage::default()
        };
        let p = ModelPrice {
            input: u64::MAX,
            output: u64::MAX,
            ..ModelPrice::default()
        };
        // Two maximal products exceed u128: refused, not wrapped.
        assert_eq!(cost_atto(&max, &p), Err(PriceError::Overflow));
        let one = Usage {
            input_tokens: u64::MAX,
            ..Usage::default()
        };
        assert!(cost_atto(&one, &p).is_ok());
        assert_eq!(cost_nano(&one, &p), Err(PriceError::Overflow));
    }
}
