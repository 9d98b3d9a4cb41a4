//! What the LLM families and the refusals record: time to first token only for a successful
//! response to a request that named a model, refusals by filter and reason, and the bound on the
//! LLM series whatever models and tenants clients name.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;

use tollgate_common::identity::Identity;
use tollgate_common::shared_data::{MemoryStore, Semantics};
use tollgate_metrics::config::Config;
use tollgate_metrics::labels::Label;
use tollgate_metrics::record::{record, CostSignals, Observation};
use tollgate_metrics::series::{Kind, SeriesCache};
use tollgate_metrics::tenants::Tenants;

const NOW: u64 = 1_800_000_000;

fn value(v: &[u8]) -> Identity {
    Identity::Value(v.to_vec())
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
fn time_to_first_token_is_recorded_for_successful_model_responses_only() {
    let c = Config::parse(br#"{"models": ["gpt-4o"]}"#).unwrap();
    let ttft = |status: u64, model: Option<&'static str>, first_byte_us: Option<u64>| {
        let obs = Observation {
            status,
            first_byte_us,
            cost: Some(CostSignals {
                model,
                status: Some("priced"),
                ..CostSignals::default()
            }),
            ..Observation::default()
        };
        run(&c, &mut SeriesCache::new(100), &obs)
            .into_iter()
            .filter(|(k, _)| k.starts_with("tollgate_llm_time_to_first_token"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ttft(200, Some("gpt-4o"), Some(9)),
        [(
            "tollgate_llm_time_to_first_token_microseconds.model.gpt-4o (histogram)".to_string(),
            9
        )]
    );
    assert_eq!(
        ttft(206, Some("x"), Some(9))[0].0,
        "tollgate_llm_time_to_first_token_microseconds.model.other (histogram)"
    );
    // An error, a request that named no model, a response without a body byte: nothing.
    assert!(ttft(429, Some("gpt-4o"), Some(9)).is_empty());
    assert!(ttft(500, Some("gpt-4o"), Some(9)).is_empty());
    assert!(ttft(200, None, Some(9)).is_empty());
    assert!(ttft(200, Some("gpt-4o"), None).is_empty());
    // Without the cost filter's signals: not an LLM response.
    let obs = Observation {
        status: 200,
        first_byte_us: Some(9),
        ..Observation::default()
    };
    assert!(!run(&c, &mut SeriesCache::new(100), &obs)
        .keys()
        .any(|k| k.starts_with("tollgate_llm_time_to_first_token")));
}

#[test]
fn refusals_are_counted_by_filter_and_reason() {
    let c = Config::parse(b"{}").unwrap();
    let refusals = |obs: Observation<'_>| {
        run(&c, &mut SeriesCache::new(100), &obs)
            .into_iter()
            .filter(|(k, _)| k.starts_with("tollgate_refusals_total"))
            .collect::<Vec<_>>()
    };
    let cost = |status| {
        Some(CostSignals {
            status: Some(status),
            ..CostSignals::default()
        })
    };
    let cases: [(Observation<'_>, &[&str]); 8] = [
        (
            Observation {
                auth_result: Some("expired"),
                ..Observation::default()
            },
            &["tollgate_refusals_total.filter.jwt_auth.reason.expired"],
        ),
        (
            Observation {
                rate_limit: Some(("per-user", "limited")),
                ..Observation::default()
            },
            &["tollgate_refusals_total.filter.rate_limit.reason.limited"],
        ),
        (
            Observation {
                auth_result: Some("ok"),
                rate_limit: Some(("r", "allowed")),
                cost: cost("budget_exceeded"),
                ..Observation::default()
            },
            &["tollgate_refusals_total.filter.cost.reason.budget_exceeded"],
        ),
        (
            Observation {
                rate_limit: Some(("r", "global_error_denied")),
                ..Observation::default()
            },
            &["tollgate_refusals_total.filter.rate_limit.reason.global_error_denied"],
        ),
        // What lets a request through is no refusal.
        (
            Observation {
                auth_result: Some("bypass"),
                rate_limit: Some(("r", "store_failure_allowed")),
                cost: cost("estimated"),
                ..Observation::default()
            },
            &[],
        ),
        (
            Observation {
                rate_limit: Some(("r", "contention_allowed")),
                cost: cost("unpriced"),
                ..Observation::default()
            },
            &[],
        ),
        (
            Observation {
                cost: cost("priced"),
                ..Observation::default()
            },
            &[],
        ),
        (Observation::default(), &[]),
    ];
    for (obs, want) in cases {
        let got: Vec<String> = refusals(obs).into_iter().map(|(k, _)| k).collect();
        assert_eq!(got, want);
    }
}

/// Abuse: a client that names a new model and presents a new tenant on every request defines
/// no more token, spend or time-to-first-token series than the configuration allows: models
/// beyond `models` are `other`, tenants beyond `max_tenants` are `other`.
#[test]
fn cycling_models_and_tenants_does_not_grow_the_llm_series() {
    let c = Config::parse(
        br#"{"tenant": {"header": "x-tenant", "max_tenants": 2, "registry": "t"},
             "models": ["gpt-4o"]}"#,
    )
    .unwrap();
    let store = MemoryStore::new(Semantics::Envoy);
    let mut tenants = Tenants::new(c.tenant.as_ref().unwrap());
    tenants.ensure_registry(&store);
    let mut cache = SeriesCache::new(100_000);
    let mut names = std::collections::BTreeSet::new();
    for i in 0..2_000u64 {
        let model = format!("model-{i}");
        let tenant = format!("tenant-{i}");
        let tenant = tenants.label(&store, &value(tenant.as_bytes()), NOW, true);
        let tenant_text = tenant.text.to_string();
        let tenant = Label {
            index: tenant.index,
            text: &tenant_text,
        };
        let obs = Observation {
            status: 200,
            first_byte_us: Some(i),
            cost: Some(CostSignals {
                model: Some(&model),
                tenant,
                input_tokens: Some(1),
                output_tokens: Some(1),
                cached_input_tokens: Some(1),
                cache_creation_input_tokens: Some(1),
                reasoning_tokens: Some(1),
                cost_nano_usd: Some(1),
                status: Some("priced"),
            }),
            ..Observation::default()
        };
        names.extend(run(&c, &mut cache, &obs).into_keys());
    }
    let count = |prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
    // 2 admitted tenants + `other`; models `other` only (none of the configured one sent).
    assert_eq!(count("tollgate_llm_tokens_total."), 5 * 3);
    assert_eq!(count("tollgate_llm_cost_nano_usd_total."), 3);
    assert_eq!(count("tollgate_llm_time_to_first_token_microseconds."), 1);
    assert!(names.iter().all(|n| !n.contains("model-")), "{names:?}");
}
