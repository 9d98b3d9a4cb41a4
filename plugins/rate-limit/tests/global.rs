//! Global mode: its configuration, the ShouldRateLimit request a rule sends and the verdict its
//! reply gives.

// A test crate: its helpers (outside #[test] functions, which clippy.toml already covers) may
// unwrap, index and panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable
)]

use std::collections::HashSet;

use serde_json::json;
use tollgate_common::rls::{
    self, Code, DescriptorStatus, OnError, RateLimitResponse, Unit, MAX_REPLY_BYTES,
};
use tollgate_rate_limit::algorithm::Decision;
use tollgate_rate_limit::config::{Config, Rule};
use tollgate_rate_limit::global::{descriptor_rule, request, verdict};
use tollgate_rate_limit::limiter::Verdict;

const GLOBAL: &str = r#"{"service": "ratelimit", "domain": "tollgate"}"#;

fn global() -> serde_json::Value {
    serde_json::from_str(GLOBAL).unwrap()
}

fn fixed(requests: u64, per: &str) -> serde_json::Value {
    json!({"algorithm": "fixed_window", "requests": requests, "per": per})
}

fn parse(doc: serde_json::Value) -> Result<Config, String> {
    Config::parse(doc.to_string().as_bytes()).map_err(|e| e.field)
}

fn one_rule(rule: serde_json::Value) -> Rule {
    parse(json!({"rules": [rule], "global": global()}))
        .unwrap()
        .rules
        .remove(0)
}

#[test]
fn a_filter_level_block_makes_every_rule_global_unless_it_says_false() {
    let c = parse(json!({
        "global": {"service": "rls", "domain": "d", "timeout_ms": 80, "on_error": "deny"},
        "rules": [
            {"name": "a", "limits": [fixed(10, "minute")]},
            {"name": "b", "global": false, "limits": [{"requests": 5, "per": "second"}]},
            {"name": "c", "global": {"service": "other", "domain": "e"}, "limits": [fixed(1, "day")]},
        ]
    }))
    .unwrap();
    let a = c.rules[0].global.as_ref().unwrap();
    assert_eq!(
        (a.service.as_str(), a.domain.as_str(), a.timeout_ms),
        ("rls", "d", 80)
    );
    assert_eq!(a.on_error, OnError::Deny);
    assert!(c.rules[1].global.is_none());
    let own = c.rules[2].global.as_ref().unwrap();
    assert_eq!(
        (own.service.as_str(), own.on_error),
        ("other", OnError::Local)
    );
    // Without any block, rules stay local.
    let local = parse(json!({"rules": [{"name": "a", "limits": [fixed(1, "second")]}]})).unwrap();
    assert!(local.rules[0].global.is_none());
}

#[test]
fn token_bucket_rules_stay_local() {
    // The default algorithm is token_bucket: a global rule must say fixed_window.
    let err = parse(json!({
        "global": global(),
        "rules": [{"name": "a", "limits": [fixed(10, "minute"), {"requests": 1, "per": "second"}]}]
    }))
    .unwrap_err();
    assert_eq!(err, "rules[0].limits[1].algorithm");
    let err = parse(json!({"rules": [{"name": "a", "global": global(),
        "limits": [{"algorithm": "token_bucket", "requests": 1, "per": "second"}]}]}))
    .unwrap_err();
    assert_eq!(err, "rules[0].limits[0].algorithm");
    let message = Config::parse(
        json!({"global": global(), "rules": [{"name": "a", "limits": [{"requests": 1, "per": "second"}]}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("token-bucket rules stay local"),
        "{message}"
    );
}

#[test]
fn global_blocks_refuse_with_the_field_named() {
    let rule = |g: serde_json::Value| json!({"rules": [{"name": "a", "global": g, "limits": [fixed(1, "second")]}]});
    let cases = [
        (rule(json!(true)), "rules[0].global"),
        (rule(json!("ratelimit")), "rules[0].global"),
        (rule(json!({"domain": "d"})), "rules[0].global"),
        (
            rule(json!({"service": "", "domain": "d"})),
            "rules[0].global.service",
        ),
        (
            rule(json!({"service": "s", "domain": "a b"})),
            "rules[0].global.domain",
        ),
        (
            rule(json!({"service": "s", "domain": "d", "timeout_ms": 0})),
            "rules[0].global.timeout_ms",
        ),
        (
            rule(json!({"service": "s", "domain": "d", "on_error": "open"})),
            "rules[0].global.on_error",
        ),
        (
            rule(json!({"service": "s", "domain": "d", "extra": 1})),
            "rules[0].global.extra",
        ),
        (
            rule(json!({"service": "s", "domain": "d", "breaker": {"failures": 0}})),
            "rules[0].global.breaker.failures",
        ),
        (
            json!({"global": {"service": "s", "domain": "d", "timeout_ms": 99999}, "rules": [{"name": "a", "limits": [fixed(1, "second")]}]}),
            "global.timeout_ms",
        ),
        (
            json!({"global": {"service": "s"}, "rules": [{"name": "a", "limits": [fixed(1, "second")]}]}),
            "global",
        ),
    ];
    for (doc, field) in cases {
        assert_eq!(parse(doc.clone()).unwrap_err(), field, "{doc}");
    }
}

#[test]
fn one_descriptor_per_limit_with_its_override_and_the_weight_as_hits_addend() {
    let rule = one_rule(json!({
        "name": "per-user",
        "key": [{"unverified_header": "x-api-key"}],
        "limits": [fixed(10, "second"), fixed(600, "minute"), fixed(5000, "hour"), fixed(20000, "day")],
        "weight_header": "x-cost",
    }));
    let req = request(&rule, "tollgate", Some("5:alice"), 7);
    assert_eq!(req.domain, "tollgate");
    assert_eq!(req.hits_addend, 7);
    assert_eq!(req.descriptors.len(), 4);
    let units = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day];
    for (i, (d, requests)) in req
        .descriptors
        .iter()
        .zip([10, 600, 5000, 20000])
        .enumerate()
    {
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let rule_value = format!("{}:default/per-user/{i}", "default/per-user/0".len());
        assert_eq!(
            entries,
            vec![("rule", rule_value.as_str()), ("key", "5:alice")]
        );
        let limit = d.limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, requests);
        assert_eq!(limit.unit, units[i] as i32);
        assert_eq!(d.hits_addend, None, "the request's hits_addend applies");
    }
    // The bytes are a RateLimitRequest any implementation reads back.
    let bytes = rls::encode_request(&req);
    let back = <rls::RateLimitRequest as prost::Message>::decode(&*bytes).unwrap();
    assert_eq!(back, req);
}

#[test]
fn keyless_and_missing_key_requests() {
    let rule = one_rule(json!({"name": "all", "limits": [fixed(100, "minute")]}));
    let req = request(&rule, "d", Some(""), 1);
    assert_eq!(req.descriptors[0].entries.len(), 1, "no empty `key` entry");
    assert_eq!(req.hits_addend, 1);
    let rule = one_rule(
        json!({"name": "k", "key": ["path"], "missing_key": "shared",
        "limits": [fixed(100, "minute")]}),
    );
    let req = request(&rule, "d", None, 1);
    assert_eq!(req.descriptors[0].entries[1].value, "~missing");
    // Every entry is non-empty (rls.proto: min_len 1 on key and value).
    for e in &req.descriptors[0].entries {
        assert!(!e.key.is_empty() && !e.value.is_empty());
    }
}

/// The reference server's Redis key for a descriptor (envoyproxy/ratelimit
/// `src/limiter/cache_key.go`, `GenerateCacheKey`): `domain_` then `key_value_` per entry, then
/// the window start.
fn cache_key(domain: &str, d: &rls::RateLimitDescriptor, window_start: u64) -> String {
    let mut k = format!("{domain}_");
    for e in &d.entries {
        k.push_str(&format!("{}_{}_", e.key, e.value));
    }
    k.push_str(&window_start.to_string());
    k
}

#[test]
fn distinct_rules_limits_and_clients_never_share_a_server_counter() {
    // Rule names and client keys full of the server's `_` separator, and limits whose windows
    // start at the same second (minute, hour and day at midnight).
    let rules = [
        one_rule(json!({"name": "a", "key": [{"unverified_header": "k"}],
            "limits": [fixed(1, "minute"), fixed(1, "hour"), fixed(1, "day")]})),
        one_rule(
            json!({"name": "a_key_1", "key": [{"unverified_header": "k"}],
            "limits": [fixed(1, "minute")]}),
        ),
        one_rule(json!({"name": "a_0", "key": [{"unverified_header": "k"}],
            "limits": [fixed(1, "minute")]})),
    ];
    let clients = ["1:x", "3:x_y", "5:x_key", "1:y", "~missing", "#00ff"];
    let mut seen = HashSet::new();
    let mut total = 0;
    for rule in &rules {
        for client in clients {
            for d in request(rule, "tollgate", Some(client), 1).descriptors {
                total += 1;
                seen.insert(cache_key("tollgate", &d, 1_700_006_400));
            }
        }
    }
    assert_eq!(seen.len(), total);
    assert_eq!(descriptor_rule("z", "r", 3), "5:z/r/3");
}

fn status(code: Code, remaining: u32, reset_s: i64) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: None,
        limit_remaining: remaining,
        duration_until_reset: Some(prost_types::Duration {
            seconds: reset_s,
            nanos: 0,
        }),
    }
}

fn reply(overall: Code, statuses: Vec<DescriptorStatus>) -> Vec<u8> {
    prost::Message::encode_to_vec(&RateLimitResponse {
        overall_code: overall as i32,
        statuses,
    })
}

#[test]
fn an_ok_reply_gives_every_limit_its_remaining_and_reset() {
    let bytes = reply(
        Code::Ok,
        vec![status(Code::Ok, 9, 1), status(Code::Ok, 599, 42)],
    );
    let v = verdict(&rls::reply_verdict(0, bytes.len(), Some(&bytes), 2).unwrap());
    let d = |remaining, reset_after_ms| Decision {
        allowed: true,
        remaining,
        reset_after_ms,
        retry_after_ms: 0,
        window_start_ms: 0,
    };
    assert_eq!(
        v,
        Verdict::Allowed([d(9, 1_000), d(599, 42_000)].into_iter().collect())
    );
}

#[test]
fn an_over_limit_reply_refuses_at_the_first_limit_over() {
    let bytes = reply(
        Code::OverLimit,
        vec![status(Code::Ok, 3, 1), status(Code::OverLimit, 0, 17)],
    );
    let v = verdict(&rls::reply_verdict(0, bytes.len(), Some(&bytes), 2).unwrap());
    let Verdict::Limited { index, decision } = v else {
        panic!("{v:?}")
    };
    assert_eq!(index, 1);
    assert!(!decision.allowed);
    assert_eq!(decision.remaining, 0);
    assert_eq!(decision.retry_after_ms, 17_000);
    // Over limit overall, no status says which: the first limit refuses.
    let bytes = reply(Code::OverLimit, vec![status(Code::Ok, 0, 5)]);
    let v = verdict(&rls::reply_verdict(0, bytes.len(), Some(&bytes), 1).unwrap());
    assert!(matches!(v, Verdict::Limited { index: 0, .. }), "{v:?}");
}

#[test]
fn hostile_replies_are_failures_never_verdicts() {
    let ok = reply(Code::Ok, vec![status(Code::Ok, 1, 1)]);
    let cases: Vec<(u32, usize, Option<Vec<u8>>)> = vec![
        (14, 0, None), // UNAVAILABLE (Envoy: no upstream)
        (4, 0, None),  // DEADLINE_EXCEEDED
        (0, 0, None),  // OK with no message
        (0, ok.len() - 1, Some(ok[..ok.len() - 1].to_vec())), // truncated
        (0, 3, Some(vec![0x08, 0x07, 0x12])), // unknown code, then garbage
        (0, 2, Some(vec![0x08, 0x07])), // unknown overall code
        (0, ok.len(), Some(reply(Code::Ok, vec![]))), // no status for the descriptor
        (0, MAX_REPLY_BYTES + 1, None), // announced oversize
        (0, 8, Some(vec![0u8; MAX_REPLY_BYTES + 1])), // delivered oversize
    ];
    for (status_code, size, body) in cases {
        let r = rls::reply_verdict(status_code, size, body.as_deref(), 1);
        assert!(r.is_err(), "{status_code} {size} {body:02x?}: {r:?}");
    }
}
