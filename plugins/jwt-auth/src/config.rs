//! The jwt-auth plugin configuration: JSON, modelled on Envoy's `jwt_authn` filter
//! (providers and rules), parsed strictly: an unknown field, a bad key or an impossible value
//! refuses the whole configuration with an error naming the field.
//!
//! ```json
//! {
//!   "providers": {
//!     "main": {
//!       "issuer": "https://issuer.example",
//!       "audiences": ["api"],
//!       "remote_jwks": {"cluster": "jwks", "path": "/jwks.json", "cache_duration_seconds": 300},
//!       "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}]
//!     }
//!   },
//!   "rules": [
//!     {"match": {"prefix": "/healthz"}, "bypass": true},
//!     {"match": {"prefix": "/admin"}, "providers": ["main"], "audiences": ["admin"]}
//!   ],
//!   "paths": {"escaped_slashes": "reject", "path_parameters": "reject"}
//! }
//! ```
//!
//! Rules match the request's path in normal form (`tollgate_common::path`), prefixes segment by
//! segment (`tollgate_common::route`).

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use serde::Deserialize;
use tollgate_common::config::{header_name, ConfigError};
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::http::cgi_fold;
use tollgate_common::path::{normalize, PathError, PathPolicy, RequestPath};
use tollgate_common::remote::{RawRemote, RemoteDefaults, RemoteSource};
use tollgate_common::route::RouteMatch;
use tollgate_common::signals;

use crate::keys::{Alg, KeySet, VerifyingKey};
use crate::token::TokenLocation;

/// Default accepted clock skew for `exp`, `nbf` (seconds), as Envoy's `clock_skew_seconds`.
pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 60;
/// Default size of the per-VM verified-token cache (entries); 0 turns it off.
pub const DEFAULT_CACHE_ENTRIES: usize = 1024;
/// Default largest accepted token (bytes); longer tokens are refused before any decoding.
pub const DEFAULT_MAX_TOKEN_BYTES: usize = 8192;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    cache: RawCache,
    #[serde(default = "default_max_token_bytes")]
    max_token_bytes: usize,
    #[serde(default)]
    paths: PathPolicy,
    #[serde(default)]
    error_format: ErrorFormat,
}

fn default_max_token_bytes() -> usize {
    DEFAULT_MAX_TOKEN_BYTES
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    #[serde(default = "default_cache_entries")]
    max_entries: usize,
}

impl Default for RawCache {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_CACHE_ENTRIES,
        }
    }
}

fn default_cache_entries() -> usize {
    DEFAULT_CACHE_ENTRIES
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    issuer: Option<String>,
    #[serde(default)]
    audiences: Vec<String>,
    local_jwks: Option<serde_json::Value>,
    remote_jwks: Option<RawRemote>,
    #[serde(default)]
    pem_keys: Vec<RawPemKey>,
    #[serde(default)]
    hmac_secrets: Vec<RawHmacSecret>,
    #[serde(default)]
    from_headers: Vec<RawHeaderLocation>,
    #[serde(default)]
    from_params: Vec<String>,
    #[serde(default)]
    from_cookies: Vec<String>,
    #[serde(default)]
    forward: bool,
    forward_payload_header: Option<String>,
    #[serde(default)]
    claim_to_headers: Vec<RawClaimToHeader>,
    #[serde(default)]
    required_claims: Vec<String>,
    #[serde(default = "default_skew")]
    clock_skew_seconds: u64,
    max_lifetime_seconds: Option<u64>,
    #[serde(default)]
    require_expiration: bool,
}

fn default_skew() -> u64 {
    DEFAULT_CLOCK_SKEW_SECONDS
}

/// Defaults of `remote_jwks` (timeout 5 s, refreshed every 300 s, retried after 10 s, bodies up
/// to 1 MiB).
pub const REMOTE_JWKS_DEFAULTS: RemoteDefaults = RemoteDefaults {
    cache_duration_seconds: 300,
    retry_seconds: 10,
    timeout_ms: 5000,
    max_bytes: 1 << 20,
    max_bytes_limit: 1 << 24,
};

/// The shared-data namespace of remote JWKS records (`tollgate.jwt_auth/jwks/<cluster><path>`).
pub const JWKS_NAMESPACE: &str = "tollgate.jwt_auth/jwks";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPemKey {
    kid: Option<String>,
    alg: String,
    pem: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHmacSecret {
    kid: Option<String>,
    alg: String,
    secret: Option<String>,
    secret_base64: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderLocation {
    name: String,
    #[serde(default)]
    value_prefix: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClaimToHeader {
    claim: String,
    header: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "match", default)]
    route: RouteMatch,
    #[serde(default)]
    bypass: bool,
    providers: Option<Vec<String>>,
    #[serde(default)]
    audiences: Vec<String>,
}

/// Where a provider's keys come from.
pub enum KeySource {
    /// Keys fixed by the configuration (inline JWKS, PEM keys, HMAC secrets).
    Static(KeySet),
    /// A JWKS fetched with `dispatch_http_call`, shared by all VMs through shared data.
    Remote(RemoteSource),
}

/// A claim copied into a request header after successful verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimToHeader {
    /// Claim name; `a.b` walks into nested objects.
    pub claim: String,
    /// Header name (lower case).
    pub header: String,
    /// The property that carries the header's value to later filters on verified requests
    /// (`wasmx.tollgate.jwt_auth.header.<header>`, [`signals::verified_header`]).
    pub property: String,
}

/// One JWT issuer and how to check its tokens.
pub struct Provider {
    /// Name used in rules and logs.
    pub name: String,
    /// Expected `iss`; providers are chosen by it.
    pub issuer: Option<String>,
    /// Accepted audiences, any of (empty: `aud` not checked).
    pub audiences: HashSet<String>,
    /// Keys.
    pub keys: KeySource,
    /// Where to find the token.
    pub locations: Vec<TokenLocation>,
    /// Keep the token in the request forwarded upstream (default: strip it).
    pub forward: bool,
    /// Header carrying the verified payload (base64url, as in the token).
    pub forward_payload_header: Option<String>,
    /// Claims copied into headers.
    pub claim_to_headers: Vec<ClaimToHeader>,
    /// Claims that must be present (and not null).
    pub required_claims: Vec<String>,
    /// Accepted clock skew for `exp` and `nbf` (seconds).
    pub clock_skew_seconds: u64,
    /// Largest accepted `exp - iat` (or `exp - now` without `iat`), seconds.
    pub max_lifetime_seconds: Option<u64>,
    /// Refuse tokens without `exp`.
    pub require_expiration: bool,
}

/// What a rule does with the requests it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No authentication (e.g. `/healthz`).
    Bypass,
    /// A valid token of one of these providers (indices into [`Config::providers`]) is required;
    /// if `audiences` is not empty, the token must also carry one of them (else 403).
    Require {
        /// Allowed providers.
        providers: Vec<usize>,
        /// Audiences this route requires, any of.
        audiences: HashSet<String>,
        /// Union of the allowed providers' token locations, in order.
        locations: Vec<TokenLocation>,
    },
}

/// A rule: the first whose match fits a request decides.
pub struct Rule {
    /// Which requests.
    pub route: RouteMatch,
    /// What to do with them.
    pub action: Action,
}

/// The compiled configuration.
pub struct Config {
    /// Providers, by index.
    pub providers: Vec<Provider>,
    /// Rules in order; requests that match none need a token of any provider.
    pub rules: Vec<Rule>,
    /// The action for requests that match no rule.
    pub default_action: Action,
    /// Verified-token cache size (entries per VM); 0 is off.
    pub cache_entries: usize,
    /// Largest accepted token (bytes).
    pub max_token_bytes: usize,
    /// Every header the filter writes (claims, payload): removed from each request first.
    pub output_headers: Vec<String>,
    /// The [`tollgate_common::http::cgi_fold`] of each header the filter writes or removes
    /// (`output_headers`, and the token headers of providers that do not forward them) whose
    /// name has other spellings than its case (a `-`, `_` or `.`): the client's copies under
    /// those spellings are removed from every request the filter passes.
    pub cgi_folds: Vec<Vec<u8>>,
    /// Which pseudo-headers a request must be asked for: `:path` (rules or query-parameter
    /// tokens), `:method` and `:authority` (rules that match on them). Each is one host call.
    pub needs: RequestNeeds,
    /// How request paths are normalised before the rules see them.
    pub paths: PathPolicy,
    /// The envelope of this filter's refusals (`error_format`: `auto`, the request's API;
    /// `openai`, `anthropic` or `tollgate`), `tollgate_common::error_envelope`.
    pub error_format: ErrorFormat,
}

/// The request attributes the configuration looks at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestNeeds {
    /// `:path`, normalised (rules that match on the path).
    pub path: bool,
    /// The query of `:path` (query-parameter tokens).
    pub query: bool,
    /// `:method`.
    pub method: bool,
    /// `:authority`.
    pub host: bool,
}

impl Config {
    /// Parses and checks a JSON plugin configuration.
    ///
    /// Errors name the field: unknown fields, no providers, a provider with no keys or two key
    /// sources, bad keys (PEM, JWKS, short HMAC secrets, unknown `alg`), invalid header names,
    /// rules naming unknown providers.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = tollgate_common::config::parse_json(bytes)?;
        compile(raw)
    }

    /// The request target's path in normal form and its query, under [`Config::paths`].
    /// Errors: the target is refused (400).
    pub fn request_path<'a>(&self, target: &'a [u8]) -> Result<RequestPath<'a>, PathError> {
        normalize(target, &self.paths)
    }

    /// The action for a request with this normal `path` (see [`Config::request_path`]).
    pub fn action_for(&self, path: &str, method: &str, host: &str) -> &Action {
        self.rules
            .iter()
            .find(|r| r.route.matches(path, method, host))
            .map_or(&self.default_action, |r| &r.action)
    }
}

fn compile(raw: RawConfig) -> Result<Config, ConfigError> {
    if raw.providers.is_empty() {
        return Err(ConfigError::new(
            "providers",
            "at least one provider is required",
        ));
    }
    if raw.max_token_bytes < 64 {
        return Err(ConfigError::new("max_token_bytes", "must be at least 64"));
    }
    let mut providers = Vec::with_capacity(raw.providers.len());
    let mut issuers = HashSet::new();
    for (name, p) in raw.providers {
        let field = format!("providers.{name}");
        if let Some(iss) = &p.issuer {
            if !issuers.insert(iss.clone()) {
                return Err(ConfigError::new(
                    format!("{field}.issuer"),
                    "two providers have the same issuer",
                ));
            }
        }
        providers.push(compile_provider(name, p, &field)?);
    }
    let without_issuer = providers.iter().filter(|p| p.issuer.is_none()).count();
    if without_issuer > 1 {
        return Err(ConfigError::new(
            "providers",
            "at most one provider may omit `issuer` (providers are chosen by `iss`)",
        ));
    }
    let all: Vec<usize> = (0..providers.len()).collect();
    let default_action = require(&providers, all.clone(), HashSet::new());
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.into_iter().enumerate() {
        let field = format!("rules[{i}]");
        let mut route = r.route;
        route.validate(&format!("{field}.match"), &raw.paths)?;
        let action = if r.bypass {
            if r.providers.is_some() || !r.audiences.is_empty() {
                return Err(ConfigError::new(
                    format!("{field}.bypass"),
                    "a bypass rule takes no providers or audiences",
                ));
            }
            Action::Bypass
        } else {
            let ids = match r.providers {
                None => all.clone(),
                Some(names) if names.is_empty() => {
                    return Err(ConfigError::new(
                        format!("{field}.providers"),
                        "must name at least one provider (or use bypass)",
                    ))
                }
                Some(names) => {
                    let mut ids = Vec::new();
                    for (j, n) in names.iter().enumerate() {
                        let id = providers.iter().position(|p| &p.name == n).ok_or_else(|| {
                            ConfigError::new(
                                format!("{field}.providers[{j}]"),
                                format!("no provider named {n:?}"),
                            )
                        })?;
                        ids.push(id);
                    }
                    ids
                }
            };
            require(&providers, ids, r.audiences.into_iter().collect())
        };
        rules.push(Rule { route, action });
    }
    let mut output_headers: Vec<String> = Vec::new();
    for p in &providers {
        for h in p
            .claim_to_headers
            .iter()
            .map(|c| &c.header)
            .chain(p.forward_payload_header.iter())
        {
            if !output_headers.contains(h) {
                output_headers.push(h.clone());
            }
        }
    }
    let removed_tokens = providers.iter().filter(|p| !p.forward).flat_map(|p| {
        p.locations.iter().filter_map(|l| match l {
            TokenLocation::Header { name, .. } => Some(name),
            _ => None,
        })
    });
    let mut cgi_folds: Vec<Vec<u8>> = Vec::new();
    for name in output_headers.iter().chain(removed_tokens) {
        let folded = cgi_fold(name.as_bytes());
        if folded.contains(&b'-') && !cgi_folds.contains(&folded) {
            cgi_folds.push(folded);
        }
    }
    let needs = RequestNeeds {
        path: rules.iter().any(|r| r.route.needs_path()),
        query: providers.iter().any(|p| {
            p.locations
                .iter()
                .any(|l| matches!(l, TokenLocation::Param(_)))
        }),
        method: rules.iter().any(|r| !r.route.methods.is_empty()),
        host: rules.iter().any(|r| !r.route.hosts.is_empty()),
    };
    Ok(Config {
        needs,
        providers,
        rules,
        default_action,
        cache_entries: raw.cache.max_entries,
        max_token_bytes: raw.max_token_bytes,
        output_headers,
        cgi_folds,
        paths: raw.paths,
        error_format: raw.error_format,
    })
}

fn require(providers: &[Provider], ids: Vec<usize>, audiences: HashSet<String>) -> Action {
    let mut locations: Vec<TokenLocation> = Vec::new();
    for p in ids.iter().filter_map(|&i| providers.get(i)) {
        for l in &p.locations {
            if !locations.contains(l) {
                locations.push(l.clone());
            }
        }
    }
    Action::Require {
        providers: ids,
        audiences,
        locations,
    }
}

fn parse_alg(name: &str, field: &str) -> Result<Alg, ConfigError> {
    Alg::from_name(name)
        .ok_or_else(|| ConfigError::new(field, format!("unsupported algorithm {name:?}")))
}

fn compile_provider(name: String, p: RawProvider, field: &str) -> Result<Provider, ConfigError> {
    let has_static = p.local_jwks.is_some() || !p.pem_keys.is_empty() || !p.hmac_secrets.is_empty();
    if has_static == p.remote_jwks.is_some() {
        return Err(ConfigError::new(
            field,
            "keys are required: either `remote_jwks`, or any of `local_jwks`, `pem_keys`, `hmac_secrets`",
        ));
    }
    let keys = if let Some(r) = p.remote_jwks {
        KeySource::Remote(r.checked(&format!("{field}.remote_jwks"), REMOTE_JWKS_DEFAULTS)?)
    } else {
        let mut set = match p.local_jwks {
            Some(jwks) => {
                let text = match jwks {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                KeySet::from_jwks(&text, true)
                    .map_err(|e| ConfigError::new(format!("{field}.local_jwks"), e))?
                    .0
            }
            None => KeySet::new(),
        };
        for (i, k) in p.pem_keys.into_iter().enumerate() {
            let f = format!("{field}.pem_keys[{i}]");
            let alg = parse_alg(&k.alg, &format!("{f}.alg"))?;
            set.push(
                VerifyingKey::from_pem(alg, &k.pem, k.kid)
                    .map_err(|e| ConfigError::new(format!("{f}.pem"), e))?,
            );
        }
        for (i, s) in p.hmac_secrets.into_iter().enumerate() {
            let f = format!("{field}.hmac_secrets[{i}]");
            let alg = parse_alg(&s.alg, &format!("{f}.alg"))?;
            let secret = match (s.secret, s.secret_base64) {
                (Some(text), None) => text.into_bytes(),
                (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| {
                        ConfigError::new(format!("{f}.secret_base64"), format!("not base64: {e}"))
                    })?,
                _ => {
                    return Err(ConfigError::new(
                        f,
                        "exactly one of `secret` and `secret_base64` is required",
                    ))
                }
            };
            set.push(
                VerifyingKey::hmac(alg, &secret, s.kid)
                    .map_err(|e| ConfigError::new(format!("{f}.secret"), e))?,
            );
        }
        KeySource::Static(set)
    };
    let mut locations = Vec::new();
    for (i, h) in p.from_headers.into_iter().enumerate() {
        let header = header_name(&h.name, &format!("{field}.from_headers[{i}].name"))?;
        locations.push(TokenLocation::Header {
            name: header,
            prefix: h.value_prefix,
        });
    }
    for (i, q) in p.from_params.into_iter().enumerate() {
        if q.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.from_params[{i}]"),
                "must not be empty",
            ));
        }
        locations.push(TokenLocation::Param(q));
    }
    for (i, c) in p.from_cookies.into_iter().enumerate() {
        if c.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.from_cookies[{i}]"),
                "must not be empty",
            ));
        }
        locations.push(TokenLocation::Cookie(c));
    }
    if locations.is_empty() {
        locations.push(TokenLocation::Header {
            name: "authorization".into(),
            prefix: "Bearer ".into(),
        });
    }
    let mut claim_to_headers = Vec::new();
    for (i, c) in p.claim_to_headers.into_iter().enumerate() {
        let f = format!("{field}.claim_to_headers[{i}]");
        if c.claim.is_empty() {
            return Err(ConfigError::new(format!("{f}.claim"), "must not be empty"));
        }
        let header = header_name(&c.header, &format!("{f}.header"))?;
        claim_to_headers.push(ClaimToHeader {
            claim: c.claim,
            property: signals::verified_header(&header),
            header,
        });
    }
    let forward_payload_header = match p.forward_payload_header {
        Some(h) => Some(header_name(&h, &format!("{field}.forward_payload_header"))?),
        None => None,
    };
    if let Some(0) = p.max_lifetime_seconds {
        return Err(ConfigError::new(
            format!("{field}.max_lifetime_seconds"),
            "must be positive",
        ));
    }
    Ok(Provider {
        name,
        issuer: p.issuer,
        audiences: p.audiences.into_iter().collect(),
        keys,
        locations,
        forward: p.forward,
        forward_payload_header,
        claim_to_headers,
        required_claims: p.required_claims,
        clock_skew_seconds: p.clock_skew_seconds,
        max_lifetime_seconds: p.max_lifetime_seconds,
        require_expiration: p.require_expiration,
    })
}
