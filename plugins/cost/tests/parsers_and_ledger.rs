//! SSE split at every byte, price exactness against a rational reference, LiteLLM entries,
//! configuration refusals, and the ledger under interleaved workers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::Arc;

use tollgate_common::credential::CredentialError;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::shared_data::{MemoryStore, Read, Semantics, SharedStore, StoreError};
use tollgate_cost::config::Config;
use tollgate_cost::ledger::Ledger;
use tollgate_cost::period::Periods;
use tollgate_cost::price::{cost_atto, cost_nano, ModelPrice};
use tollgate_cost::sse::StreamState;
use tollgate_cost::usage::Usage;

const OPENAI: &[u8] = include_bytes!("../testdata/openai_chat_stream.sse");
const ANTHROPIC: &[u8] = include_bytes!("../testdata/anthropic_messages_stream.sse");

fn variants(stream: &[u8]) -> Vec<Vec<u8>> {
    let s = String::from_utf8(stream.to_vec()).unwrap();
    vec![
        s.clone().into_bytes(),
        s.replace('\n', "\r\n").into_bytes(),
        s.replace('\n', "\r").into_bytes(),
    ]
}

fn run(chunks: &[&[u8]]) -> Option<Usage> {
    let mut st = StreamState::new(4096);
    for c in chunks {
        st.feed(c);
    }
    st.finish(Some("request-model"))
}

#[test]
fn sse_every_split_point_gives_the_same_usage() {
    let openai = Usage {
        model: Some("gpt-4o-mini".into()),
        input_tokens: 19,
        output_tokens: 10,
        cached_input_tokens: 4,
        cache_creation_input_tokens: 0,
        reasoning_tokens: 2,
    };
    let anthropic = Usage {
        model: Some("claude-sonnet-4".into()),
        input_tokens: 33,
        output_tokens: 15,
        cached_input_tokens: 5,
        cache_creation_input_tokens: 3,
        reasoning_tokens: 0,
    };
    for (stream, want) in [(OPENAI, openai), (ANTHROPIC, anthropic)] {
        for v in variants(stream) {
            assert_eq!(run(&[&v]), Some(want.clone()));
            for i in 0..=v.len() {
                let (a, b) = v.split_at(i);
                assert_eq!(run(&[a, b]), Some(want.clone()), "split at {i}");
            }
            // Every byte on its own.
            let bytes: Vec<&[u8]> = v.chunks(1).collect();
            assert_eq!(run(&bytes), Some(want.clone()));
            // Truncated anywhere before the final usage: never priced with partial counts.
            let usage_at = v.windows(8).rposition(|w| w == b"\"usage\":").unwrap();
            for cut in (0..usage_at).step_by(7) {
                assert_eq!(run(&[&v[..cut]]), None, "cut at {cut}");
            }
        }
    }
}

#[test]
fn sse_bad_payloads_are_unpriced() {
    let malformed = String::from_utf8(OPENAI.to_vec())
        .unwrap()
        .replace("\"choices\":[],", "\"choices\":[]");
    assert_eq!(run(&[malformed.as_bytes()]), None);
    // A usage object over the bound on captured members: unpriced, never guessed.
    let mut st = StreamState::new(16);
    st.feed(OPENAI);
    assert!(st.usage.poisoned());
    assert_eq!(st.finish(None), None);
}

#[test]
fn one_million_additions_match_a_rational_reference() {
    // 1.23456789e-10 and 3.3333e-10 USD/token: costs with fractional nano-USD.
    let price = ModelPrice {
        input: 123_456_789,
        output: 333_330_000,
        ..ModelPrice::default()
    };
    let mut total_nano: u64 = 0;
    let mut exact_atto: u128 = 0;
    let mut rounded_ref: u128 = 0;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..1_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let usage = Usage {
            input_tokens: x % 100_000,
            output_tokens: (x >> 20) % 10_000,
            ..Usage::default()
        };
        let atto = cost_atto(&usage, &price).unwrap();
        exact_atto += atto;
        // Reference: numerator/denominator with denominator 10^9, rounded half up.
        rounded_ref += (2 * atto + 1_000_000_000) / 2_000_000_000;
        total_nano += cost_nano(&usage, &price).unwrap();
    }
    assert_eq!(u128::from(total_nano), rounded_ref);
    // Rounding each request moves the total by at most half a nano-USD per request.
    let diff = (u128::from(total_nano) * 1_000_000_000).abs_diff(exact_atto);
    assert!(diff <= 500_000_000 * 1_000_000);
    // A float accumulator drifts: the integer one cannot.
    let f: f64 = (0..1_000_000).map(|_| 1.5e-7_f64).sum();
    assert_ne!(f, 0.15);
}

#[test]
fn litellm_entries_load_verbatim_and_bad_prices_are_refused_by_name() {
    let config = br#"{
      "prices": {
        "gpt-4o-mini": {"max_tokens": 16384, "max_input_tokens": 128000, "max_output_tokens": 16384,
          "input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "input_cost_per_token_batches": 7.5e-08,
          "output_cost_per_token_batches": 3e-07, "cache_read_input_token_cost": 7.5e-08, "litellm_provider": "openai",
          "mode": "chat", "supports_function_calling": true, "supports_parallel_function_calling": true,
          "supports_response_schema": true, "supports_vision": true, "supports_prompt_caching": true,
          "supports_system_messages": true, "supports_tool_choice": true},
        "claude-3-5-sonnet-20241022": {"max_tokens": 8192, "max_input_tokens": 200000, "max_output_tokens": 8192,
          "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "cache_creation_input_token_cost": 3.75e-06,
          "cache_read_input_token_cost": 3e-07, "litellm_provider": "anthropic", "mode": "chat", "tool_use_system_prompt_tokens": 159}
      },
      "tenant": {"header": "x-jwt-sub"}
    }"#;
    let c = Config::parse(config).unwrap();
    let p = *c.prices.get("gpt-4o-mini").unwrap();
    assert_eq!(
        (p.input, p.output, p.cache_read),
        (150_000_000_000, 600_000_000_000, Some(75_000_000_000))
    );
    assert_eq!(
        c.prices
            .get("claude-3-5-sonnet-20241022")
            .unwrap()
            .cache_creation,
        Some(3_750_000_000_000)
    );
    assert_eq!(c.over_budget_status, 402);

    let refuse = |json: &str, field: &str| {
        let e = Config::parse(json.as_bytes()).unwrap_err();
        assert_eq!(e.field, field, "{json}: {e}");
    };
    let t = r#""tenant":{"header":"x-jwt-sub"}"#;
    refuse(
        &format!(
            r#"{{"prices":{{"m":{{"input_cost_per_token":-1e-7,"output_cost_per_token":0}}}},{t}}}"#
        ),
        "prices.m.input_cost_per_token",
    );
    refuse(
        &format!(
            r#"{{"prices":{{"m":{{"input_cost_per_token":1e-19,"output_cost_per_token":0}}}},{t}}}"#
        ),
        "prices.m.input_cost_per_token",
    );
    refuse(
        &format!(
            r#"{{"prices":{{"m":{{"input_cost_per_token":"1e-7","output_cost_per_token":0}}}},{t}}}"#
        ),
        "prices.m.input_cost_per_token",
    );
    // An entry without an output price is skipped (LiteLLM's file has such entries), not
    // refused; the summary says so.
    let skipped = Config::parse(
        format!(r#"{{"prices":{{"m":{{"input_cost_per_token":1e-7}}}},{t}}}"#).as_bytes(),
    )
    .unwrap();
    assert!(skipped.prices.get("m").is_none());
    assert!(
        skipped.prices_loaded.contains("1 no_output_price (e.g. m)"),
        "{}",
        skipped.prices_loaded
    );
    refuse(&format!("{{{t}}}"), "prices");
    refuse(
        &format!(r#"{{"prices":{{}},{t},"over_budget_status":403}}"#),
        "over_budget_status",
    );
    refuse(
        &format!(r#"{{"prices":{{}},{t},"budgets":{{"default":{{"day_usd":1}}}}}}"#),
        "budgets.default.day_usd",
    );
    refuse(
        r#"{"prices":{},"tenant":{"header":"bad header"}}"#,
        "tenant.header",
    );
    refuse(r#"{"prices":{}}"#, "tenant");
    refuse(
        r#"{"prices":{},"tenant":{"header":"a","api_key_header":"b"}}"#,
        "tenant",
    );
    refuse(
        r#"{"prices":{},"tenant":{"header":"a","unverified_header":"b"}}"#,
        "tenant",
    );
    refuse(&format!(r#"{{"prices":{{}},{t},"typo":1}}"#), "typo");
    refuse(
        &format!(r#"{{"prices":{{}},{t},"store_full":{{"action":"allow"}}}}"#),
        "store_full.action",
    );
    refuse(
        &format!(r#"{{"prices":{{}},{t},"store_full":{{"status":200}}}}"#),
        "store_full.status",
    );
    refuse(
        &format!(r#"{{"prices":{{}},{t},"error_format":"azure"}}"#),
        "error_format",
    );
    let c = Config::parse(format!(r#"{{"prices":{{}},{t}}}"#).as_bytes()).unwrap();
    assert_eq!(
        (c.store_full.action, c.store_full.status),
        (tollgate_cost::config::StoreFullAction::Refuse, 503)
    );
    assert_eq!(c.error_format, ErrorFormat::Auto);
    let c = Config::parse(format!(r#"{{"prices":{{}},{t},"error_format":"openai"}}"#).as_bytes())
        .unwrap();
    assert_eq!(c.error_format, ErrorFormat::OpenAi);
    // unpriced_calls: refuse unless allow is said (the fail-open choice).
    use tollgate_cost::unpriced_calls::UnpricedCalls;
    let c = Config::parse(format!(r#"{{"prices":{{}},{t}}}"#).as_bytes()).unwrap();
    assert_eq!(c.unpriced_calls, UnpricedCalls::Refuse);
    let c = Config::parse(format!(r#"{{"prices":{{}},{t},"unpriced_calls":"allow"}}"#).as_bytes())
        .unwrap();
    assert_eq!(c.unpriced_calls, UnpricedCalls::Allow);
    for bad in [r#""Allow""#, r#""pass""#, "true", "null"] {
        refuse(
            &format!(r#"{{"prices":{{}},{t},"unpriced_calls":{bad}}}"#),
            "unpriced_calls",
        );
    }
}

/// A request's headers and properties, for the tenant sources.
struct Request(&'static [(&'static str, &'static [u8])]);

impl tollgate_common::identity::IdentityView for Request {
    fn property(&self, name: &str) -> Option<Vec<u8>> {
        self.header(name)
    }
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_vec())
    }
    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        let folded = tollgate_common::http::cgi_fold(name.as_bytes());
        let found = self
            .0
            .iter()
            .filter(|(n, _)| tollgate_common::http::reads_as(n.as_bytes(), &folded));
        Some(found.map(|(_, v)| v.to_vec()).collect())
    }
}

#[test]
fn api_key_tenants_are_hashed() {
    let c = Config::parse(br#"{"prices":{},"tenant":{"api_key_header":"x-api-key"}}"#).unwrap();
    let t = c.tenant(&Request(&[("x-api-key", b"sk-secret")])).unwrap();
    // `printf sk-secret | sha256sum`, first 16 hex digits.
    assert_eq!(t, "key-746b4ad1ca9129e1");
    assert_eq!(
        c.tenant(&Request(&[("x-api-key", b" sk-secret\t")]))
            .unwrap(),
        t
    );
    assert_eq!(c.tenant(&Request(&[])).unwrap(), "anonymous");
    let c = Config::parse(br#"{"prices":{},"tenant":{"unverified_header":"x-tenant"}}"#).unwrap();
    assert_eq!(
        c.tenant(&Request(&[("x-tenant", b"alice")])).unwrap(),
        "alice"
    );
    assert_eq!(
        c.tenant(&Request(&[("x-tenant", b"a/b")])).unwrap(),
        "anonymous",
        "no way into other keys"
    );
    assert_eq!(
        c.tenant(&Request(&[("x-tenant", b"\xff")])).unwrap(),
        "anonymous"
    );
}

/// One credential is one tenant, whatever its spelling (RFC 9110 section 11.1: the scheme is
/// case-insensitive), and the common spelling keeps the tenant it had when the header's bytes
/// were hashed.
#[test]
fn one_credential_one_tenant() {
    let c = Config::parse(br#"{"prices":{},"tenant":{"api_key_header":"authorization"}}"#).unwrap();
    let tenant = |v: &'static [u8]| {
        let headers: &'static [(&'static str, &'static [u8])] =
            Box::leak(Box::new([("authorization", v)]));
        c.tenant(&Request(headers))
    };
    // `printf 'Bearer sk-1' | sha256sum`, first 16 hex digits.
    assert_eq!(tenant(b"Bearer sk-1").unwrap(), "key-c3e9a1c985d603e4");
    for spelling in [
        &b"bearer sk-1"[..],
        b"BEARER sk-1",
        b"Bearer   sk-1",
        b" bEaReR sk-1 ",
    ] {
        assert_eq!(tenant(spelling).unwrap(), "key-c3e9a1c985d603e4");
    }
    assert_ne!(tenant(b"Bearer SK-1").unwrap(), "key-c3e9a1c985d603e4");
    for bad in [
        &b"Bearer"[..],
        b"Bearer a b",
        b"sk-1",
        b"Bearer a,Bearer b",
        b"",
    ] {
        assert!(tenant(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    let x = Config::parse(br#"{"prices":{},"tenant":{"api_key_header":"x-api-key"}}"#).unwrap();
    let twice = Request(&[("x-api-key", b"sk-a"), ("x_api_key", b"sk-b")]);
    assert_eq!(x.tenant(&twice), Err(CredentialError::Repeated));
    let spoken_twice = Request(&[("x-api-key", b"sk-a"), ("x-api-key", b"sk-a")]);
    assert_eq!(x.tenant(&spoken_twice), Err(CredentialError::Repeated));
}

#[test]
fn header_tenants_are_verified_by_jwt_auth() {
    let c = Config::parse(br#"{"prices":{},"tenant":{"header":"x-jwt-sub"}}"#).unwrap();
    let forged = Request(&[("x-jwt-sub", b"alice")]);
    assert_eq!(
        c.tenant(&forged).unwrap(),
        "unauthenticated",
        "a client's own header"
    );
    let refused = Request(&[
        ("x-jwt-sub", b"alice"),
        ("wasmx.tollgate.jwt_auth", b"outcome=expired"),
    ]);
    assert_eq!(c.tenant(&refused).unwrap(), "unauthenticated");
    let verified = Request(&[
        ("x-jwt-sub", b"mallory"),
        ("wasmx.tollgate.jwt_auth", b"outcome=ok"),
        ("wasmx.tollgate.jwt_auth.header.x-jwt-sub", b"alice"),
    ]);
    assert_eq!(c.tenant(&verified).unwrap(), "alice");
    let no_claim = Request(&[("wasmx.tollgate.jwt_auth", b"outcome=ok")]);
    assert_eq!(c.tenant(&no_claim).unwrap(), "anonymous");
}

/// A store whose every operation first yields the thread, so that the OS interleaves the
/// simulated workers between host calls (including between a read and its CAS write).
struct Yielding(MemoryStore);

impl SharedStore for Yielding {
    fn get(&self, key: &str) -> Result<Read, StoreError> {
        std::thread::yield_now();
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        std::thread::yield_now();
        self.0.set(key, value, cas)
    }
}

/// Several threads play the workers, booking concurrently to a few tenants created on the fly
/// (the first-insert race included): the ledger holds the exact sum under both hosts' rules.
#[test]
fn ledger_loses_no_update_across_workers() {
    for sem in [Semantics::Envoy, Semantics::NgxWasm] {
        for round in 0..20 {
            let store = Arc::new(Yielding(MemoryStore::new(sem)));
            let ledger = Arc::new(Ledger::new("sim", 1_000, 1_000));
            ledger.ensure(&*store, std::iter::empty(), 0).unwrap();
            let now_ms = 1_700_000_000_000;
            let handles: Vec<_> = (0..4u64)
                .map(|w| {
                    let (store, ledger) = (store.clone(), ledger.clone());
                    std::thread::spawn(move || {
                        for i in 0..500u64 {
                            let tenant = format!("t{}", (i + w + round) % 3);
                            ledger
                                .book(&*store, &ledger.key(&tenant), now_ms, w * 1_000 + i, None)
                                .unwrap();
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let now = Periods::at(now_ms / 1000);
            let total: u64 = (0..3)
                .map(|t| {
                    ledger
                        .spend(&*store, &ledger.key(&format!("t{t}")), &now)
                        .unwrap()
                        .spend
                        .total
                })
                .sum();
            let want: u64 = (0..4u64)
                .map(|w| (0..500).map(|i| w * 1_000 + i).sum::<u64>())
                .sum();
            assert_eq!(total, want, "{sem:?} round {round}");
            // zone + overflow + 3 tenants: bounded keys.
            assert_eq!(store.0.len(), 5);
            assert!(store.get("cost/sim/~zone").unwrap().0.is_some());
        }
    }
}
