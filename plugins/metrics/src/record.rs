//! What one finished request adds to which series: host-free, so that the whole mapping from a
//! request's observations to metric names and values is unit-tested natively. The filter gathers
//! an [`Observation`] in `on_log` and passes host callbacks to define and update metrics.

use crate::config::{Config, OTHER};
use crate::labels::{model_label, signal_label, status_class};
use crate::series::{
    Kind, SeriesCache, AUTH, DURATION, LLM_COST, LLM_REQUESTS, LLM_TOKENS, RATE_LIMIT, REQUESTS,
    REQUEST_BYTES, RESPONSE_BYTES,
};

/// The cost filter's signals for the request (`tollgate_common::signals::COST_*`), raw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostSignals<'a> {
    /// Model name as published (mapped to a configured model or `other`).
    pub model: Option<&'a str>,
    /// Tenant label (already capped by the tenant registry).
    pub tenant: &'a str,
    /// Input tokens (count).
    pub input_tokens: Option<u64>,
    /// Output tokens (count).
    pub output_tokens: Option<u64>,
    /// Price in nano-USD.
    pub cost_nano_usd: Option<u64>,
    /// `priced`, `unpriced` or `budget_exceeded`.
    pub status: Option<&'a str>,
}

/// What the filter observed about one request, at the end of its stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation<'a> {
    /// Method label (`crate::labels::method_label`).
    pub method: &'a str,
    /// Route label (`crate::labels::route_label`).
    pub route: &'a str,
    /// Tenant label (capped), when a tenant is configured.
    pub tenant: Option<&'a str>,
    /// Response status code (0: none).
    pub status: u64,
    /// Microseconds from the request headers to the end of the stream; `None` when the start
    /// was not seen.
    pub duration_us: Option<u64>,
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
    let class = status_class(obs.status);
    let tenant = obs.tenant.unwrap_or(OTHER);
    // The labels of `tollgate_requests_total`, in the fixed order, those configured.
    let candidates: [(&str, &str, bool); 4] = [
        ("method", obs.method, config.method),
        ("status_class", class, config.status_class),
        ("route", obs.route, config.route),
        (
            "tenant",
            tenant,
            config.tenant_label && obs.tenant.is_some(),
        ),
    ];
    let mut labels: [(&str, &str); 4] = [("", ""); 4];
    let mut n = 0usize;
    for (name, value, on) in candidates {
        if let (true, Some(slot)) = (on, labels.get_mut(n)) {
            *slot = (name, value);
            n = n.saturating_add(1);
        }
    }
    let used = labels.get(..n).unwrap_or(&[]);
    let mut counter = |family: &str, labels: &[(&str, &str)], value: u64| {
        if value > 0 {
            let id = cache.id(Kind::Counter, family, labels, &mut *define);
            emit(id, Kind::Counter, value);
        }
    };
    counter(REQUESTS, used, 1);
    let route = [("route", obs.route)];
    counter(REQUEST_BYTES, &route, obs.request_bytes);
    counter(RESPONSE_BYTES, &route, obs.response_bytes);
    if let Some(result) = obs.auth_result {
        counter(AUTH, &[("result", &signal_label(result))], 1);
    }
    if let Some((rule, decision)) = obs.rate_limit {
        counter(
            RATE_LIMIT,
            &[
                ("rule", &signal_label(rule)),
                ("decision", &signal_label(decision)),
            ],
            1,
        );
    }
    if let Some(cost) = &obs.cost {
        let model = cost.model.map_or(OTHER, |m| model_label(&config.models, m));
        if let Some(status) = cost.status {
            counter(LLM_REQUESTS, &[("status", &signal_label(status))], 1);
        }
        counter(
            LLM_TOKENS,
            &[("model", model), ("type", "input")],
            cost.input_tokens.unwrap_or(0),
        );
        counter(
            LLM_TOKENS,
            &[("model", model), ("type", "output")],
            cost.output_tokens.unwrap_or(0),
        );
        counter(
            LLM_COST,
            &[("model", model), ("tenant", cost.tenant)],
            cost.cost_nano_usd.unwrap_or(0),
        );
    }
    if let Some(us) = obs.duration_us {
        let id = cache.id(Kind::Histogram, DURATION, &route, &mut *define);
        emit(id, Kind::Histogram, us);
    }
}
