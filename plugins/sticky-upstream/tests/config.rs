//! Bad configurations refuse to load, naming the field; good ones compile as documented.

// A test crate: its helpers (outside #[test] functions, which clippy.toml already covers) may
// unwrap, index, slice strings and panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)]

use serde_json::{json, Value};
use tollgate_sticky_upstream::config::{ChooseBy, Config, SameSite};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn base() -> Value {
    json!({"upstreams": [{"name": "blue", "weight": 3}, {"name": "green"}], "secret": SECRET})
}

fn with(patch: Value) -> Value {
    let mut doc = base();
    for (k, v) in patch.as_object().unwrap() {
        if v.is_null() {
            doc.as_object_mut().unwrap().remove(k);
        } else {
            doc[k] = v.clone();
        }
    }
    doc
}

fn err(doc: Value) -> (String, String) {
    match Config::parse(doc.to_string().as_bytes()) {
        Ok(_) => panic!("accepted: {doc}"),
        Err(e) => (e.field.clone(), e.to_string()),
    }
}

#[test]
fn defaults() {
    let c = Config::parse(base().to_string().as_bytes()).unwrap();
    assert_eq!(c.upstreams[0].weight, 3);
    assert_eq!(c.upstreams[1].weight, 1, "weight defaults to 1");
    assert_eq!(c.cookie.name, "tollgate_sticky");
    assert_eq!(c.cookie.path, "/");
    assert_eq!(c.cookie.max_age_seconds, 3600);
    assert!(c.cookie.http_only && !c.cookie.secure);
    assert_eq!(c.cookie.same_site, SameSite::Lax);
    assert_eq!(
        c.cookie.attributes,
        "; HttpOnly; SameSite=Lax; Path=/; Max-Age=3600"
    );
    assert_eq!(c.route_header, "x-tollgate-upstream");
    assert_eq!(c.choose_by, ChooseBy::Weighted);
    assert_eq!(c.repin_statuses, vec![502, 503]);
    assert!(!c.repin_upstream_answers);
    assert_eq!(c.upstream_index("green"), Some(1));
    assert_eq!(c.upstream_index("Green"), None);
}

#[test]
fn full_configuration_and_set_cookie() {
    let doc = with(json!({
        "cookie": {"name": "__Host-sticky", "path": "/", "domain": null, "max_age_seconds": 60,
                   "http_only": false, "secure": true, "same_site": "None"},
        "secret": null,
        "secret_base64": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        "route_header": "X-Pick",
        "choose_by": {"hash_header": "X-User"},
        "repin_statuses": [503, 503, 500],
        "repin_upstream_answers": true,
    }));
    let c = Config::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(c.route_header, "x-pick");
    assert_eq!(c.choose_by, ChooseBy::HashHeader("x-user".into()));
    assert_eq!(c.repin_statuses, vec![503, 500]);
    let set = c.set_cookie(1, 1000).unwrap();
    let (value, attrs) = set
        .strip_prefix("__Host-sticky=")
        .unwrap()
        .split_once(';')
        .unwrap();
    assert!(value.starts_with("green.1060."), "{set}");
    assert_eq!(attrs, " SameSite=None; Secure; Path=/; Max-Age=60");
    // The same secret given as text verifies what the base64 one signed.
    let text = with(json!({"cookie": {"name": "__Host-sticky", "secure": true}}));
    let c2 = Config::parse(text.to_string().as_bytes()).unwrap();
    assert_eq!(c2.signer.verify(value).unwrap().upstream, "green");

    let domain = with(json!({"cookie": {"domain": ".Example.COM", "same_site": "strict"}}));
    let c3 = Config::parse(domain.to_string().as_bytes()).unwrap();
    assert_eq!(c3.cookie.domain.as_deref(), Some("example.com"));
    assert!(
        c3.cookie.attributes.contains("; Domain=example.com"),
        "{}",
        c3.cookie.attributes
    );
    assert!(c3.cookie.attributes.contains("; SameSite=Strict"));
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        (with(json!({"upstreams": []})), "upstreams"),
        (with(json!({"extra": 1})), "extra"),
        (
            with(json!({"upstreams": [{"name": "a", "weight": 0}]})),
            "upstreams",
        ),
        (
            with(json!({"upstreams": [{"name": "a"}, {"name": "b"}, {"name": "a"}]})),
            "upstreams[2].name",
        ),
        (
            with(json!({"upstreams": [{"name": ""}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "a b"}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "a;b"}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "a\r\nx: y"}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "\"q\""}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "a,b"}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "é"}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "x".repeat(129)}]})),
            "upstreams[0].name",
        ),
        (
            with(json!({"upstreams": [{"name": "a", "weight": 1_000_001}]})),
            "upstreams[0].weight",
        ),
        (
            with(json!({"upstreams": [{"name": "a", "weight": -1}]})),
            "upstreams[0].weight",
        ),
        (
            with(json!({"upstreams": [{"name": "a", "wieght": 1}]})),
            "upstreams[0].wieght",
        ),
        (with(json!({"secret": "short"})), "secret"),
        (
            with(json!({"secret": "0123456789abcdef0123456789abcde"})),
            "secret",
        ),
        (with(json!({"secret": null})), "secret"),
        (with(json!({"secret_base64": "MDEy"})), "secret"),
        (
            with(json!({"secret": null, "secret_base64": "MDEy"})),
            "secret_base64",
        ),
        (
            with(json!({"secret": null, "secret_base64": "not base64!"})),
            "secret_base64",
        ),
        (with(json!({"cookie": {"name": ""}})), "cookie.name"),
        (with(json!({"cookie": {"name": "a=b"}})), "cookie.name"),
        (with(json!({"cookie": {"name": "a b"}})), "cookie.name"),
        (with(json!({"cookie": {"path": "app"}})), "cookie.path"),
        (with(json!({"cookie": {"path": "/a;b"}})), "cookie.path"),
        (
            with(json!({"cookie": {"domain": "exa mple.com"}})),
            "cookie.domain",
        ),
        (with(json!({"cookie": {"domain": ""}})), "cookie.domain"),
        (with(json!({"cookie": {"domain": "a..b"}})), "cookie.domain"),
        (
            with(json!({"cookie": {"max_age_seconds": 0}})),
            "cookie.max_age_seconds",
        ),
        (
            with(json!({"cookie": {"max_age_seconds": 34_560_001}})),
            "cookie.max_age_seconds",
        ),
        (
            with(json!({"cookie": {"same_site": "Loose"}})),
            "cookie.same_site",
        ),
        (
            with(json!({"cookie": {"same_site": "None"}})),
            "cookie.same_site",
        ),
        (
            with(json!({"cookie": {"name": "__Secure-s"}})),
            "cookie.secure",
        ),
        (
            with(json!({"cookie": {"name": "__Host-s", "secure": true, "path": "/app"}})),
            "cookie.name",
        ),
        (
            with(json!({"cookie": {"name": "__Host-s", "secure": true, "domain": "a.com"}})),
            "cookie.name",
        ),
        (with(json!({"cookie": {"nmae": "x"}})), "cookie.nmae"),
        (
            with(json!({"cookie": {"max_age_seconds": "3600"}})),
            "cookie.max_age_seconds",
        ),
        (with(json!({"route_header": "bad header"})), "route_header"),
        (with(json!({"route_header": ":authority"})), "route_header"),
        (with(json!({"route_header": ""})), "route_header"),
        (with(json!({"route_header": "Cookie"})), "route_header"),
        (
            with(json!({"route_header": "transfer-encoding"})),
            "route_header",
        ),
        (with(json!({"choose_by": "random"})), "choose_by"),
        (
            with(json!({"choose_by": {"hash_header": "bad header"}})),
            "choose_by.hash_header",
        ),
        (
            with(json!({"choose_by": {"hash_header": "X-Tollgate-Upstream"}})),
            "choose_by.hash_header",
        ),
        (
            with(json!({"repin_statuses": [502, 404]})),
            "repin_statuses[1]",
        ),
        (with(json!({"repin_statuses": [200]})), "repin_statuses[0]"),
        (
            with(json!({"repin_upstream_answers": "yes"})),
            "repin_upstream_answers",
        ),
    ];
    let mut wrong = Vec::new();
    for (doc, field) in cases {
        let (got, message) = err(doc.clone());
        if got != field || !message.contains(field) {
            wrong.push(format!("{doc}: expected `{field}`, got: {message}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // A missing required field is reported on the document, by name.
    let (field, message) = err(json!({"secret": SECRET}));
    assert_eq!(field, ".");
    assert!(message.contains("missing field `upstreams`"), "{message}");
}

#[test]
fn empty_and_trailing_input_refused() {
    assert!(Config::parse(b"").is_err());
    assert!(Config::parse(format!("{} x", base()).as_bytes()).is_err());
}

#[test]
fn the_secret_never_appears_in_debug_output() {
    let c = Config::parse(base().to_string().as_bytes()).unwrap();
    let debug = format!("{c:?}");
    assert!(!debug.contains(SECRET), "{debug}");
    assert!(!debug.contains("0123456789abcdef"), "{debug}");
}
