//! What a finished response counts against token limits: its usage as the response reported it
//! (JSON body, or a stream's final usage event: `crate::response_reader`), whether or not its
//! model has a price; for an LLM call whose usage cannot be read, the estimate cost charges
//! with `unpriced_charge: bytes` (one input token per request byte, one output token per
//! response byte, `crate::unpriced`); for a stream that reported its usage in part, the figures
//! cost charges (`crate::partial`: the reported counts, the output estimated); otherwise
//! nothing.

use crate::charge::Exchange;
use crate::config::UnpricedCharge;
use crate::partial::completed;
use crate::unpriced::Reason;
use crate::usage::Usage;

/// The token counts of a response whose reading gave `outcome`, or `None` when nothing is
/// counted (not an LLM call, or `unpriced_charge: none`).
pub fn counted(
    outcome: &Result<Usage, Reason>,
    exchange: &Exchange<'_>,
    unpriced_charge: UnpricedCharge,
) -> Option<Usage> {
    match outcome {
        Ok(usage) => Some(usage.clone()),
        Err(_) if !exchange.llm_call => None,
        Err(_) if exchange.partial.is_some() => exchange
            .partial
            .map(|known| completed(known, exchange.response_bytes, unpriced_charge)),
        Err(_) => match unpriced_charge {
            UnpricedCharge::Bytes => Some(Usage {
                input_tokens: exchange.request_bytes,
                output_tokens: exchange.response_bytes,
                ..Usage::default()
            }),
            UnpricedCharge::None => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(llm_call: bool) -> Exchange<'static> {
        Exchange {
            request_model: Some("m"),
            llm_call,
            request_bytes: 300,
            response_bytes: 1_200,
            partial: None,
        }
    }

    #[test]
    fn usage_counts_whether_or_not_it_is_priced() {
        let u = Usage {
            model: Some("no-price".into()),
            input_tokens: 5,
            output_tokens: 7,
            ..Usage::default()
        };
        assert_eq!(
            counted(&Ok(u.clone()), &exchange(true), UnpricedCharge::None),
            Some(u)
        );
    }

    #[test]
    fn an_unreadable_llm_response_counts_its_bytes_as_cost_estimates_it() {
        let got = counted(
            &Err(Reason::NoUsage),
            &exchange(true),
            UnpricedCharge::Bytes,
        )
        .expect("estimate");
        assert_eq!((got.input_tokens, got.output_tokens), (300, 1_200));
        assert_eq!(
            counted(&Err(Reason::NoUsage), &exchange(true), UnpricedCharge::None),
            None
        );
        assert_eq!(
            counted(
                &Err(Reason::ContentType),
                &exchange(false),
                UnpricedCharge::Bytes
            ),
            None
        );
    }

    #[test]
    fn usage_reported_in_part_counts_what_cost_charges() {
        let known = Usage {
            input_tokens: 900,
            output_tokens: 1,
            ..Usage::default()
        };
        let cut = Exchange {
            partial: Some(&known),
            ..exchange(true)
        };
        let got = counted(&Err(Reason::Incomplete), &cut, UnpricedCharge::Bytes).expect("counted");
        assert_eq!((got.input_tokens, got.output_tokens), (900, 1_200));
        let got = counted(&Err(Reason::Incomplete), &cut, UnpricedCharge::None).expect("counted");
        assert_eq!((got.input_tokens, got.output_tokens), (900, 1));
    }
}
