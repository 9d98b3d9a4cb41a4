//! Bad configurations refuse to load, naming the field; good ones get their defaults.

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

use serde_json::json;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_rate_limit::algorithm::{Algorithm, Period};
use tollgate_rate_limit::config::{Config, MissingKey};
use tollgate_rate_limit::key::KeyPart;
use tollgate_rate_limit::limiter::OnContention;

fn err(doc: serde_json::Value) -> String {
    match Config::parse(doc.to_string().as_bytes()) {
        Ok(_) => panic!("accepted: {doc}"),
        Err(e) => e.to_string(),
    }
}

fn rule(extra: serde_json::Value) -> serde_json::Value {
    let mut r = json!({"name": "r", "limits": [{"requests": 10, "per": "second"}]});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    json!({ "rules": [r] })
}

#[test]
fn refusals_name_the_field() {
    let limit = |l: serde_json::Value| rule(json!({ "limits": [l] }));
    let cases = [
        (json!({}), "rules"),
        (json!({"rules": []}), "rules"),
        (json!({"rules": [], "namespace": "a/b"}), "namespace"),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "extra": 1}),
            "extra",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "status": 200}),
            "status",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "cas_retries": 1000}),
            "cas_retries",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "max_keys": 0}),
            "max_keys",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "error_format": "OpenAI"}),
            "error_format",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "on_contention": "maybe"}),
            "on_contention",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "store_full": {"action": "pool"}}),
            "store_full.action",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "store_full": {"status": 302}}),
            "store_full.status",
        ),
        (rule(json!({"max_keys": 0})), "rules[0].max_keys"),
        (
            rule(json!({"key": [{"client_address": {"ipv6_prefix": 0}}]})),
            "rules[0].key[0].client_address.ipv6_prefix",
        ),
        (
            rule(json!({"key": [{"client_address": {"ipv6_prefix": 129}}]})),
            "rules[0].key[0].client_address.ipv6_prefix",
        ),
        (rule(json!({"name": "has space"})), "rules[0].name"),
        (rule(json!({"name": "x".repeat(33)})), "rules[0].name"),
        (rule(json!({"limits": []})), "rules[0].limits"),
        (
            rule(json!({"match": {"prefix": "api"}})),
            "rules[0].match.prefix",
        ),
        (
            rule(json!({"match": {"prefix": "/v1/../admin"}})),
            "rules[0].match.prefix",
        ),
        (
            rule(json!({"match": {"prefix": "/a", "path": "/a"}})),
            "rules[0].match.path",
        ),
        (
            rule(json!({"key": [{"unverified_header": "bad header"}]})),
            "rules[0].key[0].unverified_header",
        ),
        (
            json!({"rules": [{"name": "r", "limits": [{"requests": 1, "per": "second"}]}], "paths": {"escaped_slashes": "decode"}}),
            "paths.escaped_slashes",
        ),
        (
            rule(json!({"match": {"methods": ["get"]}})),
            "rules[0].match.methods[0]",
        ),
        (
            rule(json!({"key": [{"cookie": "session"}]})),
            "rules[0].key[0]",
        ),
        (
            rule(json!({"key": ["path", {"header": "bad header"}]})),
            "rules[0].key[1].header",
        ),
        (
            rule(json!({"key": [{"client_address": {"trusted_hops": 17}}]})),
            "rules[0].key[0].client_address.trusted_hops",
        ),
        (
            rule(json!({"key": [{"client_address": {"hops": 1}}]})),
            "rules[0].key[0].client_address.hops",
        ),
        (
            rule(json!({"missing_key": "ignore"})),
            "rules[0].missing_key",
        ),
        (
            rule(json!({"weight_header": ":path"})),
            "rules[0].weight_header",
        ),
        (rule(json!({"max_weight": 5})), "rules[0].max_weight"),
        (
            rule(json!({"weight_header": "x-cost", "max_weight": 11})),
            "rules[0].max_weight",
        ),
        (
            rule(json!({"weight_header": "x-cost", "max_weight": 0})),
            "rules[0].max_weight",
        ),
        (
            limit(json!({"requests": 10, "per": "fortnight"})),
            "rules[0].limits[0].per",
        ),
        (limit(json!({"requests": 10})), "rules[0].limits[0]"),
        (
            limit(json!({"requests": 0, "per": "second"})),
            "rules[0].limits[0].requests",
        ),
        (
            limit(json!({"requests": -1, "per": "second"})),
            "rules[0].limits[0].requests",
        ),
        (
            limit(json!({"requests": "10", "per": "second"})),
            "rules[0].limits[0].requests",
        ),
        (
            limit(json!({"requests": 2_000_000_000u64, "per": "second"})),
            "rules[0].limits[0].requests",
        ),
        (
            limit(json!({"requests": 10, "per": "second", "capacity": 0})),
            "rules[0].limits[0].capacity",
        ),
        (
            limit(
                json!({"algorithm": "fixed_window", "requests": 10, "per": "second", "capacity": 20}),
            ),
            "rules[0].limits[0].capacity",
        ),
        (
            limit(json!({"algorithm": "leaky_bucket", "requests": 10, "per": "second"})),
            "rules[0].limits[0].algorithm",
        ),
        (
            limit(json!({"requests": 10, "per": "second", "burst": 5})),
            "rules[0].limits[0].burst",
        ),
        (
            rule(
                json!({"limits": [{"name": "a", "requests": 1, "per": "second"}, {"name": "a", "requests": 1, "per": "day"}]}),
            ),
            "rules[0].limits[1].name",
        ),
        (
            json!({"rules": [
                {"name": "r", "limits": [{"requests": 1, "per": "second"}]},
                {"name": "r", "limits": [{"requests": 1, "per": "second"}]}
            ]}),
            "rules[1].name",
        ),
    ];
    for (doc, field) in cases {
        let e = err(doc.clone());
        assert!(
            e.contains(&format!("`{field}`")),
            "{doc} -> {e} (expected field {field})"
        );
    }
    assert!(Config::parse(b"").is_err());
    assert!(Config::parse(b"{not json").is_err());
    assert!(Config::parse(b"[]").is_err());
}

#[test]
fn a_full_configuration_compiles() {
    let c = Config::parse(
        json!({
            "namespace": "edge",
            "rules": [{
                "name": "per-user",
                "match": {"prefix": "/api", "methods": ["GET"], "hosts": ["API.example.com"]},
                "key": [{"header": "X-JWT-Sub"}, {"client_address": {"trusted_hops": 2}}, "path", "method", "host"],
                "limits": [
                    {"algorithm": "token_bucket", "capacity": 20, "requests": 10, "per": "second"},
                    {"name": "daily", "algorithm": "fixed_window", "requests": 1000, "per": "day"}
                ],
                "missing_key": "shared",
                "weight_header": "X-Cost-Units"
            }],
            "status": 503,
            "headers_on_allowed": false,
            "cas_retries": 0,
            "on_contention": "deny",
            "max_keys": 10
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.rules[0].record_key, "ratelimit/edge/per-user/~zone");
    assert_eq!(c.rules[0].max_keys, 10, "the zone-wide default");
    assert_eq!(
        (c.status, c.headers_on_allowed, c.cas_retries, c.max_keys),
        (503, false, 0, 10)
    );
    assert_eq!(c.on_contention, OnContention::Deny);
    let r = &c.rules[0];
    assert_eq!(
        r.key,
        vec![
            KeyPart::Identity(tollgate_common::identity::IdentitySource::verified(
                "x-jwt-sub"
            )),
            KeyPart::ClientAddress {
                trusted_hops: 2,
                ipv6_prefix: 64
            },
            KeyPart::Path,
            KeyPart::Method,
            KeyPart::Host
        ]
    );
    assert_eq!(r.route.hosts, vec!["api.example.com".to_string()]);
    assert_eq!(r.missing_key, MissingKey::Shared);
    assert_eq!(r.weight_header.as_deref(), Some("x-cost-units"));
    assert_eq!(r.max_weight, 20, "defaults to the smallest capacity");
    assert_eq!(r.limits[0].name, "per-user-0");
    assert_eq!(r.limits[0].limit.algorithm(), Algorithm::TokenBucket);
    assert_eq!(r.limits[0].limit.capacity(), 20);
    assert_eq!(r.limits[1].name, "daily");
    assert_eq!(r.limits[1].limit.period(), Period::Day);
    assert_eq!(r.limits[1].key_prefix, "ratelimit/edge/per-user/1/");
    assert_eq!(
        r.limits[1].overflow_key,
        "ratelimit/edge/per-user/1/~overflow"
    );
    assert_eq!(
        r.limits[1].missing_key,
        "ratelimit/edge/per-user/1/~missing"
    );
    assert_eq!(
        r.policy_header,
        r#""per-user-0";q=10;w=1;tollgate-burst=20, "daily";q=1000;w=86400"#
    );
}

#[test]
fn defaults() {
    let c = Config::parse(rule(json!({})).to_string().as_bytes()).unwrap();
    assert_eq!(c.namespace, "default");
    // `zone`, the field's name before 2026-11-28, still names it; both at once are refused.
    let mut old = rule(json!({}));
    old["zone"] = json!("edge");
    let c = Config::parse(old.to_string().as_bytes()).unwrap();
    assert_eq!(c.namespace, "edge");
    old["namespace"] = json!("edge");
    assert!(Config::parse(old.to_string().as_bytes()).is_err());
    assert_eq!(
        (c.status, c.headers_on_allowed, c.cas_retries, c.max_keys),
        (429, true, 8, 100_000)
    );
    assert_eq!(c.on_contention, OnContention::Allow);
    assert_eq!(c.error_format, ErrorFormat::Auto);
    let mut anthropic = rule(json!({}));
    anthropic["error_format"] = json!("anthropic");
    let a = Config::parse(anthropic.to_string().as_bytes()).unwrap();
    assert_eq!(a.error_format, ErrorFormat::Anthropic);
    let r = &c.rules[0];
    assert_eq!(r.missing_key, MissingKey::Deny);
    assert!(r.key.is_empty(), "no key: one bucket for the rule");
    assert_eq!(
        r.limits[0].name, "r",
        "a rule's only limit is named after it"
    );
    assert_eq!(r.limits[0].limit.algorithm(), Algorithm::TokenBucket);
    assert_eq!(
        r.limits[0].limit.capacity(),
        10,
        "capacity defaults to requests"
    );
    assert_eq!(r.policy_header, r#""r";q=10;w=1"#);
}

#[test]
fn weights() {
    let c = Config::parse(
        rule(json!({"weight_header": "x-cost", "max_weight": 8}))
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let r = &c.rules[0];
    assert_eq!(r.weight(None), Some(1), "absent header: 1 unit");
    assert_eq!(r.weight(Some(b"4")), Some(4));
    assert_eq!(r.weight(Some(b" 8\t")), Some(8));
    assert_eq!(r.weight(Some(b"007")), Some(7));
    for bad in [
        &b"0"[..],
        b"9",
        b"-1",
        b"+1",
        b"1.5",
        b"1e3",
        b"",
        b"abc",
        b"\xff",
        b"99999999999999999999999",
    ] {
        assert_eq!(
            r.weight(Some(bad)),
            None,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}
