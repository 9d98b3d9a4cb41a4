//! What a finished response is charged: its usage at the price of its model, or, for an LLM
//! call whose usage cannot be priced, the estimate `unpriced_charge` says (README, "Responses
//! that cannot be priced").
//!
//! The price is looked up by the response's model (a provider may answer with a dated variant
//! of the requested name), then the request's, then the response's again through the
//! configuration (`unknown_model.default_price`).

use crate::config::{Config, UnpricedCharge};
use crate::partial::completed;
use crate::price::cost_nano;
use crate::price_table::PriceTable;
use crate::unpriced::{estimate, Reason};
use crate::usage::Usage;

/// What a response is charged.
#[derive(Debug, PartialEq, Eq)]
pub enum Charge {
    /// Priced exactly: `nano` nano-USD for `usage`.
    Priced { usage: Usage, nano: u64 },
    /// An LLM call that could not be priced (`reason`), charged the estimate: `nano` nano-USD.
    Estimated { reason: Reason, nano: u64 },
    /// Not charged: not an LLM call (`reason: None`: no 2xx answer to a request naming a
    /// model), or an unpriceable one with no estimate (`unpriced_charge: none`, no price for
    /// the request's model, or an overflow).
    Unpriced { reason: Option<Reason> },
}

/// What one response exchange tells the charge.
#[derive(Debug, Clone, Copy)]
pub struct Exchange<'a> {
    /// The request body's `model`.
    pub request_model: Option<&'a str>,
    /// Whether it is what providers bill: a 2xx answer to a request that named a model.
    pub llm_call: bool,
    /// The request body's size (bytes).
    pub request_bytes: u64,
    /// The response body's size, decoded (bytes).
    pub response_bytes: u64,
    /// The usage a stream reported in part before it ended without its final usage
    /// (`ResponseReader::partial`), or `None`.
    pub partial: Option<&'a Usage>,
}

/// The charge of a response whose reading gave `outcome` (its usage, or why there is none),
/// at the prices of `table` (the table in use) under `config`.
pub fn charge(
    config: &Config,
    table: &PriceTable,
    outcome: Result<Usage, Reason>,
    exchange: &Exchange<'_>,
) -> Charge {
    let priced = outcome.and_then(|usage| {
        let price = usage
            .model
            .as_deref()
            .and_then(|m| table.get(m))
            .or_else(|| config.price(table, exchange.request_model))
            .or_else(|| config.price(table, usage.model.as_deref()));
        let price = price.ok_or(Reason::UnknownModel)?;
        let nano = cost_nano(&usage, price).map_err(|_| Reason::Inconsistent)?;
        Ok((usage, nano))
    });
    let reason = match priced {
        Ok((usage, nano)) => return Charge::Priced { usage, nano },
        Err(_) if !exchange.llm_call => return Charge::Unpriced { reason: None },
        Err(reason) => reason,
    };
    // Usage reported in part: its counts exactly, only the output estimated (`crate::partial`).
    if let Some(known) = exchange.partial {
        let usage = completed(known, exchange.response_bytes, config.unpriced_charge);
        let price = usage
            .model
            .as_deref()
            .and_then(|m| table.get(m))
            .or_else(|| config.price(table, exchange.request_model));
        if let Some(nano) = price.and_then(|p| cost_nano(&usage, p).ok()) {
            return Charge::Estimated {
                reason: Reason::PartialUsage,
                nano,
            };
        }
    }
    let estimated = match config.unpriced_charge {
        UnpricedCharge::Bytes => config
            .price(table, exchange.request_model)
            .and_then(|p| estimate(p, exchange.request_bytes, exchange.response_bytes)),
        UnpricedCharge::None => None,
    };
    match estimated {
        Some(nano) => Charge::Estimated { reason, nano },
        None => Charge::Unpriced {
            reason: Some(reason),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// $1 and $2 per million tokens (LiteLLM's per-token costs).
    const PRICES: &str =
        r#""prices": {"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}}"#;

    fn config(rest: &str) -> Config {
        let json = format!(r#"{{{PRICES}, "tenant": {{"header": "x-jwt-sub"}}{rest}}}"#);
        Config::parse(json.as_bytes()).expect("configuration")
    }

    fn usage(model: Option<&str>, input: u64, output: u64) -> Usage {
        Usage {
            model: model.map(str::to_string),
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    fn exchange(request_model: Option<&str>) -> Exchange<'_> {
        Exchange {
            request_model,
            llm_call: true,
            request_bytes: 1_000,
            response_bytes: 500,
            partial: None,
        }
    }

    #[test]
    fn usage_is_priced_by_the_response_model_then_the_request_model() {
        let c = config("");
        let table = c.prices.clone();
        // 1,000 input tokens at 1 µUSD and 500 output at 2 µUSD: 2,000,000 nano-USD.
        let by_response = charge(
            &c,
            &table,
            Ok(usage(Some("m"), 1_000, 500)),
            &exchange(Some("other")),
        );
        assert_eq!(
            by_response,
            Charge::Priced {
                usage: usage(Some("m"), 1_000, 500),
                nano: 2_000_000
            }
        );
        let by_request = charge(
            &c,
            &table,
            Ok(usage(Some("m-2026-01-01"), 1_000, 500)),
            &exchange(Some("m")),
        );
        assert!(
            matches!(
                by_request,
                Charge::Priced {
                    nano: 2_000_000,
                    ..
                }
            ),
            "{by_request:?}"
        );
    }

    #[test]
    fn an_unpriceable_llm_call_is_charged_its_bytes_at_the_request_models_price() {
        let c = config("");
        let table = c.prices.clone();
        // 1,000 request bytes and 500 response bytes as tokens: the same 2,000,000 nano-USD.
        let got = charge(&c, &table, Err(Reason::NoUsage), &exchange(Some("m")));
        assert_eq!(
            got,
            Charge::Estimated {
                reason: Reason::NoUsage,
                nano: 2_000_000
            }
        );
        let unknown = charge(&c, &table, Ok(usage(Some("x"), 1, 1)), &exchange(Some("y")));
        assert_eq!(
            unknown,
            Charge::Unpriced {
                reason: Some(Reason::UnknownModel)
            }
        );
    }

    #[test]
    fn unpriced_charge_none_and_non_llm_calls_charge_nothing() {
        let c = config(r#", "unpriced_charge": "none""#);
        let table = c.prices.clone();
        let got = charge(&c, &table, Err(Reason::Malformed), &exchange(Some("m")));
        assert_eq!(
            got,
            Charge::Unpriced {
                reason: Some(Reason::Malformed)
            }
        );
        let c = config("");
        let not_llm = Exchange {
            llm_call: false,
            ..exchange(Some("m"))
        };
        assert_eq!(
            charge(&c, &table, Err(Reason::ContentType), &not_llm),
            Charge::Unpriced { reason: None }
        );
    }

    #[test]
    fn usage_reported_in_part_is_charged_exactly_and_only_the_output_estimated() {
        let c = config("");
        let table = c.prices.clone();
        // message_start's 1,000 input tokens (and 1 output), then the stream cut after 500
        // bytes: 1,000 at 1 µUSD + 500 estimated output at 2 µUSD, not 1,000 request bytes.
        let known = usage(Some("m"), 1_000, 1);
        let cut = Exchange {
            request_bytes: 40,
            partial: Some(&known),
            ..exchange(Some("m"))
        };
        assert_eq!(
            charge(&c, &table, Err(Reason::Incomplete), &cut),
            Charge::Estimated {
                reason: Reason::PartialUsage,
                nano: 2_000_000
            }
        );
        // Without a partial usage: the bytes estimate (40 + 500 tokens).
        let bytes_only = Exchange {
            partial: None,
            ..cut
        };
        assert_eq!(
            charge(&c, &table, Err(Reason::Incomplete), &bytes_only),
            Charge::Estimated {
                reason: Reason::Incomplete,
                nano: 1_040_000
            }
        );
        // `unpriced_charge: none`: the reported counts alone (1,000 in, 1 out).
        let none = config(r#", "unpriced_charge": "none""#);
        assert_eq!(
            charge(&none, &table, Err(Reason::Incomplete), &cut),
            Charge::Estimated {
                reason: Reason::PartialUsage,
                nano: 1_002_000
            }
        );
        // Not an LLM call (no 2xx): nothing, whatever was reported.
        let failed = Exchange {
            llm_call: false,
            ..cut
        };
        assert_eq!(
            charge(&c, &table, Err(Reason::Incomplete), &failed),
            Charge::Unpriced { reason: None }
        );
    }
}
