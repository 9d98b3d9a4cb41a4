//! The rate-limit plugin configuration: JSON, parsed strictly. An unknown field, a wrong type or
//! an impossible value refuses the whole configuration with an error naming the field.
//!
//! ```json
//! {
//!   "namespace": "default",
//!   "rules": [
//!     {
//!       "name": "per-user",
//!       "match": {"prefix": "/api", "methods": ["GET", "POST"], "hosts": ["api.example.com"]},
//!       "key": [{"header": "x-jwt-sub"}, {"client_address": {"trusted_hops": 0}}, "path", "method", "host"],
//!       "limits": [
//!         {"algorithm": "token_bucket", "capacity": 20, "requests": 10, "per": "second"},
//!         {"name": "daily", "algorithm": "fixed_window", "requests": 1000, "per": "day"}
//!       ],
//!       "missing_key": "deny",
//!       "weight_header": "x-cost-units",
//!       "max_weight": 20
//!     }
//!   ],
//!   "status": 429,
//!   "headers_on_allowed": true,
//!   "cas_retries": 8,
//!   "on_contention": "allow",
//!   "max_keys": 100000,
//!   "store_full": {"action": "deny", "status": 503},
//!   "global": {"service": "ratelimit", "domain": "tollgate", "timeout_ms": 50, "on_error": "local"}
//! }
//! ```
//!
//! `global` (here or per rule; a rule's `"global": false` keeps it local) sends the rule's fixed
//! windows to Envoy's rate limit service (`tollgate_common::rls`, `crate::global`); token-bucket
//! rules stay local.
//!
//! See the crate README for the meaning of each field.

use std::collections::HashSet;

use serde::Deserialize;
use tollgate_common::config::{header_name, ConfigError};
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::identity::IdentitySource;
use tollgate_common::path::PathPolicy;
use tollgate_common::rls::{GlobalConfig, GlobalSpec};
use tollgate_common::route::RouteMatch;
use tollgate_common::shared_data::StoreFull;

use crate::algorithm::{Algorithm, Limit, Period, MAX_UNITS};
use crate::headers::policy_item;
use crate::key::{
    key_prefix, rule_record_key, shared_key, KeyPart, RequestView, DEFAULT_IPV6_PREFIX,
    MISSING_BUCKET, OVERFLOW_BUCKET,
};
use crate::limiter::{OnContention, OnStoreFull};

/// Default namespace.
pub const DEFAULT_ZONE: &str = "default";
/// Default status of a refused request (RFC 6585 section 4).
pub const DEFAULT_STATUS: u32 = 429;
/// Default CAS retries per CAS loop (after the first attempt).
pub const DEFAULT_CAS_RETRIES: u32 = 8;
/// Largest `cas_retries`.
pub const MAX_CAS_RETRIES: u32 = 64;
/// Default bound on the client keys of a rule.
pub const DEFAULT_MAX_KEYS: u64 = 100_000;
/// Largest `max_keys`.
pub const MAX_MAX_KEYS: u64 = 100_000_000;
/// Longest namespace, rule and limit name (bytes).
pub const MAX_NAME_BYTES: usize = 32;
/// Most limits in a rule.
pub const MAX_LIMITS_PER_RULE: usize = 16;
/// Most trusted proxy hops for X-Forwarded-For.
pub const MAX_TRUSTED_HOPS: u8 = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    /// `zone` before 2026-11-28 (still read: "zone" also names nginx's shared-memory zones).
    #[serde(default = "default_namespace", alias = "zone")]
    namespace: String,
    rules: Vec<RawRule>,
    #[serde(default = "default_status")]
    status: u32,
    #[serde(default = "default_true")]
    headers_on_allowed: bool,
    #[serde(default = "default_cas_retries")]
    cas_retries: u32,
    #[serde(default)]
    on_contention: RawContention,
    #[serde(default = "default_max_keys")]
    max_keys: u64,
    #[serde(default)]
    store_full: StoreFull<StoreFullAction>,
    #[serde(default)]
    paths: PathPolicy,
    #[serde(default)]
    global: Option<GlobalSpec>,
    #[serde(default)]
    allow_eviction: bool,
    #[serde(default)]
    error_format: ErrorFormat,
}

/// What a request gets when the state of one of its limits cannot be read or stored (a store
/// error, or a new key refused by a full nginx zone with `eviction=none`).
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StoreFullAction {
    /// Refused with `store_full.status` (default): a limit that cannot be kept is not lifted.
    #[default]
    Deny,
    /// A client whose new key is refused is charged in the rule limit's overflow bucket, shared
    /// with every such client; other store errors are refused as with `deny`.
    Overflow,
    /// Admitted uncharged (fail-open, an explicit choice).
    Allow,
}

impl StoreFullAction {
    /// Where the limiter sends a client whose new key is refused.
    pub fn limiter(self) -> OnStoreFull {
        match self {
            StoreFullAction::Overflow => OnStoreFull::Overflow,
            StoreFullAction::Deny | StoreFullAction::Allow => OnStoreFull::Deny,
        }
    }
}

fn default_namespace() -> String {
    DEFAULT_ZONE.to_string()
}
fn default_status() -> u32 {
    DEFAULT_STATUS
}
fn default_true() -> bool {
    true
}
fn default_cas_retries() -> u32 {
    DEFAULT_CAS_RETRIES
}
fn default_max_keys() -> u64 {
    DEFAULT_MAX_KEYS
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawContention {
    #[default]
    Allow,
    Deny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    #[serde(rename = "match", default)]
    route: RouteMatch,
    #[serde(default)]
    key: Vec<RawKeyPart>,
    limits: Vec<RawLimit>,
    #[serde(default)]
    missing_key: MissingKey,
    #[serde(default)]
    weight_header: Option<String>,
    #[serde(default)]
    max_weight: Option<u64>,
    #[serde(default)]
    max_keys: Option<u64>,
    /// A `global` block, or `false` to keep the rule local under a filter-level block.
    #[serde(default)]
    global: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawKeyPart {
    Header(String),
    UnverifiedHeader(String),
    ApiKeyHeader(String),
    ClientAddress(RawClientAddress),
    Path,
    Method,
    Host,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientAddress {
    #[serde(default)]
    trusted_hops: u8,
    #[serde(default = "default_ipv6_prefix")]
    ipv6_prefix: u8,
}

fn default_ipv6_prefix() -> u8 {
    DEFAULT_IPV6_PREFIX
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    algorithm: RawAlgorithm,
    requests: u64,
    per: RawPeriod,
    #[serde(default)]
    capacity: Option<u64>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum RawAlgorithm {
    #[default]
    TokenBucket,
    FixedWindow,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawPeriod {
    Second,
    Minute,
    Hour,
    Day,
}

/// What happens to a request that lacks a part of its rule's key.
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MissingKey {
    /// Refused with the configured status (default).
    #[default]
    Deny,
    /// Not limited.
    Allow,
    /// Limited in one bucket shared by every request of the rule that lacks its key.
    Shared,
}

/// One limit of a rule, with its shared-data keys.
#[derive(Debug, Clone)]
pub struct RuleLimit {
    /// Policy name (RateLimit headers): the `name`, else the rule name for a rule's only limit,
    /// else `<rule>-<index>`.
    pub name: String,
    /// Algorithm and parameters.
    pub limit: Limit,
    /// `ratelimit/<namespace>/<rule>/<index>/`.
    pub key_prefix: String,
    /// The bucket of new clients once the rule's key space is full (`max_keys`).
    pub overflow_key: String,
    /// The bucket of requests without a key (`missing_key: shared`).
    pub missing_key: String,
    /// Global mode: the value of the descriptor's `rule` entry (see `crate::global`).
    pub descriptor_rule: String,
}

/// A rule: the first whose match fits a request limits it.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Name (metrics label, shared-data keys, default policy name).
    pub name: String,
    /// Which requests.
    pub route: RouteMatch,
    /// The client key parts; empty: one bucket for the rule.
    pub key: Vec<KeyPart>,
    /// All must admit a request.
    pub limits: Vec<RuleLimit>,
    /// Requests without their key.
    pub missing_key: MissingKey,
    /// Header carrying the request's cost in units (lower case); absent header: 1 unit.
    pub weight_header: Option<String>,
    /// Largest accepted weight (units); at most the smallest limit capacity.
    pub max_weight: u64,
    /// The RateLimit-Policy value of the rule.
    pub policy_header: String,
    /// `ratelimit/<namespace>/<rule>/~zone` (the suffix kept from before the rename): the count of the rule's client keys and their creation
    /// lock.
    pub record_key: String,
    /// Largest number of client keys of the rule (each limit's key counts); beyond it new
    /// clients share the limit's overflow bucket.
    pub max_keys: u64,
    /// Global mode: the rate limit service that decides for this rule (its limits are all fixed
    /// windows); `None`: local.
    pub global: Option<GlobalConfig>,
}

impl Rule {
    /// Whether the request matches, reading only what the match needs.
    pub fn matches(&self, req: &impl RequestView) -> bool {
        let path = if self.route.needs_path() {
            match req
                .path()
                .and_then(|p| tollgate_common::bytes::utf8(p).ok())
            {
                Some(path) => path,
                None => return false,
            }
        } else {
            "/"
        };
        let method = if self.route.methods.is_empty() {
            ""
        } else {
            match req
                .method()
                .and_then(|m| tollgate_common::bytes::utf8(m).ok())
            {
                Some(m) => m,
                None => return false,
            }
        };
        let host = if self.route.hosts.is_empty() {
            ""
        } else {
            match req.host() {
                Some(h) => h,
                None => return false,
            }
        };
        self.route.matches(path, method, host)
    }

    /// The request's weight (units) from the weight header's value: 1 when the header is not
    /// configured or absent; else decimal digits (optional whitespace trimmed) in
    /// `1..=max_weight`. `None` when invalid: the request is refused with 400.
    pub fn weight(&self, value: Option<&[u8]>) -> Option<u64> {
        let Some(value) = value else {
            return Some(1);
        };
        let text = tollgate_common::bytes::utf8(value)
            .ok()?
            .trim_matches([' ', '\t']);
        if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let weight: u64 = text.parse().ok()?;
        (1..=self.max_weight).contains(&weight).then_some(weight)
    }
}

/// The compiled configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The namespace of the shared-data keys; configurations with the same namespace and rule
    /// names share their counters.
    pub namespace: String,
    /// Rules in order.
    pub rules: Vec<Rule>,
    /// Status of a refused request.
    pub status: u32,
    /// Send RateLimit-Policy and RateLimit on allowed responses too.
    pub headers_on_allowed: bool,
    /// CAS retries after the first attempt, per CAS loop.
    pub cas_retries: u32,
    /// What a request gets when the retries run out.
    pub on_contention: OnContention,
    /// The default of `rules[].max_keys`.
    pub max_keys: u64,
    /// What a request gets when its state cannot be read or stored.
    pub store_full: StoreFull<StoreFullAction>,
    /// How request paths are normalised before rules and keys see them.
    pub paths: PathPolicy,
    /// Whether a rule or a key reads the path: then every request's path is normalised first
    /// (and refused with 400 when it cannot be).
    pub needs_path: bool,
    /// Whether a rule or a key reads the host: then every request's authority is put in
    /// canonical form first (`tollgate_common::authority`; refused with 400 when it cannot be).
    pub needs_host: bool,
    /// The identity the rules' keys read first (the first rule's with one), read with the
    /// path in one host call where the host offers it (`crate::request_view`).
    pub first_identity: Option<IdentitySource>,
    /// Load on a shared-data zone that evicts keys (`tollgate_common::eviction`); off: refuse.
    pub allow_eviction: bool,
    /// The envelope of this filter's refusals (`error_format`: `auto`, the request's API;
    /// `openai`, `anthropic` or `tollgate`), `tollgate_common::error_envelope`.
    pub error_format: ErrorFormat,
}

impl Config {
    /// Parses and checks a JSON plugin configuration; errors name the field.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = tollgate_common::config::parse_json(bytes)?;
        compile(raw)
    }
}

fn compile(raw: RawConfig) -> Result<Config, ConfigError> {
    check_name(&raw.namespace, "namespace")?;
    if raw.rules.is_empty() {
        return Err(ConfigError::new("rules", "at least one rule is required"));
    }
    if !(400..=599).contains(&raw.status) {
        return Err(ConfigError::new(
            "status",
            "must be a 4xx or 5xx status code",
        ));
    }
    if raw.cas_retries > MAX_CAS_RETRIES {
        return Err(ConfigError::new(
            "cas_retries",
            format!("must be at most {MAX_CAS_RETRIES}"),
        ));
    }
    check_max_keys(raw.max_keys, "max_keys")?;
    let store_full = raw.store_full.checked()?;
    let global = raw.global.map(|g| g.check("global")).transpose()?;
    let mut names = HashSet::new();
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.into_iter().enumerate() {
        let field = format!("rules[{i}]");
        check_name(&r.name, &format!("{field}.name"))?;
        if !names.insert(r.name.clone()) {
            return Err(ConfigError::new(
                format!("{field}.name"),
                format!("two rules are named {:?}", r.name),
            ));
        }
        rules.push(compile_rule(
            &raw.namespace,
            raw.max_keys,
            r,
            &field,
            &raw.paths,
            global.as_ref(),
        )?);
    }
    let needs_path = rules
        .iter()
        .any(|r| r.route.needs_path() || r.key.contains(&KeyPart::Path));
    let needs_host = rules
        .iter()
        .any(|r| !r.route.hosts.is_empty() || r.key.contains(&KeyPart::Host));
    let first_identity = rules
        .iter()
        .flat_map(|r| r.key.iter())
        .find_map(|part| match part {
            KeyPart::Identity(source) => Some(source.clone()),
            _ => None,
        });
    Ok(Config {
        paths: raw.paths,
        needs_path,
        needs_host,
        first_identity,
        allow_eviction: raw.allow_eviction,
        error_format: raw.error_format,
        namespace: raw.namespace,
        rules,
        status: raw.status,
        headers_on_allowed: raw.headers_on_allowed,
        cas_retries: raw.cas_retries,
        on_contention: match raw.on_contention {
            RawContention::Allow => OnContention::Allow,
            RawContention::Deny => OnContention::Deny,
        },
        max_keys: raw.max_keys,
        store_full,
    })
}

fn check_max_keys(n: u64, field: &str) -> Result<u64, ConfigError> {
    if n == 0 || n > MAX_MAX_KEYS {
        return Err(ConfigError::new(
            field,
            format!("must be between 1 and {MAX_MAX_KEYS}"),
        ));
    }
    Ok(n)
}

/// A rule's global block: its own (`rules[i].global`), `false` for none, else the filter's.
fn rule_global(
    own: Option<serde_json::Value>,
    filter: Option<&GlobalConfig>,
    field: &str,
) -> Result<Option<GlobalConfig>, ConfigError> {
    let field = format!("{field}.global");
    match own {
        None => Ok(filter.cloned()),
        Some(serde_json::Value::Bool(false)) => Ok(None),
        Some(value @ serde_json::Value::Object(_)) => {
            let spec: GlobalSpec = serde_path_to_error::deserialize(value).map_err(|e| {
                let path = e.path().to_string();
                let at = if path.is_empty() || path == "." {
                    field.clone()
                } else {
                    format!("{field}.{path}")
                };
                ConfigError::new(at, e.into_inner().to_string())
            })?;
            spec.check(&field).map(Some)
        }
        Some(_) => Err(ConfigError::new(
            field,
            "must be a global block ({\"service\": ..., \"domain\": ...}) or false (local under a filter-level block)",
        )),
    }
}

fn compile_rule(
    namespace: &str,
    default_max_keys: u64,
    r: RawRule,
    field: &str,
    paths: &PathPolicy,
    filter_global: Option<&GlobalConfig>,
) -> Result<Rule, ConfigError> {
    let global = rule_global(r.global, filter_global, field)?;
    let max_keys = check_max_keys(
        r.max_keys.unwrap_or(default_max_keys),
        &format!("{field}.max_keys"),
    )?;
    let mut route = r.route;
    route.validate(&format!("{field}.match"), paths)?;
    let mut key = Vec::with_capacity(r.key.len());
    for (j, part) in r.key.into_iter().enumerate() {
        let f = format!("{field}.key[{j}]");
        key.push(match part {
            RawKeyPart::Header(name) => {
                KeyPart::Identity(IdentitySource::from_config(Some(&name), None, &f)?)
            }
            RawKeyPart::UnverifiedHeader(name) => {
                KeyPart::Identity(IdentitySource::from_config(None, Some(&name), &f)?)
            }
            RawKeyPart::ApiKeyHeader(name) => KeyPart::Identity(IdentitySource::credential(
                &header_name(&name, &format!("{f}.api_key_header"))?,
            )),
            RawKeyPart::ClientAddress(c) => {
                if c.trusted_hops > MAX_TRUSTED_HOPS {
                    return Err(ConfigError::new(
                        format!("{f}.client_address.trusted_hops"),
                        format!("must be at most {MAX_TRUSTED_HOPS}"),
                    ));
                }
                if c.ipv6_prefix == 0 || c.ipv6_prefix > 128 {
                    return Err(ConfigError::new(
                        format!("{f}.client_address.ipv6_prefix"),
                        "must be between 1 and 128",
                    ));
                }
                KeyPart::ClientAddress {
                    trusted_hops: c.trusted_hops,
                    ipv6_prefix: c.ipv6_prefix,
                }
            }
            RawKeyPart::Path => KeyPart::Path,
            RawKeyPart::Method => KeyPart::Method,
            RawKeyPart::Host => KeyPart::Host,
        });
    }
    if r.limits.is_empty() || r.limits.len() > MAX_LIMITS_PER_RULE {
        return Err(ConfigError::new(
            format!("{field}.limits"),
            format!("a rule needs between 1 and {MAX_LIMITS_PER_RULE} limits"),
        ));
    }
    let single = r.limits.len() == 1;
    let mut limits: Vec<RuleLimit> = Vec::with_capacity(r.limits.len());
    for (j, l) in r.limits.into_iter().enumerate() {
        let f = format!("{field}.limits[{j}]");
        let limit = compile_limit(&l, &f)?;
        let name = match l.name {
            Some(n) => {
                check_name(&n, &format!("{f}.name"))?;
                n
            }
            None if single => r.name.clone(),
            None => format!("{}-{j}", r.name),
        };
        if limits.iter().any(|other| other.name == name) {
            return Err(ConfigError::new(
                format!("{f}.name"),
                format!("two limits of the rule are named {name:?}"),
            ));
        }
        if global.is_some() && limit.algorithm() == Algorithm::TokenBucket {
            return Err(ConfigError::new(
                format!("{f}.algorithm"),
                "a global rule's limits must be fixed_window: the rate limit service counts fixed windows; token-bucket rules stay local (`\"global\": false` on this rule keeps it local)",
            ));
        }
        let prefix = key_prefix(namespace, &r.name, j);
        limits.push(RuleLimit {
            descriptor_rule: descriptor_rule(namespace, &r.name, j),
            overflow_key: shared_key(&prefix, OVERFLOW_BUCKET),
            missing_key: shared_key(&prefix, MISSING_BUCKET),
            key_prefix: prefix,
            name,
            limit,
        });
    }
    let smallest = limits.iter().map(|l| l.limit.capacity()).min().unwrap_or(1);
    let weight_header = match r.weight_header {
        Some(h) => Some(header_name(&h, &format!("{field}.weight_header"))?),
        None => None,
    };
    let max_weight = match (r.max_weight, &weight_header) {
        (Some(_), None) => {
            return Err(ConfigError::new(
                format!("{field}.max_weight"),
                "needs `weight_header`",
            ))
        }
        (Some(w), Some(_)) if w == 0 || w > smallest => {
            return Err(ConfigError::new(
                format!("{field}.max_weight"),
                format!("must be between 1 and the smallest limit capacity ({smallest}), so that every accepted weight can pass"),
            ))
        }
        (Some(w), Some(_)) => w,
        (None, _) => smallest,
    };
    let policy_header = limits
        .iter()
        .map(|l| policy_item(&l.name, &l.limit))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Rule {
        record_key: rule_record_key(namespace, &r.name),
        max_keys,
        name: r.name,
        route,
        key,
        limits,
        missing_key: r.missing_key,
        weight_header,
        max_weight,
        policy_header,
        global,
    })
}

fn compile_limit(l: &RawLimit, f: &str) -> Result<Limit, ConfigError> {
    let period = match l.per {
        RawPeriod::Second => Period::Second,
        RawPeriod::Minute => Period::Minute,
        RawPeriod::Hour => Period::Hour,
        RawPeriod::Day => Period::Day,
    };
    let units = |n: u64, name: &str| {
        if n == 0 || n > MAX_UNITS {
            Err(ConfigError::new(
                format!("{f}.{name}"),
                format!("must be between 1 and {MAX_UNITS}"),
            ))
        } else {
            Ok(n)
        }
    };
    let requests = units(l.requests, "requests")?;
    let limit = match l.algorithm {
        RawAlgorithm::TokenBucket => {
            let capacity = units(l.capacity.unwrap_or(requests), "capacity")?;
            Limit::token_bucket(capacity, requests, period)
        }
        RawAlgorithm::FixedWindow => {
            if l.capacity.is_some() {
                return Err(ConfigError::new(
                    format!("{f}.capacity"),
                    "only a token_bucket has a capacity (a fixed window admits `requests` per window)",
                ));
            }
            Limit::fixed_window(requests, period)
        }
    };
    limit.ok_or_else(|| ConfigError::new(f, "invalid limit"))
}

/// KeySpace, rule and limit names: 1 to 32 bytes of `[A-Za-z0-9._-]` (they appear in shared-data
/// keys, metric names and RateLimit sf-strings).
fn check_name(name: &str, field: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{name:?} must be 1 to {MAX_NAME_BYTES} characters of A-Z a-z 0-9 . _ -"),
        ))
    }
}

/// The global mode's `rule` descriptor entry value (`crate::global`) of limit `index` of `rule`
/// in `namespace`: `<len>:<namespace>/<rule>/<index>`, `len` the byte length of what follows the
/// colon, so that no two (namespace, rule, index) triples give one value.
pub fn descriptor_rule(namespace: &str, rule: &str, index: usize) -> String {
    let body = format!("{namespace}/{rule}/{index}");
    format!("{}:{body}", body.len())
}
