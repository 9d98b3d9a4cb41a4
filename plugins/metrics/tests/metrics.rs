//! Configuration refusals, label mapping, the tenant cap, and what a request records.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;

use serde_json::json;
use tollgate_common::identity::{Identity, IdentitySource};
use tollgate_common::shared_data::{MemoryStore, Semantics, SharedStore};
use tollgate_metrics::config::Config;
use tollgate_metrics::labels::{method_label, route_label, status_class, Label};
use tollgate_metrics::record::{record, CostSignals, Observation};
use tollgate_metrics::series::{Family, Kind, SeriesCache, Value, FAMILIES, LABELS};
use tollgate_metrics::tenants::Tenants;

fn err_field(doc: serde_json::Value) -> String {
    match Config::parse(doc.to_string().as_bytes()) {
        Ok(_) => panic!("accepted: {doc}"),
        Err(e) => {
            assert!(e.to_string().contains(&e.field), "{e}");
            e.field
        }
    }
}

#[test]
fn refusals_name_the_field() {
    let tenant = json!({"header": "x-tenant", "max_tenants": 10});
    let cases = [
        (json!({"routez": []}), "routez"),
        (
            json!({"routes": [{"name": "Chat", "prefix": "/c"}]}),
            "routes[0].name",
        ),
        (
            json!({"routes": [{"name": "a.b", "prefix": "/c"}]}),
            "routes[0].name",
        ),
        (
            json!({"routes": [{"name": "other", "prefix": "/c"}]}),
            "routes[0].name",
        ),
        (
            json!({"routes": [{"name": "a", "prefix": "/a"}, {"name": "a", "prefix": "/b"}]}),
            "routes[1].name",
        ),
        (
            json!({"routes": [{"name": "a", "prefix": "a"}]}),
            "routes[0].prefix",
        ),
        (json!({"routes": [{"name": "a"}]}), "routes[0]"),
        (
            json!({"tenant": {"header": "x tenant", "max_tenants": 1}}),
            "tenant.header",
        ),
        (
            json!({"tenant": {"header": "x", "max_tenants": 0}}),
            "tenant.max_tenants",
        ),
        (
            json!({"tenant": {"header": "x", "max_tenants": 10001}}),
            "tenant.max_tenants",
        ),
        (
            json!({"tenant": {"header": "x", "max_tenants": -1}}),
            "tenant.max_tenants",
        ),
        (
            json!({"tenant": {"header": "x", "max_tenants": 1, "registry": "A"}}),
            "tenant.registry",
        ),
        (
            json!({"tenant": {"header": "x", "max_tenants": 1, "max_age_seconds": 59}}),
            "tenant.max_age_seconds",
        ),
        (
            json!({"tenant": {"header": "x", "unverified_header": "y", "max_tenants": 1}}),
            "tenant",
        ),
        (json!({"tenant": {"max_tenants": 1}}), "tenant"),
        (
            json!({"routes": [{"name": "a", "prefix": "/a/../b"}]}),
            "routes[0].prefix",
        ),
        (json!({"labels": ["tenant"]}), "labels[0]"),
        (json!({"labels": ["route", "route"]}), "labels[1]"),
        (json!({"labels": ["path"]}), "labels[0]"),
        (
            json!({"tenant": tenant, "labels": ["method", "nope"]}),
            "labels[1]",
        ),
        (json!({"models": [""]}), "models[0]"),
        (json!({"models": ["gpt-4o", "GPT-4o"]}), "models[1]"),
        (json!({"models": ["x", "other"]}), "models[1]"),
        (json!({"flush_interval_ms": 60_001}), "flush_interval_ms"),
        (json!({"flush_interval_ms": -1}), "flush_interval_ms"),
        (json!({"flush_interval_ms": 0.5}), "flush_interval_ms"),
    ];
    for (doc, field) in cases {
        assert_eq!(err_field(doc.clone()), field, "{doc}");
    }
    assert_eq!(Config::parse(b"").unwrap_err().field, ".");
    assert_eq!(
        Config::parse(b"{} x").unwrap_err().field,
        ".",
        "trailing bytes"
    );
}

#[test]
fn defaults() {
    let c = Config::parse(b"{}").unwrap();
    assert!(c.routes.is_empty() && c.tenant.is_none());
    assert!(c.method && c.status_class && c.route && !c.tenant_label);
    assert_eq!(c.flush_interval_ms, 1_000);
    for ms in [0, 60_000] {
        let doc = format!(r#"{{"flush_interval_ms": {ms}}}"#);
        assert_eq!(Config::parse(doc.as_bytes()).unwrap().flush_interval_ms, ms);
    }
    let c = Config::parse(br#"{"tenant": {"header": "X-Tenant", "max_tenants": 3}}"#).unwrap();
    assert!(c.tenant_label);
    let t = c.tenant.unwrap();
    assert_eq!(t.source, IdentitySource::verified("x-tenant"));
    assert_eq!(t.key_prefix, "tollgate.metrics/default/");
    assert_eq!(t.max_age_seconds, 3600);
}

#[test]
fn label_mapping() {
    assert_eq!(method_label(b"GET"), "get");
    assert_eq!(method_label(b"PATCH"), "patch");
    assert_eq!(method_label(b"get"), "other", "methods are case-sensitive");
    assert_eq!(method_label(b"PROPFIND"), "other");
    assert_eq!(method_label(b""), "other");
    for (code, class) in [
        (0, "none"),
        (99, "none"),
        (100, "1xx"),
        (204, "2xx"),
        (301, "3xx"),
        (429, "4xx"),
        (599, "5xx"),
        (600, "none"),
    ] {
        assert_eq!(status_class(code), class, "{code}");
    }
    let c = Config::parse(
        br#"{"routes": [{"name": "chat", "prefix": "/v1/chat"}, {"name": "v1", "prefix": "/v1"}]}"#,
    )
    .unwrap();
    let route = |target: &[u8]| route_label(&c.routes, target, &c.paths);
    assert_eq!(route(b"/v1/chat/completions?x=1"), "chat");
    assert_eq!(route(b"/v1/models"), "v1", "first match");
    assert_eq!(route(b"/v2"), "other");
    assert_eq!(route(b"/v1?/v1/chat"), "v1", "query ignored");
    assert_eq!(route(b"\xff/v1"), "other");
    assert_eq!(route(b"/v1/chatX"), "v1", "segment-aware");
    assert_eq!(route(b"/v10"), "other", "segment-aware");
    assert_eq!(route(b"//v1/chat/x"), "chat", "normalised");
    assert_eq!(route(b"/healthz/../v1/%63hat"), "chat", "normalised");
    assert_eq!(route(b"/v1%2Fchat"), "other", "refused paths are other");
}

fn tenant_config(max: u32) -> Config {
    Config::parse(
        json!({"tenant": {"header": "x-tenant", "max_tenants": max, "registry": "t"}})
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

fn value(v: &[u8]) -> Identity {
    Identity::Value(v.to_vec())
}

/// Slot keys of the registry `t` and the labels in them.
fn slots(store: &MemoryStore) -> Vec<String> {
    let mut labels: Vec<String> = store
        .keys()
        .into_iter()
        .filter(|(k, _)| k.starts_with("tollgate.metrics/t/s/"))
        .map(|(k, _)| String::from_utf8(store.get(&k).unwrap().0.unwrap()[8..].to_vec()).unwrap())
        .collect();
    labels.sort();
    labels
}

const NOW: u64 = 1_800_000_000;

#[test]
fn tenant_cap_holds_across_vms() {
    for semantics in [Semantics::Envoy, Semantics::NgxWasm] {
        let store = MemoryStore::new(semantics);
        let c = tenant_config(3);
        let t = c.tenant.as_ref().unwrap();
        let (mut a, mut b) = (Tenants::new(t), Tenants::new(t));
        a.ensure_registry(&store);
        b.ensure_registry(&store);
        assert_eq!(a.label(&store, &value(b"Acme"), NOW, true), "acme");
        assert_eq!(b.label(&store, &value(b"beta"), NOW, true), "beta");
        // VM b learns acme from the registry without taking a slot.
        assert_eq!(b.label(&store, &value(b"acme"), NOW, true), "acme");
        assert_eq!(a.label(&store, &value(b"gamma"), NOW, true), "gamma");
        // The cap (3) is reached: a fourth value is `other` on every VM.
        assert_eq!(b.label(&store, &value(b"delta"), NOW, true), "other");
        assert_eq!(a.label(&store, &value(b"delta"), NOW, true), "other");
        // Admitted ones stay named everywhere, including one VM a never saw.
        assert_eq!(a.label(&store, &value(b"beta"), NOW, true), "beta");
        assert_eq!(b.label(&store, &value(b"gamma"), NOW, true), "gamma");
        assert_eq!(a.label(&store, &Identity::Absent, NOW, true), "none");
        assert_eq!(a.label(&store, &value(b""), NOW, true), "none");
        assert_eq!(
            a.label(&store, &Identity::Unauthenticated, NOW, true),
            "unauthenticated"
        );
        assert_eq!(a.label(&store, &value(&[b'x'; 65]), NOW, true), "other");
        assert_eq!(a.label(&store, &value(b"Other"), NOW, true), "other");
        assert_eq!(
            a.label(&store, &value(b"Unauthenticated"), NOW, true),
            "unauthenticated"
        );
        assert!(a.cached() <= 3 && b.cached() <= 3);
        let count = store.get("tollgate.metrics/t/~count").unwrap().0.unwrap();
        let generation = NOW / 3600;
        let mut want = generation.to_le_bytes().to_vec();
        want.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(count, want, "{semantics:?}");
        assert_eq!(slots(&store), ["acme", "beta", "gamma"]);
        assert!(
            store.len() <= 1 + 6,
            "the table has 2 x max_tenants keys at most"
        );
    }
}

#[test]
fn unauthenticated_traffic_cannot_fill_the_registry_and_entries_age_out() {
    let store = MemoryStore::new(Semantics::Envoy);
    let c = tenant_config(2);
    let mut a = Tenants::new(c.tenant.as_ref().unwrap());
    a.ensure_registry(&store);
    // Forged requests: never admitted, and they read nothing.
    let reads = store.ops().reads;
    for _ in 0..1000 {
        assert_eq!(
            a.label(&store, &Identity::Unauthenticated, NOW, true),
            "unauthenticated"
        );
    }
    assert_eq!(store.ops().reads, reads, "no shared-data read");
    // Values that may not be admitted (the cost tenant of an unverified request) are looked up.
    assert_eq!(a.label(&store, &value(b"key-1"), NOW, false), "other");
    assert_eq!(slots(&store), Vec::<String>::new());
    // Real tenants fill it; then a third is `other` ...
    assert_eq!(a.label(&store, &value(b"alice"), NOW, true), "alice");
    assert_eq!(a.label(&store, &value(b"bob"), NOW, false), "other");
    assert_eq!(a.label(&store, &value(b"bob"), NOW, true), "bob");
    assert_eq!(a.label(&store, &value(b"carol"), NOW, true), "other");
    // ... until the generation ends: everything ages out, carol gets a slot.
    let later = NOW + 3600;
    assert_eq!(a.label(&store, &value(b"carol"), later, true), "carol");
    assert_eq!(a.label(&store, &value(b"alice"), later, true), "alice");
    assert_eq!(a.label(&store, &value(b"bob"), later, true), "other");
    assert!(
        slots(&store).len() <= 4,
        "stale slots are reused: 2 x 2 keys at most"
    );
    let mut fresh = Tenants::new(c.tenant.as_ref().unwrap());
    assert_eq!(fresh.label(&store, &value(b"bob"), later, true), "other");
    assert_eq!(fresh.label(&store, &value(b"carol"), later, true), "carol");
}

#[test]
fn the_table_stays_bounded_under_many_tenants() {
    let store = MemoryStore::new(Semantics::NgxWasm);
    let c = tenant_config(50);
    let mut a = Tenants::new(c.tenant.as_ref().unwrap());
    a.ensure_registry(&store);
    let mut named = 0;
    for hour in 0..5u64 {
        for i in 0..200 {
            let t = format!("tenant-{hour}-{i}");
            if a.label(&store, &value(t.as_bytes()), NOW + hour * 3600, true) != "other" {
                named += 1;
            }
        }
    }
    assert_eq!(named, 5 * 50, "exactly max_tenants per generation");
    assert!(store.len() <= 1 + 100, "{} keys", store.len());
}

#[test]
fn admitted_tenants_are_found_as_sent_and_only_in_their_generation() {
    let store = MemoryStore::new(Semantics::Envoy);
    let c = tenant_config(2);
    let mut a = Tenants::new(c.tenant.as_ref().unwrap());
    a.ensure_registry(&store);
    assert_eq!(a.label(&store, &value(b"Acme"), NOW, true), "acme");
    let reads = store.ops().reads;
    for raw in [&b"acme"[..], b"ACME", b"acme", b"Acme"] {
        assert_eq!(a.label(&store, &value(raw), NOW, true), "acme");
    }
    assert_eq!(store.ops().reads, reads, "the VM cache answers");
    assert_eq!(a.label(&store, &value(b"other"), NOW, true), "other");
    assert_eq!(a.label(&store, &value(b"none"), NOW, true), "none");
    // The next generation: nothing is admitted until the registry says so again.
    let later = NOW + 3600;
    assert_eq!(a.label(&store, &value(b"acme"), later, false), "other");
    assert!(store.ops().reads > reads);
    assert_eq!(a.label(&store, &value(b"acme"), later, true), "acme");
    assert_eq!(a.cached(), 1);
}

#[test]
fn tenants_keep_their_numbers_until_the_vm_has_numbered_its_share() {
    use tollgate_metrics::tenants::{MAX_NUMBERED, NONE_LABEL, UNAUTHENTICATED_LABEL};
    let store = MemoryStore::new(Semantics::NgxWasm);
    let c = tenant_config(10_000);
    let mut a = Tenants::new(c.tenant.as_ref().unwrap());
    a.ensure_registry(&store);
    let mut numbers = std::collections::HashMap::new();
    let total = MAX_NUMBERED as usize + 100;
    for i in 0..total {
        // 10,000 a generation, the first tenants again in each.
        let generation = (i / 9_000) as u64;
        let now = NOW + generation * 3600;
        for t in [0, i] {
            let name = format!("t{t}");
            let label = a.label(&store, &value(name.as_bytes()), now, true);
            assert_eq!(label.text, name);
            let index = label.index;
            assert_eq!(
                *numbers.entry(name).or_insert(index),
                index,
                "{t} renumbered"
            );
        }
    }
    let unnumbered = numbers
        .values()
        .filter(|n| **n == Label::UNNUMBERED)
        .count();
    assert_eq!(unnumbered, total - MAX_NUMBERED as usize);
    let mut taken: Vec<u32> = numbers
        .values()
        .copied()
        .filter(|n| *n != Label::UNNUMBERED)
        .collect();
    taken.sort();
    assert_eq!(taken, (2..2 + MAX_NUMBERED).collect::<Vec<_>>());
    assert_eq!(a.label(&store, &Identity::Absent, NOW, true), NONE_LABEL);
    assert_eq!(
        a.label(&store, &Identity::Unauthenticated, NOW, true),
        UNAUTHENTICATED_LABEL
    );
    assert_eq!(a.label(&store, &value(b"Other"), NOW, true), Label::OTHER);
}

#[test]
fn tenant_values_that_sanitise_alike_share_a_slot() {
    let store = MemoryStore::new(Semantics::Envoy);
    let c = tenant_config(1);
    let mut a = Tenants::new(c.tenant.as_ref().unwrap());
    a.ensure_registry(&store);
    assert_eq!(a.label(&store, &value(b"a.b"), NOW, true), "a_b");
    assert_eq!(a.label(&store, &value(b"A_B"), NOW, true), "a_b");
    assert_eq!(
        a.label(&store, &value(b"\xff"), NOW, true),
        "other",
        "cap reached"
    );
}

/// Runs `record` and returns {encoded name: (kind, total)} plus the series defined.
fn run(config: &Config, cache: &mut SeriesCache, obs: &Observation<'_>) -> BTreeMap<String, u64> {
    let mut names: BTreeMap<u32, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut next = 0u32;
    let mut define = |_: Kind, name: &str| {
        next += 1;
        names.insert(next, name.to_string());
        Some(next)
    };
    let mut emitted: Vec<(u32, Kind, u64)> = Vec::new();
    let mut emit = |id: Option<u32>, kind: Kind, v: u64| emitted.push((id.unwrap(), kind, v));
    record(config, cache, obs, &mut define, &mut emit);
    for (id, kind, v) in emitted {
        let name = names.get(&id).cloned().unwrap_or_else(|| format!("#{id}"));
        let key = match kind {
            Kind::Counter => name,
            Kind::Histogram => format!("{name} (histogram)"),
        };
        *out.entry(key).or_insert(0) += v;
    }
    out
}

#[test]
fn a_request_records_its_series() {
    let c = Config::parse(
        br#"{"routes": [{"name": "chat", "prefix": "/v1/chat"}],
             "tenant": {"header": "x-tenant", "max_tenants": 5}, "models": ["gpt-4o"]}"#,
    )
    .unwrap();
    let mut cache = SeriesCache::new(100);
    let obs = Observation {
        method: method_label(b"POST"),
        route: route_label(&c.routes, b"/v1/chat/completions", &c.paths),
        tenant: Some(Label::unnumbered("acme")),
        status: 200,
        duration_us: Some(1234),
        first_byte_us: Some(456),
        request_bytes: 10,
        response_bytes: 0,
        auth_result: Some("ok"),
        rate_limit: Some(("per-user", "allowed")),
        cost: Some(CostSignals {
            model: Some("GPT-4o"),
            tenant: Label::unnumbered("acme"),
            input_tokens: Some(7),
            output_tokens: Some(3),
            cached_input_tokens: Some(4),
            cache_creation_input_tokens: None,
            reasoning_tokens: Some(2),
            cost_nano_usd: Some(1500),
            status: Some("priced"),
        }),
    };
    let got = run(&c, &mut cache, &obs);
    let want: BTreeMap<String, u64> = [
        (
            "tollgate_requests_total.method.post.status_class.2xx.route.chat.tenant.acme",
            1,
        ),
        ("tollgate_request_body_bytes_total.route.chat", 10),
        ("tollgate_auth_total.outcome.ok", 1),
        ("tollgate_rate_limit_total.rule.per-user.outcome.allowed", 1),
        ("tollgate_llm_requests_total.outcome.priced", 1),
        (
            "tollgate_llm_tokens_total.model.gpt-4o.type.input.tenant.acme",
            7,
        ),
        (
            "tollgate_llm_tokens_total.model.gpt-4o.type.output.tenant.acme",
            3,
        ),
        (
            "tollgate_llm_tokens_total.model.gpt-4o.type.cached_input.tenant.acme",
            4,
        ),
        (
            "tollgate_llm_tokens_total.model.gpt-4o.type.reasoning.tenant.acme",
            2,
        ),
        (
            "tollgate_llm_cost_nano_usd_total.model.gpt-4o.tenant.acme",
            1500,
        ),
        (
            "tollgate_request_duration_microseconds.route.chat (histogram)",
            1234,
        ),
        (
            "tollgate_llm_time_to_first_token_microseconds.model.gpt-4o (histogram)",
            456,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(got, want);
    let defined = cache.len();
    // The same request again defines nothing new (ids cached).
    let _ = run(&c, &mut cache, &obs);
    assert_eq!(cache.len(), defined);
    // An unknown model and a local reply without duration, labels subset.
    let c2 = Config::parse(br#"{"labels": ["status_class"], "models": ["a"]}"#).unwrap();
    let obs2 = Observation {
        method: method_label(b"GET"),
        route: Label::OTHER,
        status: 0,
        cost: Some(CostSignals {
            model: Some("b"),
            tenant: Label::OTHER,
            status: Some("unpriced"),
            ..CostSignals::default()
        }),
        ..Observation::default()
    };
    let got = run(&c2, &mut SeriesCache::new(100), &obs2);
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        [
            "tollgate_llm_requests_total.outcome.unpriced",
            "tollgate_requests_total.status_class.none"
        ]
    );
}

/// A host that gives ids 1, 2, 3... in definition order.
fn counting_host() -> impl FnMut(Kind, &str) -> Option<u32> {
    let mut defined = 0;
    move |_, _| {
        defined += 1;
        Some(defined)
    }
}

#[test]
fn series_cache_is_bounded() {
    let mut cache = SeriesCache::new(2);
    let mut names = Vec::new();
    let mut define = |_: Kind, name: &str| {
        names.push(name.to_string());
        u32::try_from(names.len()).ok()
    };
    let result = |r: &'static str| [("result", Value::Word(r))];
    assert_eq!(cache.id(Family::Auth, &result("1"), &mut define), Some(1));
    assert_eq!(cache.id(Family::Auth, &result("2"), &mut define), Some(2));
    assert_eq!(cache.id(Family::Auth, &result("1"), &mut define), Some(1));
    assert_eq!(cache.id(Family::Auth, &result("3"), &mut define), None);
    assert_eq!(cache.refused(), 1);
    assert_eq!(
        names,
        [
            "tollgate_auth_total.result.1",
            "tollgate_auth_total.result.2"
        ]
    );
}

/// Values a client chooses (tenants past the numbered ones are keyed by their text, in the
/// cache's second table) are held to the same bound: past `max` series, each new one is refused
/// and counted, and those already defined keep their ids.
#[test]
fn text_keyed_series_are_bounded_too() {
    let mut cache = SeriesCache::new(3);
    let mut define = counting_host();
    fn tenant(t: &str) -> [(&'static str, Value<'_>); 1] {
        [("tenant", Value::Set(Label::unnumbered(t)))]
    }
    for (i, t) in ["t-a", "t-b", "t-c"].iter().enumerate() {
        let want = u32::try_from(i + 1).ok();
        assert_eq!(cache.id(Family::Requests, &tenant(t), &mut define), want);
    }
    for i in 0..100 {
        let t = format!("hostile-{i}");
        assert_eq!(cache.id(Family::Requests, &tenant(&t), &mut define), None);
    }
    assert_eq!(cache.refused(), 100);
    assert_eq!(cache.len(), 3);
    assert_eq!(
        cache.id(Family::Requests, &tenant("t-b"), &mut define),
        Some(2)
    );
}

#[test]
fn series_differing_in_one_byte_are_two_series() {
    // Texts over 8 bytes, so that the cache's word-wise comparison (`same_bytes`) decides.
    let mut cache = SeriesCache::new(10);
    let mut define = counting_host();
    let mut id = |tenant: &str| {
        cache.id(
            Family::Requests,
            &[("tenant", Value::Set(Label::unnumbered(tenant)))],
            &mut define,
        )
    };
    assert_eq!(
        (id("acme-00001"), id("acme-00002"), id("acme-00001")),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!(cache.len(), 2);
}

#[test]
fn every_family_has_help_text() {
    for f in FAMILIES {
        assert!(tollgate_common::metric_help::help(f).is_some(), "{f}");
        assert!(include_str!("../README.md").contains(f), "README lacks {f}");
    }
}

#[test]
fn stats_tags_rules_cover_every_label() {
    let rules: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../stats_tags.json")).unwrap();
    let tags: Vec<&str> = rules
        .iter()
        .map(|r| r["tag_name"].as_str().unwrap())
        .collect();
    assert_eq!(tags, LABELS);
    for r in &rules {
        let re = r["regex"].as_str().unwrap();
        assert!(re.starts_with(r"^wasmcustom\.tollgate_"), "{re}");
        assert!(re.contains(&format!(r"(\.{}\.", r["tag_name"].as_str().unwrap())));
    }
    for f in FAMILIES {
        assert!(f.starts_with("tollgate_") && !f.contains('.'), "{f}");
    }
    // Every shipped Envoy configuration has the same rules (single-quoted YAML keeps the
    // backslashes): without them Envoy folds the filters' own labels into the metric names.
    let shipped = [
        (
            "envoy/metrics.yaml",
            include_str!("../../../envoy/metrics.yaml"),
        ),
        (
            "envoy/gateway.yaml",
            include_str!("../../../envoy/gateway.yaml"),
        ),
        (
            "envoy/llm-gateway.yaml",
            include_str!("../../../envoy/llm-gateway.yaml"),
        ),
        (
            "envoy/global-rate-limit.yaml",
            include_str!("../../../envoy/global-rate-limit.yaml"),
        ),
        (
            "envoy/sticky-upstream.yaml",
            include_str!("../../../envoy/sticky-upstream.yaml"),
        ),
    ];
    for (file, text) in shipped {
        for r in &rules {
            let re = r["regex"].as_str().unwrap();
            assert!(text.contains(&format!("'{re}'")), "{file} lacks {re}");
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../envoy");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| format!("envoy/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut listed: Vec<String> = shipped.iter().map(|(f, _)| f.to_string()).collect();
    listed.sort();
    assert_eq!(
        files, listed,
        "a shipped Envoy configuration is not checked here"
    );
}
