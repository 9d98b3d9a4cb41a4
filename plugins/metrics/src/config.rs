//! The metrics plugin configuration: JSON, parsed strictly. An unknown field, a wrong type or an
//! impossible value refuses the whole configuration with an error naming the field
//! (`on_configure` then returns false and Envoy refuses the filter).
//!
//! ```json
//! {
//!   "routes": [{"name": "chat", "prefix": "/v1/chat"}, {"name": "models", "prefix": "/v1/models"}],
//!   "tenant": {"header": "x-jwt-sub", "max_tenants": 100, "registry": "default",
//!              "max_age_seconds": 3600},
//!   "labels": ["method", "status_class", "route", "tenant"],
//!   "models": ["gpt-4o", "gpt-4o-mini"],
//!   "paths": {"escaped_slashes": "reject", "path_parameters": "reject"},
//!   "flush_interval_ms": 1000
//! }
//! ```
//!
//! - `routes`: a route label per path prefix (segment-aware, compared to the request's path in
//!   normal form, `tollgate_common::path`), first match wins; unmatched requests and paths that
//!   cannot be normalised get `other`. Names are 1 to 32 of `[a-z0-9_-]`, unique, not `other`.
//!   At most [`MAX_ROUTES`].
//! - `tenant` (optional): the tenant label is the value jwt-auth verified and wrote into claim
//!   header `header` on this request (`tollgate_common::identity`); a request jwt-auth did not
//!   verify gets `unauthenticated`, a verified one without the claim `none`. `unverified_header`
//!   instead of `header` trusts the header as sent (only for a header a proxy in front sets).
//!   At most `max_tenants` distinct values for the whole gateway (all workers) per
//!   `max_age_seconds`, later values get `other` (see [`crate::tenants`]). `registry` names the
//!   shared-data namespace of the cap (configurations with the same registry share it). Without
//!   `tenant` there is no tenant label.
//! - `labels`: the labels of `tollgate_requests_total`, a subset of
//!   `method`, `status_class`, `route`, `tenant` (default: all; `tenant` needs `tenant`).
//! - `models`: the model label values of the cost metrics; any other model is `other`.
//!   At most [`MAX_MODELS`].
//! - `flush_interval_ms`: how often each worker's VM hands the counters it holds to the host
//!   (milliseconds, default [`DEFAULT_FLUSH_INTERVAL_MS`], at most [`MAX_FLUSH_INTERVAL_MS`]);
//!   a scrape sees a counter at most this late (`crate::pending`). `0` hands each request's
//!   counts over at its end (about ten host calls a request more).
//!
//! Histogram buckets are not plugin configuration: the ABI carries no bucket boundaries, Envoy
//! takes them from `stats_config.histogram_bucket_settings` (see the README).

use std::collections::HashSet;

use serde::Deserialize;
use tollgate_common::config::ConfigError;
use tollgate_common::identity::IdentitySource;
use tollgate_common::path::{is_normal, PathPolicy};

/// Most configured routes.
pub const MAX_ROUTES: usize = 64;
/// Most configured models.
pub const MAX_MODELS: usize = 256;
/// Largest `tenant.max_tenants`.
pub const MAX_TENANTS: u32 = 10_000;
/// Default `tenant.max_age_seconds`.
pub const DEFAULT_MAX_AGE_SECONDS: u64 = 3_600;
/// Bounds of `tenant.max_age_seconds` (one minute to 30 days).
pub const MAX_AGE_SECONDS: std::ops::RangeInclusive<u64> = 60..=2_592_000;
/// Default `flush_interval_ms`.
pub const DEFAULT_FLUSH_INTERVAL_MS: u32 = 1_000;
/// Largest `flush_interval_ms` (one minute).
pub const MAX_FLUSH_INTERVAL_MS: u32 = 60_000;
/// Longest route name and registry name (bytes).
pub const MAX_NAME_BYTES: usize = 32;
/// Longest model name (bytes).
pub const MAX_MODEL_BYTES: usize = 64;
/// The label value of everything beyond a cap or outside the configured set.
pub const OTHER: &str = "other";
/// The tenant label value of a request without the tenant header.
pub const NONE: &str = "none";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    tenant: Option<RawTenant>,
    #[serde(default)]
    labels: Option<Vec<RequestLabel>>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    paths: PathPolicy,
    #[serde(default = "default_flush_interval")]
    flush_interval_ms: u32,
}

fn default_flush_interval() -> u32 {
    DEFAULT_FLUSH_INTERVAL_MS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: String,
    prefix: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    unverified_header: Option<String>,
    max_tenants: u32,
    #[serde(default = "default_registry")]
    registry: String,
    #[serde(default = "default_max_age")]
    max_age_seconds: u64,
}

fn default_max_age() -> u64 {
    DEFAULT_MAX_AGE_SECONDS
}

fn default_registry() -> String {
    "default".to_string()
}

/// A label of `tollgate_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestLabel {
    /// The request method, from a fixed set (see [`crate::labels::method_label`]).
    Method,
    /// `1xx` .. `5xx`, or `none` when no response was sent.
    StatusClass,
    /// The configured route name, or `other`.
    Route,
    /// The verified tenant (capped), `unauthenticated`, `none` or `other`.
    Tenant,
}

/// A route: requests whose normal path has the (segment-aware) `prefix` get the label `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Label value.
    pub name: String,
    /// Path prefix (starts with `/`).
    pub prefix: String,
}

/// Where the tenant label comes from and its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The verified claim header (or the header trusted as sent).
    pub source: IdentitySource,
    /// Most distinct tenant values for the whole gateway, per generation.
    pub max_tenants: u32,
    /// Length of a generation of the registry: entries age out after it (seconds).
    pub max_age_seconds: u64,
    /// Shared-data key prefix of the registry: `tollgate.metrics/<registry>/`.
    pub key_prefix: String,
}

/// The compiled configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Routes in order (first match).
    pub routes: Vec<Route>,
    /// The tenant label, if configured.
    pub tenant: Option<Tenant>,
    /// Which labels `tollgate_requests_total` carries (in the fixed order method, status_class,
    /// route, tenant).
    pub method: bool,
    /// See [`Config::method`].
    pub status_class: bool,
    /// See [`Config::method`].
    pub route: bool,
    /// See [`Config::method`]; only with `tenant`.
    pub tenant_label: bool,
    /// Configured model names (label values after sanitising; others are `other`).
    pub models: Vec<String>,
    /// How request paths are normalised before the routes see them.
    pub paths: PathPolicy,
    /// Milliseconds between flushes of the counters held in the VM (`crate::pending`); 0:
    /// each request's counters go to the host at its end.
    pub flush_interval_ms: u32,
}

impl Config {
    /// Parses and checks a JSON plugin configuration; errors name the field.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = tollgate_common::config::parse_json(bytes)?;
        compile(raw)
    }
}

/// Route and registry names: 1 to 32 bytes of `[a-z0-9_-]`, so that they are label values as
/// written (the name encoding would otherwise rewrite them) and cannot contain the encoding's `.`.
fn check_name(name: &str, field: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{name:?} must be 1 to {MAX_NAME_BYTES} characters of a-z 0-9 _ -"),
        ))
    }
}

fn compile(raw: RawConfig) -> Result<Config, ConfigError> {
    if raw.routes.len() > MAX_ROUTES {
        return Err(ConfigError::new(
            "routes",
            format!("at most {MAX_ROUTES} routes"),
        ));
    }
    let mut names = HashSet::new();
    let mut routes = Vec::with_capacity(raw.routes.len());
    for (i, r) in raw.routes.into_iter().enumerate() {
        check_name(&r.name, &format!("routes[{i}].name"))?;
        if r.name == OTHER {
            return Err(ConfigError::new(
                format!("routes[{i}].name"),
                "`other` is the label of unmatched requests",
            ));
        }
        if !names.insert(r.name.clone()) {
            return Err(ConfigError::new(
                format!("routes[{i}].name"),
                format!("two routes are named {:?}", r.name),
            ));
        }
        if !is_normal(&r.prefix, &raw.paths) {
            return Err(ConfigError::new(
                format!("routes[{i}].prefix"),
                "must be a path in normal form starting with `/` (no query, `//`, dot segments \
                 or escapes of unreserved characters)",
            ));
        }
        routes.push(Route {
            name: r.name,
            prefix: r.prefix,
        });
    }
    let tenant = match raw.tenant {
        None => None,
        Some(t) => {
            let source = IdentitySource::from_config(
                t.header.as_deref(),
                t.unverified_header.as_deref(),
                "tenant",
            )?;
            if !MAX_AGE_SECONDS.contains(&t.max_age_seconds) {
                return Err(ConfigError::new(
                    "tenant.max_age_seconds",
                    format!(
                        "must be between {} and {}",
                        MAX_AGE_SECONDS.start(),
                        MAX_AGE_SECONDS.end()
                    ),
                ));
            }
            if t.max_tenants == 0 || t.max_tenants > MAX_TENANTS {
                return Err(ConfigError::new(
                    "tenant.max_tenants",
                    format!("must be between 1 and {MAX_TENANTS}"),
                ));
            }
            check_name(&t.registry, "tenant.registry")?;
            Some(Tenant {
                source,
                max_tenants: t.max_tenants,
                max_age_seconds: t.max_age_seconds,
                key_prefix: format!("tollgate.metrics/{}/", t.registry),
            })
        }
    };
    let labels = raw.labels.unwrap_or_else(|| {
        let mut all = vec![
            RequestLabel::Method,
            RequestLabel::StatusClass,
            RequestLabel::Route,
        ];
        if tenant.is_some() {
            all.push(RequestLabel::Tenant);
        }
        all
    });
    let mut seen = HashSet::new();
    for (i, l) in labels.iter().enumerate() {
        if !seen.insert(*l) {
            return Err(ConfigError::new(format!("labels[{i}]"), "listed twice"));
        }
        if *l == RequestLabel::Tenant && tenant.is_none() {
            return Err(ConfigError::new(
                format!("labels[{i}]"),
                "the tenant label needs `tenant` (its header and cap)",
            ));
        }
    }
    if raw.flush_interval_ms > MAX_FLUSH_INTERVAL_MS {
        return Err(ConfigError::new(
            "flush_interval_ms",
            format!("must be between 0 and {MAX_FLUSH_INTERVAL_MS}"),
        ));
    }
    if raw.models.len() > MAX_MODELS {
        return Err(ConfigError::new(
            "models",
            format!("at most {MAX_MODELS} models"),
        ));
    }
    let mut models: Vec<String> = Vec::with_capacity(raw.models.len());
    for (i, m) in raw.models.iter().enumerate() {
        if m.is_empty() || m.len() > MAX_MODEL_BYTES {
            return Err(ConfigError::new(
                format!("models[{i}]"),
                format!("must be 1 to {MAX_MODEL_BYTES} bytes"),
            ));
        }
        let label = tollgate_common::metrics::sanitize(m).into_owned();
        if label == OTHER || models.contains(&label) {
            return Err(ConfigError::new(
                format!("models[{i}]"),
                format!("{m:?} gives the label {label:?}, which is `other` or another model's"),
            ));
        }
        models.push(label);
    }
    Ok(Config {
        routes,
        method: labels.contains(&RequestLabel::Method),
        status_class: labels.contains(&RequestLabel::StatusClass),
        route: labels.contains(&RequestLabel::Route),
        tenant_label: labels.contains(&RequestLabel::Tenant),
        tenant,
        models,
        paths: raw.paths,
        flush_interval_ms: raw.flush_interval_ms,
    })
}
