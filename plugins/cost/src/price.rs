//! Exact money arithmetic.
//!
//! Units:
//! - **prices**: atto-USD (10^-18 USD) per token, `u64`. A LiteLLM price such as
//!   `1.5e-07` USD/token is 150,000,000,000 atto-USD/token. Any decimal price with at most 18
//!   digits after the decimal point and at most 18.4 USD/token is exact in this unit; others are
//!   refused when the configuration loads ([`parse_usd_per_token`]).
//! - **costs and spend**: nano-USD (10^-9 USD), `u64` (up to 1.8·10^10 USD).
//!
//! A request's cost is the exact sum, in atto-USD with `u128` intermediates (every product of a
//! `u64` token count and a `u64` price fits; the sum is checked), converted once to nano-USD by
//! rounding half up (`floor((atto + 5·10^8) / 10^9)`). Ledgers then add nano-USD integers, so the
//! total over any number of requests is the exact sum of the rounded per-request costs: no
//! floating point anywhere.

use crate::usage::Usage;

/// atto-USD per USD.
pub const ATTO_PER_USD: u128 = 1_000_000_000_000_000_000;
/// atto-USD per nano-USD.
pub const ATTO_PER_NANO: u128 = 1_000_000_000;

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
    let parts: [(u64, u64); 5] = [
        (uncached, price.input),
        (
            usage.cached_input_tokens,
            price.cache_read.unwrap_or(price.input),
        ),
        (
            usage.cache_creation_input_tokens,
            price.cache_creation.unwrap_or(price.input),
        ),
        (plain_output, price.output),
        (
            usage.reasoning_tokens,
            price.reasoning.unwrap_or(price.output),
        ),
    ];
    let mut total: u128 = 0;
    for (tokens, unit) in parts {
        // u64 × u64 < 2^128: never overflows.
        let part = u128::from(tokens)
            .checked_mul(u128::from(unit))
            .ok_or(PriceError::Overflow)?;
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
/// (`+`|`-`)? digits)?. Errors (a message for the configuration error): negative, not a number,
/// more precise than 10^-18 USD, or larger than `u64::MAX` atto-USD (18.4 USD/token).
pub fn parse_usd_per_token(text: &str) -> Result<u64, String> {
    let text = text.trim();
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
    let digits = format!("{int_part}{frac_part}");
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
    if scale < 0 {
        return Err(format!(
            "{text} USD/token is not a whole number of atto-USD (10^-18 USD) per token"
        ));
    }
    if significant.len() > 20 || scale > 20 {
        return Err(too_big());
    }
    let mut value: u128 = significant.parse().map_err(|_| too_big())?;
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
    fn refuses_what_is_not_exact_or_not_a_price() {
        for bad in [
            "-1e-7",
            "1e-19",
            "0.0000000000000000001",
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
