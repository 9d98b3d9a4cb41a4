//! Bad configurations refuse to load, naming the field.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)] // test code

use serde_json::json;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_jwt_auth::config::Config;

fn err(doc: serde_json::Value) -> String {
    let result = Config::parse(doc.to_string().as_bytes());
    assert!(result.is_err(), "accepted: {doc}");
    result.err().map(|e| e.to_string()).unwrap_or_default()
}

const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn refusals_name_the_field() {
    let cases = [
        (json!({}), "providers"),
        (json!({"providers": {}}), "providers"),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}, "extra": 1}),
            "extra",
        ),
        (json!({"providers": {"p": {"issuer": "i"}}}), "providers.p"),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": "short"}]}}}),
            "providers.p.hmac_secrets[0].secret",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "none", "secret": SECRET}]}}}),
            "providers.p.hmac_secrets[0].alg",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}, "error_format": "json"}),
            "error_format",
        ),
        (
            json!({"providers": {"p": {"pem_keys": [{"alg": "RS256", "pem": "-----BEGIN PUBLIC KEY-----\nxx\n-----END PUBLIC KEY-----"}]}}}),
            "providers.p.pem_keys[0].pem",
        ),
        (
            json!({"providers": {"p": {"local_jwks": {"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}}}}),
            "providers.p.local_jwks",
        ),
        (
            json!({"providers": {"p": {"local_jwks": {"nokeys": []}}}}),
            "providers.p.local_jwks",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}], "claim_to_headers": [{"claim": "sub", "header": "bad header"}]}}}),
            "providers.p.claim_to_headers[0].header",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}], "clock_skew_seconds": "60"}}}),
            "providers.p.clock_skew_seconds",
        ),
        (
            json!({"providers": {"p": {"remote_jwks": {"cluster": "jwks", "path": "jwks.json"}}}}),
            "providers.p.remote_jwks.path",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}, "rules": [{"match": {"prefix": "/"}, "providers": ["q"]}]}),
            "rules[0].providers[0]",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}, "rules": [{"match": {"prefix": "x"}}]}),
            "rules[0].match.prefix",
        ),
        (
            json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}, "rules": [{"match": {}, "bypass": true, "providers": ["p"]}]}),
            "rules[0].bypass",
        ),
    ];
    for (doc, field) in cases {
        let e = err(doc.clone());
        assert!(
            e.contains(&format!("`{field}`")),
            "{doc} -> {e} (expected field {field})"
        );
    }
    assert!(err(json!("not an object")).contains("invalid"));
    assert!(Config::parse(b"{not json").is_err());
}

#[test]
fn a_minimal_configuration_loads_with_defaults() {
    let c = Config::parse(
        json!({"providers": {"p": {"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let p = &c.providers[0];
    assert_eq!(p.clock_skew_seconds, 60);
    assert!(!p.forward);
    assert_eq!(c.cache_entries, 1024);
    assert_eq!(c.error_format, ErrorFormat::Auto);
    assert_eq!(
        p.locations,
        vec![tollgate_jwt_auth::token::TokenLocation::Header {
            name: "authorization".into(),
            prefix: "Bearer ".into()
        }]
    );
}

#[test]
fn only_the_pseudo_headers_the_rules_use_are_fetched() {
    let base = json!({"hmac_secrets": [{"alg": "HS256", "secret": SECRET}]});
    let c = Config::parse(json!({"providers": {"p": base}}).to_string().as_bytes()).unwrap();
    assert_eq!(c.needs, tollgate_jwt_auth::config::RequestNeeds::default());
    let mut with_param = base.clone();
    with_param["from_params"] = json!(["t"]);
    let c = Config::parse(
        json!({"providers": {"p": with_param}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert!(c.needs.query && !c.needs.path && !c.needs.method && !c.needs.host);
    let c = Config::parse(
        json!({"providers": {"p": base}, "rules": [{"match": {"prefix": "/a", "methods": ["GET"], "hosts": ["h"]}, "bypass": true}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert!(c.needs.path && c.needs.method && c.needs.host && !c.needs.query);
    let c = Config::parse(
        json!({"providers": {"p": base}, "rules": [{"match": {"prefix": "/"}, "bypass": true}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert!(!c.needs.path, "a match of every path reads no path");
}
