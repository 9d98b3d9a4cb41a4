//! The sticky-upstream plugin configuration: JSON, parsed strictly. An unknown field, a bad value
//! or an unsafe combination refuses the whole configuration with an error naming the field.
//!
//! ```json
//! {
//!   "upstreams": [{"name": "blue", "weight": 3}, {"name": "green", "weight": 1}],
//!   "cookie": {"name": "tollgate_sticky", "path": "/", "domain": null, "max_age_seconds": 3600,
//!              "http_only": true, "secure": false, "same_site": "Lax"},
//!   "secret": "at least 32 bytes of secret, or use secret_base64",
//!   "route_header": "x-tollgate-upstream",
//!   "choose_by": "weighted",
//!   "repin_statuses": [502, 503],
//!   "repin_upstream_answers": false
//! }
//! ```
//!
//! Only `upstreams` and one of `secret`/`secret_base64` are required; the other values above are
//! the defaults. `choose_by` is `"weighted"` or `{"hash_header": "x-user"}`.

use std::collections::HashMap;

use base64::Engine as _;
use serde::Deserialize;
use tollgate_common::config::{header_name, is_tchar, ConfigError};

use crate::choose::Chooser;
use crate::cookie_value::{
    is_valid_upstream_name, Signer, MAX_UPSTREAM_NAME_BYTES, MIN_SECRET_BYTES,
};

/// Default cookie name.
pub const DEFAULT_COOKIE_NAME: &str = "tollgate_sticky";
/// Default request header through which the choice reaches the proxy's routing.
pub const DEFAULT_ROUTE_HEADER: &str = "x-tollgate-upstream";
/// Default cookie lifetime (seconds).
pub const DEFAULT_MAX_AGE_SECONDS: u64 = 3600;
/// Longest cookie lifetime accepted (seconds): 400 days, the cap user agents apply to
/// `Max-Age` and `Expires` (RFC 6265bis, draft 20, section 5.6.1 and 5.6.2).
pub const MAX_MAX_AGE_SECONDS: u64 = 400 * 86_400;
/// Largest weight of one upstream.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// Most upstreams in one configuration.
pub const MAX_UPSTREAMS: usize = 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    upstreams: Vec<RawUpstream>,
    #[serde(default)]
    cookie: RawCookie,
    secret: Option<String>,
    secret_base64: Option<String>,
    #[serde(default = "default_route_header")]
    route_header: String,
    #[serde(default)]
    choose_by: RawChooseBy,
    #[serde(default = "default_repin_statuses")]
    repin_statuses: Vec<u16>,
    #[serde(default)]
    repin_upstream_answers: bool,
}

fn default_route_header() -> String {
    DEFAULT_ROUTE_HEADER.to_string()
}

fn default_repin_statuses() -> Vec<u16> {
    vec![502, 503]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    name: String,
    #[serde(default = "default_weight")]
    weight: u32,
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCookie {
    #[serde(default = "default_cookie_name")]
    name: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default = "default_max_age")]
    max_age_seconds: u64,
    #[serde(default = "default_true")]
    http_only: bool,
    #[serde(default)]
    secure: bool,
    #[serde(default)]
    same_site: SameSite,
}

impl Default for RawCookie {
    fn default() -> Self {
        RawCookie {
            name: default_cookie_name(),
            path: default_path(),
            domain: None,
            max_age_seconds: DEFAULT_MAX_AGE_SECONDS,
            http_only: true,
            secure: false,
            same_site: SameSite::default(),
        }
    }
}

fn default_cookie_name() -> String {
    DEFAULT_COOKIE_NAME.to_string()
}
fn default_path() -> String {
    "/".to_string()
}
fn default_max_age() -> u64 {
    DEFAULT_MAX_AGE_SECONDS
}
fn default_true() -> bool {
    true
}

/// The cookie's `SameSite` attribute (RFC 6265bis section 4.1.2.7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum SameSite {
    /// `SameSite=Strict`.
    #[serde(alias = "strict")]
    Strict,
    /// `SameSite=Lax` (the default).
    #[default]
    #[serde(alias = "lax")]
    Lax,
    /// `SameSite=None`; requires `secure` (user agents drop such cookies otherwise).
    #[serde(alias = "none")]
    None,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawChooseBy {
    #[default]
    Weighted,
    HashHeader(String),
}

/// How a client without a valid cookie is given an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChooseBy {
    /// At random, in proportion to the weights.
    Weighted,
    /// By a stable hash of this request header's value (lower-case name); requests without it
    /// are chosen by weight.
    HashHeader(String),
}

/// One upstream: an Envoy cluster (the route uses `cluster_header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The cluster name, also what the cookie carries.
    pub name: String,
    /// Relative share of new clients; 0 takes no new clients but keeps its pinned ones.
    pub weight: u32,
}

/// The cookie's attributes (RFC 6265 section 4.1.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieSettings {
    /// Cookie name (an RFC 6265 `token`).
    pub name: String,
    /// `Path`.
    pub path: String,
    /// `Domain` (lower case), none for a host-only cookie.
    pub domain: Option<String>,
    /// `Max-Age` (seconds), also the lifetime signed into the value.
    pub max_age_seconds: u64,
    /// `HttpOnly`.
    pub http_only: bool,
    /// `Secure`.
    pub secure: bool,
    /// `SameSite`.
    pub same_site: SameSite,
    /// Everything after `name=value` in the `Set-Cookie` header, rendered once by the `cookie`
    /// crate, e.g. `; HttpOnly; SameSite=Lax; Path=/; Max-Age=3600`.
    pub attributes: String,
}

/// The compiled configuration.
#[derive(Debug)]
pub struct Config {
    /// Upstreams in configuration order; indices are used everywhere else.
    pub upstreams: Vec<Upstream>,
    /// The cookie.
    pub cookie: CookieSettings,
    /// The request header that carries the chosen upstream to the proxy's routing (lower case).
    pub route_header: String,
    /// How clients without a valid cookie are given an upstream.
    pub choose_by: ChooseBy,
    /// Response statuses that re-pin the client to another upstream (500-599).
    pub repin_statuses: Vec<u16>,
    /// Whether a re-pin status relayed from the upstream itself re-pins too (by default only the
    /// proxy's own answers do, e.g. Envoy's 503 when the upstream cannot be reached).
    pub repin_upstream_answers: bool,
    /// Signs and verifies cookie values.
    pub signer: Signer,
    /// Choice tables.
    pub chooser: Chooser,
    index: HashMap<String, usize>,
}

impl Config {
    /// Parses and checks a JSON plugin configuration.
    ///
    /// Errors name the field: unknown fields and wrong types; no upstreams, duplicate names,
    /// names that are not cookie-octets (RFC 6265 section 4.1.1), weights above
    /// [`MAX_WEIGHT`] or a zero total; a missing, doubled or short (< 32 bytes) secret; cookie
    /// attributes a user agent would reject or misapply; header names that are not RFC 9110
    /// tokens or that the filter must not overwrite; re-pin statuses outside 500-599.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = tollgate_common::config::parse_json(bytes)?;
        compile(raw)
    }

    /// The index of the upstream called `name`.
    pub fn upstream_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The upstream's name at `index`.
    pub fn upstream_name(&self, index: usize) -> Option<&str> {
        self.upstreams.get(index).map(|u| u.name.as_str())
    }

    /// The `Set-Cookie` field value pinning upstream `index` from `now` (Unix seconds) for
    /// `max_age_seconds`.
    pub fn set_cookie(&self, index: usize, now: u64) -> Option<String> {
        let name = self.upstream_name(index)?;
        let value = self
            .signer
            .sign(name, now.saturating_add(self.cookie.max_age_seconds));
        let mut out = String::with_capacity(
            self.cookie
                .name
                .len()
                .saturating_add(value.len())
                .saturating_add(self.cookie.attributes.len())
                .saturating_add(1),
        );
        out.push_str(&self.cookie.name);
        out.push('=');
        out.push_str(&value);
        out.push_str(&self.cookie.attributes);
        Some(out)
    }
}

/// Headers the route header must not be: framing and connection headers, and those the filter
/// or the proxy rely on.
const RESERVED_HEADERS: &[&str] = &[
    "cookie",
    "set-cookie",
    "host",
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn compile(raw: RawConfig) -> Result<Config, ConfigError> {
    if raw.upstreams.is_empty() {
        return Err(ConfigError::new(
            "upstreams",
            "at least one upstream is required",
        ));
    }
    if raw.upstreams.len() > MAX_UPSTREAMS {
        return Err(ConfigError::new(
            "upstreams",
            format!("at most {MAX_UPSTREAMS} upstreams"),
        ));
    }
    let mut index = HashMap::with_capacity(raw.upstreams.len());
    let mut upstreams = Vec::with_capacity(raw.upstreams.len());
    let mut total = 0u64;
    for (i, u) in raw.upstreams.into_iter().enumerate() {
        if !is_valid_upstream_name(&u.name) {
            return Err(ConfigError::new(
                format!("upstreams[{i}].name"),
                format!(
                    "{:?} must be 1 to {MAX_UPSTREAM_NAME_BYTES} visible ASCII characters other \
                     than `\"`, `,`, `;` and `\\` (RFC 6265 cookie-octets), as it travels in a \
                     cookie and a header",
                    u.name
                ),
            ));
        }
        if index.insert(u.name.clone(), i).is_some() {
            return Err(ConfigError::new(
                format!("upstreams[{i}].name"),
                format!("duplicate upstream {:?}", u.name),
            ));
        }
        if u.weight > MAX_WEIGHT {
            return Err(ConfigError::new(
                format!("upstreams[{i}].weight"),
                format!("at most {MAX_WEIGHT}"),
            ));
        }
        total = total.saturating_add(u64::from(u.weight));
        upstreams.push(Upstream {
            name: u.name,
            weight: u.weight,
        });
    }
    if total == 0 {
        return Err(ConfigError::new(
            "upstreams",
            "the total weight is 0: no upstream could take a new client",
        ));
    }

    let cookie = compile_cookie(raw.cookie)?;
    let secret = match (raw.secret, raw.secret_base64) {
        (Some(text), None) => (text.into_bytes(), "secret"),
        (None, Some(b64)) => (
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| ConfigError::new("secret_base64", format!("not base64: {e}")))?,
            "secret_base64",
        ),
        _ => {
            return Err(ConfigError::new(
                "secret",
                "exactly one of `secret` and `secret_base64` is required",
            ))
        }
    };
    let signer = Signer::new(&secret.0, &cookie.name).ok_or_else(|| {
        ConfigError::new(
            secret.1,
            format!(
                "the secret is {} bytes; at least {MIN_SECRET_BYTES} are required \
                 (RFC 2104 section 3: not shorter than the hash output)",
                secret.0.len()
            ),
        )
    })?;

    let route_header = header_name(&raw.route_header, "route_header")?;
    if RESERVED_HEADERS.contains(&route_header.as_str()) {
        return Err(ConfigError::new(
            "route_header",
            format!("{route_header:?} cannot carry the routing choice"),
        ));
    }
    let choose_by = match raw.choose_by {
        RawChooseBy::Weighted => ChooseBy::Weighted,
        RawChooseBy::HashHeader(h) => {
            let h = header_name(&h, "choose_by.hash_header")?;
            if h == route_header {
                return Err(ConfigError::new(
                    "choose_by.hash_header",
                    "must differ from `route_header` (which the filter overwrites)",
                ));
            }
            ChooseBy::HashHeader(h)
        }
    };
    let mut repin_statuses = Vec::with_capacity(raw.repin_statuses.len());
    for (i, s) in raw.repin_statuses.into_iter().enumerate() {
        if !(500..=599).contains(&s) {
            return Err(ConfigError::new(
                format!("repin_statuses[{i}]"),
                format!("{s} is not a server error status (500-599)"),
            ));
        }
        if !repin_statuses.contains(&s) {
            repin_statuses.push(s);
        }
    }
    let chooser = Chooser::new(upstreams.iter().map(|u| (u.name.as_str(), u.weight)));
    Ok(Config {
        upstreams,
        cookie,
        route_header,
        choose_by,
        repin_statuses,
        repin_upstream_answers: raw.repin_upstream_answers,
        signer,
        chooser,
        index,
    })
}

fn compile_cookie(raw: RawCookie) -> Result<CookieSettings, ConfigError> {
    if raw.name.is_empty() || !raw.name.bytes().all(is_tchar) {
        return Err(ConfigError::new(
            "cookie.name",
            format!(
                "{:?} is not a cookie name (an RFC 6265 section 4.1.1 token)",
                raw.name
            ),
        ));
    }
    // RFC 6265 section 4.1.1: path-value = any CHAR except CTLs or ";"; it must be absolute to
    // be used as given (section 5.2.4).
    if !raw.path.starts_with('/')
        || !raw
            .path
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b';')
    {
        return Err(ConfigError::new(
            "cookie.path",
            "must start with `/` and contain only visible ASCII characters other than `;`",
        ));
    }
    let domain = match raw.domain {
        None => None,
        Some(d) => {
            let d = d.strip_prefix('.').unwrap_or(&d).to_ascii_lowercase();
            let ok = !d.is_empty()
                && d.len() <= 253
                && d.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(ConfigError::new(
                    "cookie.domain",
                    "must be a domain name (RFC 6265 section 4.1.2.3), or null (host-only)",
                ));
            }
            Some(d)
        }
    };
    if raw.max_age_seconds == 0 || raw.max_age_seconds > MAX_MAX_AGE_SECONDS {
        return Err(ConfigError::new(
            "cookie.max_age_seconds",
            format!("must be 1 to {MAX_MAX_AGE_SECONDS} (400 days)"),
        ));
    }
    if raw.same_site == SameSite::None && !raw.secure {
        return Err(ConfigError::new(
            "cookie.same_site",
            "SameSite=None requires `secure: true` (user agents drop the cookie otherwise)",
        ));
    }
    // Cookie name prefixes, RFC 6265bis section 4.1.3.
    if raw.name.starts_with("__Secure-") && !raw.secure {
        return Err(ConfigError::new(
            "cookie.secure",
            "a `__Secure-` cookie requires `secure: true`",
        ));
    }
    if raw.name.starts_with("__Host-") && (!raw.secure || raw.path != "/" || domain.is_some()) {
        return Err(ConfigError::new(
            "cookie.name",
            "a `__Host-` cookie requires `secure: true`, `path: \"/\"` and no domain",
        ));
    }
    let max_age = i64::try_from(raw.max_age_seconds)
        .map_err(|_| ConfigError::new("cookie.max_age_seconds", "out of range"))?;
    let mut builder = cookie::Cookie::build((raw.name.clone(), String::new()))
        .path(raw.path.clone())
        .max_age(cookie::time::Duration::seconds(max_age))
        .http_only(raw.http_only)
        .secure(raw.secure)
        .same_site(match raw.same_site {
            SameSite::Strict => cookie::SameSite::Strict,
            SameSite::Lax => cookie::SameSite::Lax,
            SameSite::None => cookie::SameSite::None,
        });
    if let Some(d) = &domain {
        builder = builder.domain(d.clone());
    }
    let rendered = builder.build().to_string();
    let attributes = rendered
        .strip_prefix(&format!("{}=", raw.name))
        .unwrap_or_default()
        .to_string();
    if !attributes.starts_with("; ") {
        return Err(ConfigError::new(
            "cookie",
            format!("could not render the cookie attributes ({rendered:?})"),
        ));
    }
    Ok(CookieSettings {
        name: raw.name,
        path: raw.path,
        domain,
        max_age_seconds: raw.max_age_seconds,
        http_only: raw.http_only,
        secure: raw.secure,
        same_site: raw.same_site,
        attributes,
    })
}
