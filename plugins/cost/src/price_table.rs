//! The price table: LiteLLM's price file (`model_prices_and_context_window.json`, shipped in the
//! `litellm` package as `model_prices_and_context_window_backup.json`) read as it is, and the
//! lookup of the model names responses carry.
//!
//! # Loading
//! The file is a JSON object of entries by model name. An entry priced per token (both
//! `input_cost_per_token` and `output_cost_per_token`; an `embedding` entry needs only the input
//! price) is loaded with the fields of [`PRICE_FIELDS`] and its context tier (see
//! [`ContextTier`]). Other entries are **skipped**, counted per [`SkipReason`], never refused:
//! - `sample_spec`, LiteLLM's description of the schema;
//! - entries without a per-token price (priced per image, pixel, second, character, query,
//!   page..., or without a price at all);
//! - entries with more than one context tier, or with `tiered_pricing` (prices by prompt-length
//!   ranges, which this filter does not implement).
//!
//! An entry without a per-token price of its own that has `alias_of` (LiteLLM's
//! `"bedrock/claude-opus-latest": {"alias_of": "global.anthropic.claude-opus-5-5"}`) is priced
//! as the entry it names, followed once the whole file is read, through at most
//! [`MAX_ALIAS_HOPS`] aliases; an alias whose chain ends on no per-token price, loops or is
//! longer is skipped ([`SkipReason::AliasUnpriced`]). Names are matched exactly there; a name
//! the file also gives with a price of its own keeps that price.
//!
//! Every other member of an entry (`max_tokens`, `mode`, `litellm_provider`, `supports_*`,
//! `source`, service-tier prices such as `input_cost_per_token_priority` or `_batches`, ...) is
//! ignored. A price field that is present but negative, not a number, or absurd (see
//! [`parse_usd_per_token`]) refuses the whole table, naming `<label>.<model>.<field>`: a
//! table with a wrong number in it is not trusted. Values are read from the JSON text, never
//! through a float (floating-point noise is rounded to the nearest atto-USD).
//!
//! # Lookup ([`PriceTable::get`])
//! A response (or request) names a model; the first of these that is a key of the table wins,
//! and nothing else is tried (no prefix matching, no guessing):
//! 1. the name exactly (`gpt-4o-mini-2024-07-18` has its own LiteLLM entry, used as is);
//! 2. without a provider prefix `openai/` or `anthropic/` (the APIs this filter reads);
//! 3. without a trailing date of a dated snapshot: `-YYYY-MM-DD` (OpenAI,
//!    `gpt-4o-mini-2024-07-18` → `gpt-4o-mini`) or `-YYYYMMDD` (Anthropic,
//!    `claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`), on the name of step 2;
//!
//! else the model has no price (the `unknown_model` policy applies). At most three hash
//! lookups and no allocation: O(1) in the size of the table.
//!
//! # Files
//! One concern a file: `lookup` ([`PriceTable`] and its lookup rules above), `load` (a whole
//! file read into a [`Loaded`] table), `incremental` (the same, a slice per callback:
//! [`IncrementalParse`]), `entry` (what is read of one entry), `entry_price` (what an entry is
//! priced at, or why it is skipped), `aliases` (`alias_of` followed once the file is read),
//! `skipped` (the entries not loaded, by reason).
//!
//! [`ContextTier`]: crate::price::ContextTier
//! [`parse_usd_per_token`]: crate::price::parse_usd_per_token

mod aliases;
mod entry;
mod entry_price;
mod incremental;
mod load;
mod lookup;
mod skipped;

pub use aliases::MAX_ALIAS_HOPS;
pub use entry::{Entry, PRICE_FIELDS};
pub use entry_price::single_price;
pub use incremental::{IncrementalParse, Step};
pub use load::{Loaded, SAMPLE_SPEC};
pub use lookup::PriceTable;
pub use skipped::{SkipReason, Skipped};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::price::ModelPrice;
    use tollgate_common::config::ConfigError;

    fn load(json: &str) -> Result<Loaded, ConfigError> {
        PriceTable::parse(json.as_bytes(), "prices")
    }

    #[test]
    fn loads_per_token_entries_and_skips_the_others_with_reasons() {
        let loaded = load(
            r#"{
            "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                            "max_tokens": "LEGACY parameter", "mode": "one of: chat, ..."},
            "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
                            "cache_read_input_token_cost": 7.5e-08, "mode": "chat",
                            "input_cost_per_token_priority": 2.5e-07,
                            "search_context_cost_per_query": {"search_context_size_low": 0.025},
                            "supported_regions": ["global"], "unknown_future_field": {"a": [1]}},
            "dall-e-3": {"output_cost_per_image": 0.04, "mode": "image_generation"},
            "whisper-1": {"input_cost_per_second": 0.0001, "mode": "audio_transcription"},
            "tts-1": {"input_cost_per_character": 1.5e-05, "mode": "audio_speech"},
            "text-embedding-3-small": {"input_cost_per_token": 2e-08, "mode": "embedding"},
            "odd": {"input_cost_per_token": 1e-06, "mode": "chat"},
            "nothing": {"mode": "chat"},
            "ranges": {"mode": "chat", "tiered_pricing": [{"input_cost_per_token": 5e-08,
                       "output_cost_per_token": 4e-07, "range": [0, 256000.0]}]},
            "two-tiers": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
                          "input_cost_per_token_above_32k_tokens": 2e-06,
                          "input_cost_per_token_above_256k_tokens": 4e-06},
            "noisy": {"input_cost_per_token": 1.0000000000000001e-07,
                      "output_cost_per_token": 8.900000000000001e-07}
        }"#,
        )
        .unwrap();
        let t = &loaded.table;
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.get("gpt-4o-mini").unwrap().cache_read,
            Some(75_000_000_000)
        );
        assert_eq!(t.get("text-embedding-3-small").unwrap().output, 0);
        assert_eq!(
            (
                t.get("noisy").unwrap().input,
                t.get("noisy").unwrap().output
            ),
            (100_000_000_000, 890_000_000_000)
        );
        assert!(t.get("sample_spec").is_none());
        assert_eq!(
            loaded.skipped.to_string(),
            "1 schema_example (e.g. sample_spec), 1 per_image (e.g. dall-e-3), \
             1 per_second (e.g. whisper-1), 1 per_character (e.g. tts-1), \
             1 no_output_price (e.g. odd), 1 no_price (e.g. nothing), \
             1 several_context_tiers (e.g. two-tiers), 1 tiered_pricing (e.g. ranges)"
        );
        assert!(loaded
            .summary("the configuration")
            .starts_with("prices from the configuration: 3 models loaded; 8 entries skipped"));
    }

    #[test]
    fn refuses_bad_numbers_naming_the_field() {
        for (json, field) in [
            (
                r#"{"m": {"input_cost_per_token": -1e-6, "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": "1e-6", "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e9}}"#,
                "prices.m.output_cost_per_token",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6, "cache_read_input_token_cost_above_200k_tokens": true}}"#,
                "prices.m.cache_read_input_token_cost_above_200k_tokens",
            ),
            (
                r#"{"m": {"input_cost_per_token": 1e-30, "output_cost_per_token": 1}}"#,
                "prices.m.input_cost_per_token",
            ),
        ] {
            assert_eq!(load(json).unwrap_err().field, field, "{json}");
        }
        assert!(load("[]").is_err());
        assert!(load(r#"{"m": 3}"#)
            .unwrap_err()
            .message
            .contains("prices.m"));
        assert!(load(r#"{"m": {}} x"#).is_err());
        assert!(load(r#"{"m": {"input_cost_per_token": 1e-6"#).is_err());
    }

    /// Reads `json` with IncrementalParse in steps of `budget` bytes.
    fn incremental(json: &str, budget: usize) -> Result<Loaded, ConfigError> {
        let mut p = IncrementalParse::new(json.as_bytes().to_vec(), "prices");
        for _ in 0..100_000 {
            if let Step::Done(r) = p.step(budget) {
                return r;
            }
        }
        panic!("never done");
    }

    #[test]
    fn incremental_reads_as_the_whole_parse() {
        let docs = [
            r#"{"a": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6, "s": "x,}{]\"\\", "n": [1, {"b": [2]}]},
               "sample_spec": {"input_cost_per_token": 0.0}, "c": {"mode": "chat"},
               "d": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6}}  "#,
            "{}",
            " { } ",
            "{\u{c}}",
            "{]",
            r#"{"m": {"a": [1}]}"#,
            "{}\u{c}",
            r#"{"m": {"input_cost_per_token": -1, "output_cost_per_token": 1}, "n": {}}"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1}, }"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1},, "n": {}}"#,
            r#"{"m": {"input_cost_per_token": 1e-6, "#,
            r#"{"m": {}} x"#,
            r#"[]"#,
            "",
            r#"{"m": "#,
            r#"{"m": {"a": "unterminated}}"#,
            // An alias before its target, one after, a chain, a loop.
            r#"{"x": {"alias_of": "t"}, "t": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
               "y": {"alias_of": "x"}, "l1": {"alias_of": "l2"}, "l2": {"alias_of": "l1"}}"#,
        ];
        for doc in docs {
            let whole = PriceTable::parse(doc.as_bytes(), "prices");
            for budget in [1, 7, 64, 1 << 20] {
                let part = incremental(doc, budget);
                match (&whole, &part) {
                    (Ok(w), Ok(p)) => {
                        assert_eq!(w.table, p.table, "{doc}");
                        assert_eq!(w.skipped, p.skipped, "{doc}");
                        assert_eq!(w.aliases, p.aliases, "{doc}");
                    }
                    (Err(w), Err(p)) => {
                        if w.field != "prices" {
                            assert_eq!(w.field, p.field, "{doc}");
                        }
                    }
                    _ => panic!("{doc} (budget {budget}): {whole:?} vs {part:?}"),
                }
            }
        }
        let deep = format!(r#"{{"m": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert!(PriceTable::parse(deep.as_bytes(), "prices").is_err());
        assert!(incremental(&deep, 64).is_err());
    }

    /// LiteLLM 1.110's `alias_of` entries (`"bedrock/claude-opus-latest": {"alias_of":
    /// "global.anthropic.claude-opus-5-5"}`): priced as their target, wherever it stands in the
    /// file, through chains; never through a loop, a missing or unpriced target, or a chain
    /// longer than MAX_ALIAS_HOPS; an entry's own price wins over its alias.
    #[test]
    fn aliases_are_priced_as_their_target() {
        let mut doc = String::from(
            r#"{"latest": {"alias_of": "model-5"},
                "model-5": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6, "mode": "chat"},
                "chained": {"alias_of": "latest"},
                "own": {"alias_of": "model-5", "input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "nowhere": {"alias_of": "no-such-model"},
                "image": {"output_cost_per_image": 0.04},
                "to-image": {"alias_of": "image"},
                "loop-a": {"alias_of": "loop-b"}, "loop-b": {"alias_of": "loop-a"},
                "self": {"alias_of": "self"},
                "number": {"alias_of": 5},"#,
        );
        // A chain of MAX_ALIAS_HOPS links ends on the price; one more does not.
        for i in 0..=MAX_ALIAS_HOPS {
            let next = if i == 0 {
                "model-5".to_string()
            } else {
                format!("hop{}", i - 1)
            };
            doc.push_str(&format!(r#""hop{i}": {{"alias_of": "{next}"}},"#));
        }
        doc.push_str(r#""end": {"alias_of": "model-5"}}"#);
        let loaded = PriceTable::parse(doc.as_bytes(), "prices").unwrap();
        let price = |m: &str| loaded.table.get(m).map(|p| (p.input, p.output));
        let target = price("model-5");
        assert!(target.is_some());
        for m in ["latest", "chained", "end", "hop0"] {
            assert_eq!(price(m), target, "{m}");
        }
        assert_eq!(price(&format!("hop{}", MAX_ALIAS_HOPS - 1)), target);
        assert_eq!(price(&format!("hop{MAX_ALIAS_HOPS}")), None);
        assert_ne!(price("own"), target);
        assert!(price("own").is_some());
        for m in ["nowhere", "to-image", "loop-a", "loop-b", "self"] {
            assert_eq!(price(m), None, "{m}");
        }
        // Through the lookup's own rules too: a provider prefix before the alias.
        assert_eq!(
            loaded.table.get("openai/latest").map(|p| p.input),
            target.map(|t| t.0)
        );
        let unpriced = loaded
            .skipped
            .reasons
            .iter()
            .find(|(r, _, _)| *r == SkipReason::AliasUnpriced)
            .map(|(_, n, _)| *n);
        // nowhere, to-image, loop-a, loop-b, self, hop<MAX>.
        assert_eq!(unpriced, Some(6));
        // latest, chained, end, hop0..hop<MAX-1>.
        assert_eq!(loaded.aliases, 3 + MAX_ALIAS_HOPS);
        let line = loaded.summary("the configuration");
        assert!(line.contains("6 alias_unpriced (e.g. "), "{line}");
        assert!(
            line.contains(&format!(
                "; {} of the models loaded are aliases (alias_of)",
                3 + MAX_ALIAS_HOPS
            )),
            "{line}"
        );
        // A non-string alias_of is no alias: no price.
        assert_eq!(price("number"), None);
        // A name given twice, once priced and once as an alias: its own price, in either order.
        for doc in [
            r#"{"t": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}, "x": {"alias_of": "t"}}"#,
            r#"{"t": {"input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
                "x": {"alias_of": "t"}, "x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}"#,
        ] {
            let loaded = PriceTable::parse(doc.as_bytes(), "prices").unwrap();
            let own = loaded.table.get("x").map(|p| p.input);
            assert_eq!(
                own,
                PriceTable::parse(
                    br#"{"x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}"#,
                    "prices"
                )
                .unwrap()
                .table
                .get("x")
                .map(|p| p.input),
                "{doc}"
            );
            assert_eq!(loaded.aliases, 0, "{doc}");
        }
    }

    #[test]
    fn context_tier_as_litellm() {
        let t = load(
            r#"{"claude-sonnet-4-5": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
                "cache_read_input_token_cost": 3e-07,
                "input_cost_per_token_above_200k_tokens": 6e-06,
                "output_cost_per_token_above_200k_tokens": 2.25e-05}}"#,
        )
        .unwrap()
        .table;
        let p = t.get("claude-sonnet-4-5").unwrap();
        let tier = p.tier.unwrap();
        assert_eq!(tier.above_input_tokens, 200_000);
        const U: u64 = 1_000_000;
        // At the threshold: base rates; above: the tier's, cache reads keep the base cache rate.
        assert_eq!(
            p.rates(200_000),
            [3 * U * U, 300_000 * U, 3 * U * U, 15 * U * U, 15 * U * U]
        );
        assert_eq!(
            p.rates(200_001),
            [
                6 * U * U,
                300_000 * U,
                6 * U * U,
                22_500_000 * U,
                22_500_000 * U
            ]
        );
    }

    #[test]
    fn lookup_rules() {
        let price = |input| ModelPrice {
            input,
            output: 1,
            ..ModelPrice::default()
        };
        let t = PriceTable::from_prices([
            ("gpt-4o-mini".to_string(), price(1)),
            ("gpt-4o-mini-2024-07-18".to_string(), price(2)),
            ("claude-sonnet-4-5".to_string(), price(3)),
            ("openai/special".to_string(), price(4)),
        ]);
        let input = |m: &str| t.get(m).map(|p| p.input);
        assert_eq!(input("gpt-4o-mini"), Some(1));
        assert_eq!(
            input("gpt-4o-mini-2024-07-18"),
            Some(2),
            "an exact key wins"
        );
        assert_eq!(input("gpt-4o-mini-2025-01-31"), Some(1), "dated snapshot");
        assert_eq!(input("openai/gpt-4o-mini"), Some(1));
        assert_eq!(input("openai/gpt-4o-mini-2024-07-18"), Some(2));
        assert_eq!(input("openai/gpt-4o-mini-2099-12-31"), Some(1));
        assert_eq!(input("claude-sonnet-4-5-20250929"), Some(3));
        assert_eq!(input("anthropic/claude-sonnet-4-5-20250929"), Some(3));
        assert_eq!(input("openai/special"), Some(4));
        for unknown in [
            "gpt-4o",
            "gpt-4o-mini-fast",
            "gpt-4o-mini-2024-07",
            "gpt-4o-mini-0718",
            "gpt-4o-mini-30240718",
            "azure/gpt-4o-mini",
            "openai/anthropic/claude-sonnet-4-5",
            "",
            "-20250929",
        ] {
            assert_eq!(input(unknown), None, "{unknown}");
        }
    }
}
