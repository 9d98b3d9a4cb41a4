//! What one finished request adds to which series: host-free, so that the whole mapping from a
//! request's observations to metric names and values is unit-tested natively. The filter gathers
//! an [`Observation`] in `on_log` and passes host callbacks to define and update metrics.

use crate::config::Config;
use crate::labels::{model_label, status_class, Label};
use crate::series::{Family, Kind, SeriesCache, Value};

/// The Envoy attribute `response.code` (the response status) as the filter asks the host for it
/// (`tollgate_common::host_calls::property_encoded`): the ABI's encoding of the path's two segments
/// (`tollgate_common::abi_codec::encode_path`: joined by NUL), written out once instead of built
/// on every request.
pub const RESPONSE_CODE: &str = "response\0code";
/// `request.size` (request body bytes), encoded as [`RESPONSE_CODE`].
pub const REQUEST_SIZE: &str = "request\0size";
/// `response.size` (response body bytes), encoded as [`RESPONSE_CODE`].
pub const RESPONSE_SIZE: &str = "response\0size";

/// A signal holding a decimal integer (the cost filter's token counts and price), as
/// `str::trim` then `u64::from_str` read it (`None`: not UTF-8, not a number, or over
/// `u64::MAX`). Plain ASCII digits, what the cost filter writes, are read without the UTF-8 and
/// whitespace passes.
pub fn decimal(bytes: &[u8]) -> Option<u64> {
    // Up to 19 digits cannot overflow a u64 (10^19 - 1 < 2^64): no overflow checks, which cost
    // a 128-bit multiplication each on wasm32 (`__multi3`).
    if (1..=19).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_digit) {
        return Some(bytes.iter().fold(0u64, |n, d| {
            n.wrapping_mul(10)
                .wrapping_add(u64::from(d.wrapping_sub(b'0')))
        }));
    }
    tollgate_common::bytes::utf8(bytes)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The cost filter's signals for the request (`tollgate_common::signals::COST_*`), raw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostSignals<'a> {
    /// Model name as published (mapped to a configured model or `other`).
    pub model: Option<&'a str>,
    /// Tenant label (already capped by the tenant registry, `crate::tenants`).
    pub tenant: Label<'a>,
    /// Input tokens (count), cached and cache-creation ones included.
    pub input_tokens: Option<u64>,
    /// Output tokens (count), reasoning ones included.
    pub output_tokens: Option<u64>,
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    pub cached_input_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache (part of `input_tokens`).
    pub cache_creation_input_tokens: Option<u64>,
    /// Reasoning tokens (part of `output_tokens`).
    pub reasoning_tokens: Option<u64>,
    /// Price in nano-USD.
    pub cost_nano_usd: Option<u64>,
    /// `priced`, `unpriced` or `budget_exceeded`.
    pub status: Option<&'a str>,
}

/// What the filter observed about one request, at the end of its stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation<'a> {
    /// Method label (`crate::labels::method_label`).
    pub method: Label<'a>,
    /// Route label (`crate::labels::route_label`).
    pub route: Label<'a>,
    /// Tenant label (capped, `crate::tenants`), when a tenant is configured.
    pub tenant: Option<Label<'a>>,
    /// Response status code (0: none).
    pub status: u64,
    /// Microseconds from the request headers to the end of the stream; `None` when the start
    /// was not seen.
    pub duration_us: Option<u64>,
    /// Microseconds to the first response body byte, as the cost filter measured it
    /// (`first_byte_us` of its line); `None` when it published none.
    pub first_byte_us: Option<u64>,
    /// Request body bytes.
    pub request_bytes: u64,
    /// Response body bytes.
    pub response_bytes: u64,
    /// jwt-auth's result signal.
    pub auth_result: Option<&'a str>,
    /// rate-limit's decision and rule signals.
    pub rate_limit: Option<(&'a str, &'a str)>,
    /// The cost filter's signals, when it published a status.
    pub cost: Option<CostSignals<'a>>,
}

/// Adds `obs` to the metrics: for each series, `emit(id, kind, value)` (counter: add `value`;
/// histogram: record `value`); ids come from `cache`, defined with `define` on first use.
/// Counters are emitted only for non-zero values.
pub fn record(
    config: &Config,
    cache: &mut SeriesCache,
    obs: &Observation<'_>,
    define: &mut impl FnMut(Kind, &str) -> Option<u32>,
    emit: &mut impl FnMut(Option<u32>, Kind, u64),
) {
    let tenant = obs.tenant.unwrap_or(Label::OTHER);
    // The labels of `tollgate_requests_total`, in the fixed order, those configured.
    let candidates: [(&'static str, Value<'_>, bool); 4] = [
        ("method", Value::Set(obs.method), config.method),
        (
            "status_class",
            Value::Set(status_class(obs.status)),
            config.status_class,
        ),
        ("route", Value::Set(obs.route), config.route),
        (
            "tenant",
            Value::Set(tenant),
            config.tenant_label && obs.tenant.is_some(),
        ),
    ];
    let mut labels: [(&'static str, Value<'_>); 4] = [("", Value::Set(Label::OTHER)); 4];
    let mut n = 0usize;
    for (name, value, on) in candidates {
        if let (true, Some(slot)) = (on, labels.get_mut(n)) {
            *slot = (name, value);
            n = n.saturating_add(1);
        }
    }
    let used = labels.get(..n).unwrap_or(&[]);
    let mut counter = |family: Family, labels: &[(&'static str, Value<'_>)], value: u64| {
        if value > 0 {
            let id = cache.id(family, labels, &mut *define);
            emit(id, Kind::Counter, value);
        }
    };
    counter(Family::Requests, used, 1);
    let route = [("route", Value::Set(obs.route))];
    counter(Family::RequestBytes, &route, obs.request_bytes);
    counter(Family::ResponseBytes, &route, obs.response_bytes);
    if let Some(result) = obs.auth_result {
        counter(Family::Auth, &[("outcome", Value::Word(result))], 1);
    }
    for (filter, reason) in refusals(obs).into_iter().flatten() {
        counter(
            Family::Refusals,
            &[
                ("filter", Value::Set(filter)),
                ("reason", Value::Word(reason)),
            ],
            1,
        );
    }
    if let Some((rule, decision)) = obs.rate_limit {
        counter(
            Family::RateLimit,
            &[
                ("rule", Value::Word(rule)),
                ("outcome", Value::Word(decision)),
            ],
            1,
        );
    }
    if let Some(cost) = &obs.cost {
        let model = Value::Set(
            cost.model
                .map_or(Label::OTHER, |m| model_label(&config.models, m)),
        );
        if let Some(status) = cost.status {
            counter(Family::LlmRequests, &[("outcome", Value::Word(status))], 1);
        }
        let tenant = Value::Set(cost.tenant);
        for (kind, tokens) in [
            (INPUT, cost.input_tokens),
            (OUTPUT, cost.output_tokens),
            (CACHED_INPUT, cost.cached_input_tokens),
            (CACHE_CREATION, cost.cache_creation_input_tokens),
            (REASONING, cost.reasoning_tokens),
        ] {
            counter(
                Family::LlmTokens,
                &[
                    ("model", model),
                    ("type", Value::Set(kind)),
                    ("tenant", tenant),
                ],
                tokens.unwrap_or(0),
            );
        }
        counter(
            Family::LlmCost,
            &[("model", model), ("tenant", Value::Set(cost.tenant))],
            cost.cost_nano_usd.unwrap_or(0),
        );
    }
    if let Some(us) = obs.duration_us {
        let id = cache.id(Family::Duration, &route, &mut *define);
        emit(id, Kind::Histogram, us);
    }
    // Time to first token: a 2xx response to a request that named a model.
    if let (Some(us), Some(CostSignals { model: Some(m), .. }), 200..=299) =
        (obs.first_byte_us, &obs.cost, obs.status)
    {
        let model = [("model", Value::Set(model_label(&config.models, m)))];
        let id = cache.id(Family::TimeToFirstToken, &model, &mut *define);
        emit(id, Kind::Histogram, us);
    }
}

/// The refusals among the request's outcomes (`tollgate_common::signals`), as `filter` label
/// and reason: each filter's outcome other than the ones that let the request through (jwt-auth
/// `ok`, `bypass`; rate-limit `allowed` and `*_allowed`; cost `priced`, `estimated`,
/// `unpriced`). A chain stops at its first refusal, so at most one is expected.
pub fn refusals<'a>(obs: &Observation<'a>) -> [Option<(Label<'static>, &'a str)>; 3] {
    let auth = obs
        .auth_result
        .filter(|r| !matches!(*r, "ok" | "bypass"))
        .map(|r| (JWT_AUTH, r));
    let rate_limit = obs
        .rate_limit
        .map(|(_, d)| d)
        .filter(|d| *d != "allowed" && !d.ends_with("_allowed"))
        .map(|d| (RATE_LIMIT, d));
    let cost = obs
        .cost
        .as_ref()
        .and_then(|c| c.status)
        .filter(|s| !matches!(*s, "priced" | "estimated" | "unpriced"))
        .map(|s| (COST, s));
    [auth, rate_limit, cost]
}

/// `tollgate_refusals_total`'s `filter` label: jwt-auth.
const JWT_AUTH: Label<'static> = Label {
    index: 0,
    text: "jwt_auth",
};
/// `tollgate_refusals_total`'s `filter` label: rate-limit.
const RATE_LIMIT: Label<'static> = Label {
    index: 1,
    text: "rate_limit",
};
/// `tollgate_refusals_total`'s `filter` label: cost.
const COST: Label<'static> = Label {
    index: 2,
    text: "cost",
};

/// `tollgate_llm_tokens_total`'s `type` label: input tokens.
const INPUT: Label<'static> = Label {
    index: 0,
    text: "input",
};
/// `tollgate_llm_tokens_total`'s `type` label: output tokens.
const OUTPUT: Label<'static> = Label {
    index: 1,
    text: "output",
};
/// `tollgate_llm_tokens_total`'s `type` label: input tokens read from the prompt cache.
const CACHED_INPUT: Label<'static> = Label {
    index: 2,
    text: "cached_input",
};
/// `tollgate_llm_tokens_total`'s `type` label: input tokens written to the prompt cache.
const CACHE_CREATION: Label<'static> = Label {
    index: 3,
    text: "cache_creation",
};
/// `tollgate_llm_tokens_total`'s `type` label: reasoning tokens.
const REASONING: Label<'static> = Label {
    index: 4,
    text: "reasoning",
};

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::abi_codec::encode_path;

    #[test]
    fn decimal_reads_as_trim_then_parse() {
        let reference =
            |b: &[u8]| -> Option<u64> { std::str::from_utf8(b).ok()?.trim().parse().ok() };
        let mut cases: Vec<Vec<u8>> = [
            "",
            "0",
            "7",
            "0042",
            "1500",
            "9999999999999999999",
            "10000000000000000000",
            "00000000000000000000001",
            " 12 ",
            "+5",
            "-1",
            "1e3",
            "12a",
            "\u{a0}9",
            "\u{2003}9\n",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        cases.push(b"\xff1".to_vec());
        for n in [0u64, 9, 10, 99, 100, u64::MAX / 10, u64::MAX - 1, u64::MAX] {
            cases.push(n.to_string().into_bytes());
        }
        for case in cases {
            assert_eq!(decimal(&case), reference(&case), "{case:?}");
        }
    }

    #[test]
    fn attribute_paths_are_encoded_as_the_abi_encodes_them() {
        for (encoded, segments) in [
            (RESPONSE_CODE, ["response", "code"]),
            (REQUEST_SIZE, ["request", "size"]),
            (RESPONSE_SIZE, ["response", "size"]),
        ] {
            assert_eq!(encoded.as_bytes(), &*encode_path(&segments));
        }
    }
}
