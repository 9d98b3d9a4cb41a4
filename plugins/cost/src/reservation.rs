//! Reservations: a request of a tenant with a budget holds an estimate of its cost against the
//! budget from the end of its request body until its booking, so that concurrent requests see
//! each other before any of them is priced (README, "Reservations").
//!
//! # The estimate ([`estimate_nano`], [`output_tokens`])
//!
//! An upper bound of what the request can be charged, from what is known before the upstream:
//! - input tokens ≤ the request body's bytes: byte-level BPE tokenizers (OpenAI's `tiktoken`
//!   encodings `cl100k_base` and `o200k_base`, GPT-2's, Llama 3's) start from one token per byte
//!   and only merge, so a text never has more tokens than UTF-8 bytes, and its JSON form is
//!   never shorter. An image or audio part breaks this: a part given by URL is a few dozen
//!   bytes and hundreds of tokens (OpenAI's vision guide: 85 tokens plus 170 per 512-pixel
//!   tile). Such requests are not told apart; what they cost beyond the estimate is the error
//!   term of the bound (README);
//! - output tokens: what the body declares (`max_tokens`, `max_completion_tokens`,
//!   `max_output_tokens`: the largest given, `crate::request`), at most the model's own
//!   `max_output_tokens` from the price table (LiteLLM's entry, else its `max_tokens`); with
//!   none declared, the model's `max_output_tokens`; with neither,
//!   `reservation.default_max_output_tokens` (4096);
//! - priced at the highest per-token rate the model has for each side: input at the largest of
//!   the input, cache-read and cache-creation rates, output at the larger of the output and
//!   reasoning rates, each the larger of the base rate and the context tier's when the input
//!   estimate is above the tier's threshold; rounded up to the nano-USD, saturating at
//!   `u64::MAX` (never wrapping: a hostile `max_tokens` of 2^64 reserves everything).
//!
//! # The reservation ([`reserve`])
//!
//! One CAS write on the tenant's own ledger record (`crate::ledger`): read spend and reserved,
//! refuse when spend + reserved ≥ budget for the day or the month ([`crate::ledger::Budget::check`],
//! the same rule as at the request headers), else add the estimate to `reserved` in the same
//! write. Every worker's reservations of a tenant serialize on that record, so of N requests
//! racing on a budget with one request's worth left, the first reserves and the others see it.
//! A tenant without a record of its own (pooled in the overflow record) is not reserved for.
//!
//! Settlement is the booking's write (`crate::ledger::Ledger::book`): the estimate removed and
//! the charge added in one CAS; a request that ends without a charge (upstream error, client
//! gone, refused later) books nothing and releases its estimate the same way. The estimate is
//! removed only while the record is still in the day the reservation was made in: a day's
//! reservations expire with it, so a reservation never settled (a worker killed mid-request)
//! holds the budget until the next UTC midnight at the latest.

use serde::Deserialize;
use tollgate_common::arith::mul_wide;
use tollgate_common::config::ConfigError;
use tollgate_common::shared_data::{SharedStore, StoreError};

use crate::ledger::{BookStats, Budget, Exceeded, Hold, Ledger, NotBooked, Spend};
use crate::period::Periods;
use crate::price::{ModelPrice, ATTO_PER_NANO};

/// Default `reservation.default_max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4096;
/// Largest `reservation.default_max_output_tokens` (10^9 tokens).
pub const MAX_DEFAULT_MAX_OUTPUT_TOKENS: u64 = 1_000_000_000;

/// The `reservation` configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationConfig {
    /// Output tokens reserved for a request that declares no bound, of a model whose price
    /// entry has none (tokens, 1 to 10^9).
    #[serde(default = "default_max_output_tokens")]
    pub default_max_output_tokens: u64,
}

fn default_max_output_tokens() -> u64 {
    DEFAULT_MAX_OUTPUT_TOKENS
}

impl Default for ReservationConfig {
    fn default() -> Self {
        ReservationConfig {
            default_max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
        }
    }
}

impl ReservationConfig {
    /// The configuration, validated.
    ///
    /// # Errors
    /// `reservation.default_max_output_tokens` outside 1..=10^9.
    pub fn checked(self) -> Result<Self, ConfigError> {
        if !(1..=MAX_DEFAULT_MAX_OUTPUT_TOKENS).contains(&self.default_max_output_tokens) {
            return Err(ConfigError::new(
                "reservation.default_max_output_tokens",
                format!("must be from 1 to {MAX_DEFAULT_MAX_OUTPUT_TOKENS} tokens"),
            ));
        }
        Ok(self)
    }
}

/// The output tokens a request is reserved for: `declared` (the body's bound) capped by
/// `model_max` (the price entry's `max_output_tokens`); without a declared bound, `model_max`;
/// without either, `default_max`.
pub fn output_tokens(declared: Option<u64>, model_max: Option<u64>, default_max: u64) -> u64 {
    match (declared, model_max) {
        (Some(d), Some(m)) => d.min(m),
        (Some(d), None) => d,
        (None, Some(m)) => m,
        (None, None) => default_max,
    }
}

/// The reservation of a request: `input_tokens` (its body's bytes) and `output_tokens` at the
/// model's highest rates (see the module docs), in nano-USD rounded up, saturating at
/// `u64::MAX`.
pub fn estimate_nano(price: &ModelPrice, input_tokens: u64, output_tokens: u64) -> u64 {
    let base = price.rates(0);
    let tiered = price.rates(input_tokens);
    let highest = |slots: &[usize]| {
        slots
            .iter()
            .filter_map(|&i| Some(base.get(i)?.max(tiered.get(i)?)))
            .copied()
            .max()
            .unwrap_or(0)
    };
    let input_rate = highest(&[0, 1, 2]);
    let output_rate = highest(&[3, 4]);
    // Each product of two u64 fits a u128; only the sum can overflow.
    let atto =
        mul_wide(input_tokens, input_rate).saturating_add(mul_wide(output_tokens, output_rate));
    let nano = atto.div_ceil(ATTO_PER_NANO);
    u64::try_from(nano).unwrap_or(u64::MAX)
}

/// What [`reserve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Admitted, the estimate held (what was added: less than asked only at `u64::MAX`).
    Held(Hold),
    /// Refused: spend + reserved had reached this budget.
    Refused(Exceeded),
    /// The tenant has no record of its own (pooled in the overflow record, or not created):
    /// nothing reserved, the request-headers check stands.
    NoRecord,
}

/// Reserves `nano` nano-USD for a request of the tenant at `key` whose budget is `budget`, at
/// Unix time `now_ms`: one read and one CAS write (more on a CAS mismatch, at most
/// `cas_retries + 1` writes). `known`: the record and CAS token read earlier on this request
/// (`crate::ledger::Lookup::record`), which the first attempt starts from instead of a read (one
/// CAS write and no read when no other request wrote the record since); `None`: read first.
///
/// # Errors
/// [`NotBooked`] when the store failed (its status; a record of an unknown layout is
/// `InternalFailure`) or the CAS attempts ran out: the request is then refused like one whose
/// spend cannot be read.
pub fn reserve<S: SharedStore + ?Sized>(
    ledger: &Ledger,
    store: &S,
    key: &str,
    now_ms: u64,
    budget: &Budget,
    nano: u64,
    mut known: Option<(Vec<u8>, u32)>,
) -> Result<Reservation, NotBooked> {
    let now = Periods::at(now_ms / 1_000);
    let attempts = ledger.cas_retries.saturating_add(1);
    let mut stats = BookStats::default();
    let failed = |stats, status| NotBooked {
        stats,
        failed: Some(status),
    };
    for _ in 0..attempts {
        let read = match known.take() {
            Some((value, cas)) => Ok((Some(value), Some(cas))),
            None => store.get(key),
        };
        let (value, cas) = match read {
            Ok(read) => read,
            Err(StoreError::Failed(status)) => return Err(failed(stats, status)),
            Err(StoreError::CasMismatch) => {
                stats.cas_retries = stats.cas_retries.saturating_add(1);
                continue;
            }
        };
        let (Some(value), Some(cas)) = (value, cas) else {
            return Ok(Reservation::NoRecord);
        };
        let Some(stored) = Spend::decode(&value) else {
            return Err(failed(
                stats,
                tollgate_common::shared_data::status::INTERNAL_FAILURE,
            ));
        };
        let spend = stored.rolled(&now);
        if let Some(exceeded) = budget.check(&spend, &now) {
            return Ok(Reservation::Refused(exceeded));
        }
        let reserved = spend.reserved.saturating_add(nano);
        let next = Spend { reserved, ..spend };
        match store.set(key, &next.encode(), Some(cas)) {
            Ok(()) => {
                return Ok(Reservation::Held(Hold {
                    day_id: now.day,
                    nano: reserved.saturating_sub(spend.reserved),
                }))
            }
            Err(StoreError::Failed(status)) => return Err(failed(stats, status)),
            Err(StoreError::CasMismatch) => {
                stats.cas_retries = stats.cas_retries.saturating_add(1);
            }
        }
    }
    Err(NotBooked {
        stats,
        failed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::price::{parse_usd_per_token, ContextTier};
    use crate::request::RequestBody;
    use crate::unreadable::Unreadable;
    use tollgate_common::shared_data::{MemoryStore, Semantics};

    /// gpt-4o-mini in LiteLLM's file: 1.5e-07 / 6e-07 USD per token, cache reads 7.5e-08.
    fn mini() -> ModelPrice {
        ModelPrice {
            input: parse_usd_per_token("1.5e-07").unwrap(),
            output: parse_usd_per_token("6e-07").unwrap(),
            cache_read: Some(parse_usd_per_token("7.5e-08").unwrap()),
            max_output_tokens: Some(16_384),
            ..ModelPrice::default()
        }
    }

    fn declared(body: &str) -> Result<Option<u64>, Unreadable> {
        RequestBody::parse(body.as_bytes()).map(|b| b.max_output_tokens())
    }

    #[test]
    fn the_output_bound_is_the_declared_one_capped_by_the_models() {
        assert_eq!(output_tokens(Some(100), Some(16_384), 4096), 100);
        assert_eq!(output_tokens(Some(1 << 40), Some(16_384), 4096), 16_384);
        assert_eq!(output_tokens(None, Some(16_384), 4096), 16_384);
        assert_eq!(output_tokens(None, None, 4096), 4096);
        assert_eq!(output_tokens(Some(9_000), None, 4096), 9_000);
        assert_eq!(output_tokens(Some(0), Some(16_384), 4096), 0);
    }

    #[test]
    fn the_body_declares_its_bound_with_any_of_the_apis_names() {
        let chat = r#"{"model":"m","max_tokens":50}"#;
        assert_eq!(declared(chat), Ok(Some(50)));
        let both = r#"{"model":"m","max_completion_tokens":70,"max_tokens":50}"#;
        assert_eq!(declared(both), Ok(Some(70)), "the largest given");
        let responses = r#"{"model":"m","max_output_tokens":30}"#;
        assert_eq!(declared(responses), Ok(Some(30)));
        assert_eq!(declared(r#"{"model":"m","max_tokens":null}"#), Ok(None));
        assert_eq!(declared(r#"{"model":"m"}"#), Ok(None));
    }

    #[test]
    fn hostile_bounds_saturate_or_make_the_body_unreadable() {
        // 2^64 and beyond: as large as can be, then capped by the model's own bound.
        let huge = declared(r#"{"model":"m","max_tokens":18446744073709551616}"#);
        assert_eq!(huge, Ok(Some(u64::MAX)));
        let huge = declared(&format!(r#"{{"max_tokens":{}}}"#, "9".repeat(400)));
        assert_eq!(huge, Ok(Some(u64::MAX)));
        assert_eq!(output_tokens(Some(u64::MAX), Some(16_384), 4096), 16_384);
        // Not an integer ≥ 0: what an API refuses and a lax reader may take otherwise.
        for bad in [
            r#"-1"#, r#""100""#, r#"1.5"#, r#"1e3"#, r#"true"#, r#"[1]"#, r#"{}"#,
        ] {
            let body = format!(r#"{{"model":"m","max_tokens":{bad}}}"#);
            assert_eq!(declared(&body), Err(Unreadable::MemberType), "{bad}");
        }
        // Twice, or under another spelling: readers would disagree on it.
        let twice = r#"{"model":"m","max_tokens":1,"max_tokens":100000}"#;
        assert_eq!(declared(twice), Err(Unreadable::AmbiguousName));
        let spelled = r#"{"model":"m","Max_Tokens":100000}"#;
        assert_eq!(declared(spelled), Err(Unreadable::AmbiguousName));
    }

    #[test]
    fn the_estimate_prices_every_byte_and_the_bound_at_the_highest_rates() {
        let p = mini();
        // 42 bytes at 150 nano-USD and 10 tokens at 600: the e2e test's figure.
        assert_eq!(estimate_nano(&p, 42, 10), 12_300);
        // Rounded up: one byte at 1.5e-10 USD is 0.15 nano-USD.
        let tiny = ModelPrice {
            input: 150_000_000,
            output: 0,
            ..ModelPrice::default()
        };
        assert_eq!(estimate_nano(&tiny, 1, 1), 1);
        assert_eq!(estimate_nano(&tiny, 0, 0), 0);
        // Reasoning priced above output, cache creation above input: the higher rates.
        let r = ModelPrice {
            input: 1_000_000_000,
            output: 2_000_000_000,
            cache_creation: Some(3_000_000_000),
            reasoning: Some(5_000_000_000),
            ..ModelPrice::default()
        };
        assert_eq!(estimate_nano(&r, 10, 10), 10 * 3 + 10 * 5);
        // A context tier applies once the input estimate is above its threshold.
        let tiered = ModelPrice {
            tier: Some(ContextTier {
                above_input_tokens: 100,
                input: Some(4_000_000_000),
                output: Some(1_000_000_000),
                ..ContextTier::default()
            }),
            ..r
        };
        assert_eq!(estimate_nano(&tiered, 100, 10), 100 * 3 + 10 * 5);
        assert_eq!(estimate_nano(&tiered, 101, 10), 101 * 4 + 10 * 5);
        // Overflow saturates, never wraps.
        let dear = ModelPrice {
            input: u64::MAX,
            output: u64::MAX,
            ..ModelPrice::default()
        };
        assert_eq!(estimate_nano(&dear, u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(estimate_nano(&p, u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn the_models_bound_comes_from_its_litellm_entry() {
        use crate::price_table::PriceTable;
        // Entries shaped as in LiteLLM's model_prices_and_context_window.json.
        let json = r#"{
            "gpt-4o-mini": {"max_tokens": 16384, "max_input_tokens": 128000,
                            "max_output_tokens": 16384, "input_cost_per_token": 1.5e-07,
                            "output_cost_per_token": 6e-07},
            "old": {"max_tokens": 4097, "input_cost_per_token": 1.5e-06,
                    "output_cost_per_token": 2e-06},
            "newer": {"max_tokens": 8192, "max_output_tokens": 64000,
                      "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06},
            "odd": {"max_output_tokens": "lots", "max_tokens": -1,
                    "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06},
            "alias": {"alias_of": "newer"}
        }"#;
        let table = PriceTable::parse(json.as_bytes(), "prices").unwrap().table;
        let bound = |m: &str| table.get(m).unwrap().max_output_tokens;
        assert_eq!(bound("gpt-4o-mini"), Some(16_384));
        assert_eq!(bound("old"), Some(4_097), "max_tokens when alone");
        assert_eq!(bound("newer"), Some(64_000), "max_output_tokens first");
        assert_eq!(bound("odd"), None, "ignored, never refused");
        assert_eq!(bound("alias"), Some(64_000));
    }

    #[test]
    fn the_default_bound_is_configurable_and_checked() {
        assert_eq!(
            ReservationConfig::default().default_max_output_tokens,
            DEFAULT_MAX_OUTPUT_TOKENS
        );
        for bad in [0, MAX_DEFAULT_MAX_OUTPUT_TOKENS + 1] {
            let e = ReservationConfig {
                default_max_output_tokens: bad,
            }
            .checked()
            .unwrap_err();
            assert!(
                e.to_string()
                    .contains("reservation.default_max_output_tokens"),
                "{e}"
            );
        }
    }

    /// 2025-01-31T23:00:00Z.
    const T0: u64 = 1_738_364_400_000;

    fn ledger(store: &MemoryStore, tenant: &str) -> (Ledger, String) {
        let l = Ledger::new("t", 8, 10);
        l.ensure(store, [tenant].into_iter(), 0).unwrap();
        let key = l.key(tenant);
        (l, key)
    }

    /// A budget of `day` nano-USD a day and none for the month.
    fn day_budget(day: u64) -> Budget {
        Budget {
            day: Some(day),
            month: None,
        }
    }

    fn read(store: &MemoryStore, l: &Ledger, key: &str, now_ms: u64) -> Spend {
        l.spend(store, key, &Periods::at(now_ms / 1_000))
            .unwrap()
            .spend
    }

    #[test]
    fn a_reservation_holds_the_budget_until_its_booking_replaces_it() {
        for sem in [Semantics::Envoy, Semantics::NgxWasm] {
            let store = MemoryStore::new(sem);
            let (l, key) = ledger(&store, "a");
            let budget = day_budget(100);
            // 60 left of 100 after a first booking of 40.
            l.book(&store, &key, T0, 40, None).unwrap();
            let first = reserve(&l, &store, &key, T0, &budget, 70, None).unwrap();
            let Reservation::Held(hold) = first else {
                panic!("{first:?}")
            };
            assert_eq!(hold.nano, 70);
            // The second request sees the first's reservation: 40 + 70 ≥ 100.
            let second = reserve(&l, &store, &key, T0, &budget, 1, None).unwrap();
            assert!(matches!(second, Reservation::Refused(e) if e.period == "day"));
            // The header check sees it too.
            let now = Periods::at(T0 / 1_000);
            assert!(budget.check(&read(&store, &l, &key, T0), &now).is_some());
            // Booked 50: the reservation replaced by the charge.
            l.book(&store, &key, T0, 50, Some(hold)).unwrap();
            let s = read(&store, &l, &key, T0);
            assert_eq!((s.day, s.reserved, s.total), (90, 0, 90), "{sem:?}");
            // Released without a charge: nothing booked, nothing held.
            let Reservation::Held(h) = reserve(&l, &store, &key, T0, &budget, 5, None).unwrap()
            else {
                panic!()
            };
            assert_eq!(read(&store, &l, &key, T0).reserved, 5);
            l.book(&store, &key, T0, 0, Some(h)).unwrap();
            let s = read(&store, &l, &key, T0);
            assert_eq!((s.day, s.reserved), (90, 0));
        }
    }

    /// The reservation starts from the record read at the request headers: no read when
    /// nothing wrote it since; a write in between fails the CAS, and the next attempt reads it
    /// (that write is kept).
    #[test]
    fn a_reservation_starts_from_the_record_read_at_the_headers() {
        let store = MemoryStore::new(Semantics::Envoy);
        let (l, key) = ledger(&store, "a");
        let budget = day_budget(1_000);
        let now = Periods::at(T0 / 1_000);
        let lookup = l.spend(&store, &key, &now).unwrap();
        let known = lookup.record.clone();
        assert!(known.is_some(), "the tenant's own record and its CAS token");
        let before = store.ops();
        let held = reserve(&l, &store, &key, T0, &budget, 100, known).unwrap();
        assert!(matches!(held, Reservation::Held(_)), "{held:?}");
        let after = store.ops();
        assert_eq!(
            (after.reads - before.reads, after.writes - before.writes),
            (0, 1)
        );
        assert_eq!(read(&store, &l, &key, T0).reserved, 100);

        // Another request books 50 between this request's read and its reservation.
        let stale = l.spend(&store, &key, &now).unwrap().record;
        l.book(&store, &key, T0, 50, None).unwrap();
        let before = store.ops();
        let held = reserve(&l, &store, &key, T0, &budget, 200, stale).unwrap();
        assert!(matches!(held, Reservation::Held(_)), "{held:?}");
        let after = store.ops();
        assert_eq!(
            after.mismatches - before.mismatches,
            1,
            "the stale token is refused"
        );
        assert_eq!(
            after.reads - before.reads,
            1,
            "then the record is read again"
        );
        let s = read(&store, &l, &key, T0);
        assert_eq!(
            (s.day, s.reserved),
            (50, 300),
            "the booking in between is kept"
        );

        // A stale read lets no request past the budget: read at 50 spent + 300 reserved, then
        // another request reserves 700 (1,050 in all): this one is refused.
        let stale = l.spend(&store, &key, &now).unwrap().record;
        assert!(matches!(
            reserve(&l, &store, &key, T0, &budget, 700, None).unwrap(),
            Reservation::Held(_)
        ));
        assert!(matches!(
            reserve(&l, &store, &key, T0, &budget, 1, stale).unwrap(),
            Reservation::Refused(_)
        ));
    }

    #[test]
    fn a_day_that_ends_takes_its_reservations_and_never_the_next_days() {
        let store = MemoryStore::new(Semantics::Envoy);
        let (l, key) = ledger(&store, "a");
        let budget = Budget {
            day: Some(1_000),
            month: Some(1_000_000),
        };
        let Reservation::Held(old) = reserve(&l, &store, &key, T0, &budget, 600, None).unwrap()
        else {
            panic!()
        };
        // Two hours later, a new day (and month): yesterday's 600 no longer holds anything.
        let t1 = T0 + 2 * 3_600_000;
        assert_eq!(read(&store, &l, &key, t1).reserved, 0);
        let Reservation::Held(new) = reserve(&l, &store, &key, t1, &budget, 300, None).unwrap()
        else {
            panic!()
        };
        // Yesterday's request settles now: its charge goes to today, its hold is not taken off
        // today's reservations.
        l.book(&store, &key, t1, 20, Some(old)).unwrap();
        let s = read(&store, &l, &key, t1);
        assert_eq!((s.day, s.reserved, s.total), (20, 300, 20));
        l.book(&store, &key, t1, 0, Some(new)).unwrap();
        assert_eq!(read(&store, &l, &key, t1).reserved, 0);
    }

    #[test]
    fn reservations_saturate_and_release_what_they_added() {
        let store = MemoryStore::new(Semantics::Envoy);
        let (l, key) = ledger(&store, "a");
        let budget = day_budget(u64::MAX);
        let Reservation::Held(a) =
            reserve(&l, &store, &key, T0, &budget, u64::MAX - 10, None).unwrap()
        else {
            panic!()
        };
        // Only 10 more fit in the counter: that is what the hold says it added.
        let Reservation::Held(b) = reserve(&l, &store, &key, T0, &budget, 100, None).unwrap()
        else {
            panic!()
        };
        assert_eq!(b.nano, 10);
        // spend + reserved = u64::MAX reaches any budget.
        assert!(matches!(
            reserve(&l, &store, &key, T0, &budget, 1, None).unwrap(),
            Reservation::Refused(_)
        ));
        // Released, each takes off what it added: nothing is left held, nothing more.
        l.book(&store, &key, T0, 0, Some(b)).unwrap();
        assert_eq!(read(&store, &l, &key, T0).reserved, u64::MAX - 10);
        l.book(&store, &key, T0, 0, Some(a)).unwrap();
        assert_eq!(read(&store, &l, &key, T0).reserved, 0);
    }

    #[test]
    fn no_record_no_reservation_and_unknown_layouts_are_errors() {
        let store = MemoryStore::new(Semantics::Envoy);
        let (l, key) = ledger(&store, "a");
        let budget = day_budget(10);
        let missing = reserve(&l, &store, &l.key("pooled"), T0, &budget, 1, None).unwrap();
        assert_eq!(missing, Reservation::NoRecord);
        // A version-1 record (before reservations) is read and upgraded.
        let (_, cas) = store.get(&key).unwrap();
        let v1 = Spend {
            day_id: 20250131,
            day: 4,
            month_id: 202501,
            month: 4,
            total: 4,
            reserved: 0,
        }
        .encode();
        let mut v1 = v1[..33].to_vec();
        v1[0] = 1;
        store.set(&key, &v1, cas).unwrap();
        assert!(matches!(
            reserve(&l, &store, &key, T0, &budget, 3, None).unwrap(),
            Reservation::Held(_)
        ));
        let s = read(&store, &l, &key, T0);
        assert_eq!((s.day, s.reserved), (4, 3));
        // A later layout: refused, never read as 0.
        let (_, cas) = store.get(&key).unwrap();
        store.set(&key, &[3u8; 49], cas).unwrap();
        let e = reserve(&l, &store, &key, T0, &budget, 1, None).unwrap_err();
        assert!(e.failed.is_some());
        assert!(l.spend(&store, &key, &Periods::at(T0 / 1_000)).is_err());
        assert!(l.book(&store, &key, T0, 1, None).is_err());
        assert_eq!(
            store.get(&key).unwrap().0.unwrap(),
            vec![3u8; 49],
            "left as it is"
        );
    }

    #[test]
    fn concurrent_workers_admit_while_spend_plus_reserved_is_under_the_budget() {
        use std::sync::Arc;
        // 4 workers × 50 requests racing for a budget with 1,000 left; each reserves 300 and
        // costs 250: at most 4 admitted (0, 300, 600, 900 reserved before each), whatever the
        // interleaving; without reservations all 200 would be.
        let store = Arc::new(MemoryStore::new(Semantics::Envoy));
        let (l, key) = ledger(&store, "a");
        let budget = day_budget(1_000);
        let holds: Vec<_> = (0..4)
            .map(|_| {
                let (store, l, key) = (Arc::clone(&store), l.clone(), key.clone());
                std::thread::spawn(move || {
                    (0..50)
                        .filter_map(
                            |_| match reserve(&l, &*store, &key, T0, &budget, 300, None) {
                                Ok(Reservation::Held(h)) => Some(h),
                                Ok(_) => None,
                                Err(e) => panic!("{e:?}"),
                            },
                        )
                        .collect::<Vec<_>>()
                })
            })
            .flat_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(holds.len(), 4);
        for h in holds {
            l.book(&*store, &key, T0, 250, Some(h)).unwrap();
        }
        let s = read(&store, &l, &key, T0);
        assert_eq!((s.day, s.reserved), (1_000, 0));
    }
}
