//! `token_limits`: limits on the weighted tokens a tenant's responses use per minute, hour or
//! day, as configured, checked (the crate README's "Token limits").
//!
//! ```json
//! "token_limits": {
//!   "default": [{"name": "tpm", "tokens": 100000, "per": "minute"}],
//!   "tenants": {"alice": [
//!     {"name": "tpm", "tokens": 400000, "per": "minute"},
//!     {"name": "gpt-4o-daily", "tokens": 2000000, "per": "day", "model": "gpt-4o",
//!      "weights": {"input": 1, "cached_input": 0.1, "output": 4}}]},
//!   "max_keys": 100000
//! }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use tollgate_common::config::ConfigError;

use super::weights::{RawWeights, Weights};
use super::window::Per;
use crate::price_table::PriceTable;

/// Most limits in one list (`default`, or one tenant's).
pub const MAX_LIMITS: usize = 16;
/// Longest limit name (bytes).
pub const MAX_NAME_BYTES: usize = 64;
/// Longest `model` (bytes).
pub const MAX_MODEL_BYTES: usize = 256;
/// Default `max_keys`.
pub const DEFAULT_MAX_KEYS: u64 = 100_000;

/// `token_limits` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenLimits {
    #[serde(default)]
    default: Vec<RawLimit>,
    #[serde(default)]
    tenants: BTreeMap<String, Vec<RawLimit>>,
    #[serde(default = "default_max_keys")]
    max_keys: u64,
    #[serde(default)]
    global: bool,
}

fn default_max_keys() -> u64 {
    DEFAULT_MAX_KEYS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    name: String,
    tokens: u64,
    per: Per,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    weights: RawWeights,
}

/// One limit: at most `tokens` weighted tokens per window of length `per`, counting the
/// responses to requests naming `model` (every request when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Its name: `[A-Za-z0-9._-]`, 1 to [`MAX_NAME_BYTES`] bytes, unique in its list (the
    /// RateLimit headers' policy name and part of the shared-data key).
    pub name: String,
    /// Weighted tokens per window (at least 1).
    pub tokens: u64,
    /// The window length.
    pub per: Per,
    /// The model family it counts (`PriceTable::family` of the configured name), if any.
    pub model: Option<String>,
    /// The weight of each class of token.
    pub weights: Weights,
}

impl Limit {
    /// A limit of `tokens` per `per` on every model, every token weighing one (input +
    /// output: the default weights).
    pub fn total(name: &str, tokens: u64, per: Per) -> Limit {
        Limit {
            name: name.to_string(),
            tokens,
            per,
            model: None,
            weights: Weights::default(),
        }
    }

    /// Whether this limit counts a request naming `model` (its body's `model`, if any): a limit
    /// without `model` counts every request; one with `model` the requests whose model is of
    /// the same family (`openai/gpt-4o-2024-08-06` counts against `gpt-4o`).
    pub fn applies_to(&self, model: Option<&str>) -> bool {
        match (&self.model, model) {
            (None, _) => true,
            (Some(limited), Some(m)) => PriceTable::family(m) == limited,
            (Some(_), None) => false,
        }
    }
}

/// The checked `token_limits`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenLimits {
    /// The limits of tenants not listed in `tenants`.
    pub default: Vec<Limit>,
    /// Per-tenant limits (each replaces `default` entirely; an empty list: no limits).
    pub tenants: HashMap<String, Vec<Limit>>,
    /// Most (tenant, limit) keys in shared data; beyond, new ones share the overflow records.
    pub max_keys: u64,
    /// Counted by the rate limit service of the cost filter's `global` block
    /// (`token_limits::global`), across gateways; the shared-data counts are still kept, for
    /// `on_error: local`.
    pub global: bool,
}

impl TokenLimits {
    /// The limits of `tenant`.
    pub fn of(&self, tenant: &str) -> &[Limit] {
        self.tenants.get(tenant).unwrap_or(&self.default)
    }

    /// Every limit fits the rate limit protocol's `uint32` (`requests_per_unit`).
    ///
    /// # Errors
    /// The first limit that does not, by its JSON path.
    fn check_protocol(&self) -> Result<(), ConfigError> {
        let mut lists: Vec<(String, &Vec<Limit>)> =
            vec![("token_limits.default".to_string(), &self.default)];
        let mut tenants: Vec<_> = self.tenants.iter().collect();
        tenants.sort_by(|a, b| a.0.cmp(b.0));
        lists.extend(
            tenants
                .into_iter()
                .map(|(t, l)| (format!("token_limits.tenants.{t}"), l)),
        );
        for (field, list) in lists {
            for (i, l) in list.iter().enumerate() {
                if u32::try_from(l.tokens).is_err() {
                    return Err(ConfigError::new(
                        format!("{field}[{i}].tokens"),
                        format!(
                            "{} is more than the rate limit protocol's uint32 requests_per_unit \
                             ({}), which counts global limits",
                            l.tokens,
                            u32::MAX
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The limits of `tenant` that apply to a request naming `model` ([`Limit::applies_to`]), in
    /// the tenant's order: those read at admission and counted at the booking.
    pub fn applying<'a, 'm>(
        &'a self,
        tenant: &str,
        model: Option<&'m str>,
    ) -> impl Iterator<Item = &'a Limit> + use<'a, 'm> {
        self.of(tenant).iter().filter(move |l| l.applies_to(model))
    }

    /// Whether any tenant has a limit.
    pub fn any(&self) -> bool {
        !self.default.is_empty() || self.tenants.values().any(|l| !l.is_empty())
    }
}

/// Whether `name` is a valid limit name: 1 to [`MAX_NAME_BYTES`] of `[A-Za-z0-9._-]` (an
/// sf-string without escapes in the RateLimit headers, and no `/` in a key).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn limits(raw: Vec<RawLimit>, field: &str) -> Result<Vec<Limit>, ConfigError> {
    if raw.len() > MAX_LIMITS {
        return Err(ConfigError::new(
            field,
            format!("at most {MAX_LIMITS} limits"),
        ));
    }
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !valid_name(&r.name) {
            return Err(ConfigError::new(
                format!("{at}.name"),
                format!(
                    "{:?}: must be 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 . _ -",
                    r.name
                ),
            ));
        }
        if !names.insert(r.name.clone()) {
            return Err(ConfigError::new(
                format!("{at}.name"),
                format!("{}: a limit of this name is already in the list", r.name),
            ));
        }
        if r.tokens == 0 {
            return Err(ConfigError::new(
                format!("{at}.tokens"),
                "must be at least 1 (remove the limit, or give the tenant an empty list)",
            ));
        }
        let model = match r.model {
            Some(m) if m.is_empty() || m.len() > MAX_MODEL_BYTES => {
                return Err(ConfigError::new(
                    format!("{at}.model"),
                    format!("must be 1 to {MAX_MODEL_BYTES} bytes"),
                ))
            }
            Some(m) => Some(PriceTable::family(&m).to_string()),
            None => None,
        };
        out.push(Limit {
            weights: r.weights.checked(&format!("{at}.weights"))?,
            name: r.name,
            tokens: r.tokens,
            per: r.per,
            model,
        });
    }
    Ok(out)
}

impl RawTokenLimits {
    /// The limits, checked; `valid_tenant` says which tenant names exist (`config::valid_tenant`).
    ///
    /// # Errors
    /// The first bad field, by its JSON path (`token_limits.tenants.alice[1].tokens`).
    pub fn checked(self, valid_tenant: fn(&str) -> bool) -> Result<TokenLimits, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::new(
                "token_limits.max_keys",
                "must be at least 1",
            ));
        }
        let default = limits(self.default, "token_limits.default")?;
        let mut tenants = HashMap::new();
        for (name, list) in self.tenants {
            let field = format!("token_limits.tenants.{name}");
            if !valid_tenant(&name) {
                return Err(ConfigError::new(
                    field,
                    "tenant names are 1 to 128 visible ASCII characters other than /",
                ));
            }
            tenants.insert(name, limits(list, &field)?);
        }
        let limits = TokenLimits {
            default,
            tenants,
            max_keys: self.max_keys,
            global: self.global,
        };
        if limits.global {
            limits.check_protocol()?;
        }
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<TokenLimits, ConfigError> {
        let raw: RawTokenLimits = tollgate_common::config::parse_json(json.as_bytes())?;
        raw.checked(crate::config::valid_tenant)
    }

    #[test]
    fn a_full_configuration() {
        let t = parse(
            r#"{"default": [{"name": "tpm", "tokens": 1000, "per": "minute"}],
                "tenants": {"alice": [
                  {"name": "tpd", "tokens": 5, "per": "day", "model": "openai/gpt-4o-2024-08-06",
                   "weights": {"cached_input": 0.1}}],
                  "free": []},
                "max_keys": 10}"#,
        )
        .expect("configuration");
        assert_eq!(t.of("bob").len(), 1);
        assert_eq!(t.of("bob")[0].per, Per::Minute);
        let alice = &t.of("alice")[0];
        assert_eq!(alice.model.as_deref(), Some("gpt-4o"));
        assert_eq!(alice.weights.cached_input, 100);
        assert_eq!(alice.weights.input, 1_000);
        assert!(t.of("free").is_empty());
        assert_eq!(t.max_keys, 10);
        assert!(t.any());
        assert!(!parse("{}").expect("empty").any());
    }

    #[test]
    fn the_plugin_configuration_carries_them_and_names_bad_fields() {
        let base = r#"{"prices": {"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}},
                      "tenant": {"header": "x-jwt-sub"}"#;
        let c = crate::config::Config::parse(
            format!(
                r#"{base}, "token_limits": {{"tenants": {{"a": [{{"name": "t", "tokens": 9, "per": "day"}}]}}}}}}"#
            )
            .as_bytes(),
        )
        .expect("configuration");
        assert!(
            c.enforces() && !c.has_budgets(),
            "the counts must not live in an evicting zone"
        );
        assert_eq!(c.token_limits.of("a")[0].tokens, 9);
        assert!(c.token_limits.of("b").is_empty());
        let plain = crate::config::Config::parse(format!("{base}}}").as_bytes()).expect("plain");
        assert!(!plain.enforces());
        let e = crate::config::Config::parse(
            format!(
                r#"{base}, "token_limits": {{"tenants": {{"a": [{{"name": "t", "tokens": 9, "per": "day", "weights": {{"input": 0.0005}}}}]}}}}}}"#
            )
            .as_bytes(),
        )
        .expect_err("weight finer than 0.001");
        assert_eq!(e.field, "token_limits.tenants.a[0].weights.input");
        let e = crate::config::Config::parse(
            format!(r#"{base}, "token_limits": {{"default": [{{"name": "t", "per": "day"}}]}}}}"#)
                .as_bytes(),
        )
        .expect_err("tokens missing");
        assert!(e.field.starts_with("token_limits.default"), "{e:?}");
    }

    #[test]
    fn global_limits_need_the_global_block_and_fit_the_protocol() {
        let base = r#"{"prices": {"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}},
                      "tenant": {"header": "x-jwt-sub"}"#;
        let global = r#""global": {"service": "rls", "domain": "d"}"#;
        let parse =
            |rest: &str| crate::config::Config::parse(format!("{base}, {rest}}}").as_bytes());
        let limits = |tokens: u64| {
            format!(
                r#""token_limits": {{"global": true, "tenants": {{"a": [{{"name": "ok", "tokens": 1, "per": "day"}}, {{"name": "t", "tokens": {tokens}, "per": "minute"}}]}}}}"#
            )
        };
        let c = parse(&format!("{global}, {}", limits(u64::from(u32::MAX)))).expect("fits");
        assert!(c.token_limits.global);
        let e = parse(&limits(9)).expect_err("no global block");
        assert_eq!(e.field, "token_limits.global");
        let e = parse(&format!("{global}, {}", limits(u64::from(u32::MAX) + 1))).expect_err("u32");
        assert_eq!(e.field, "token_limits.tenants.a[1].tokens");
        // Local limits are not bounded by the protocol.
        let local = limits(u64::MAX).replace(r#""global": true, "#, "");
        assert!(!parse(&local).expect("local").token_limits.global);
    }

    #[test]
    fn models_match_by_family() {
        let t =
            parse(r#"{"default": [{"name": "g", "tokens": 1, "per": "hour", "model": "gpt-4o"}]}"#)
                .expect("configuration");
        let l = &t.default[0];
        for m in [
            "gpt-4o",
            "openai/gpt-4o",
            "gpt-4o-2024-05-13",
            "openai/gpt-4o-2024-05-13",
        ] {
            assert!(l.applies_to(Some(m)), "{m}");
        }
        for m in ["gpt-4o-mini", "gpt-4", "azure/gpt-4o", ""] {
            assert!(!l.applies_to(Some(m)), "{m}");
        }
        assert!(!l.applies_to(None));
    }

    #[test]
    fn bad_limits_are_refused_naming_the_field() {
        let cases = [
            (
                r#"{"default": [{"name": "a b", "tokens": 1, "per": "minute"}]}"#,
                "token_limits.default[0].name",
            ),
            (
                r#"{"default": [{"name": "\"x\"", "tokens": 1, "per": "minute"}]}"#,
                "token_limits.default[0].name",
            ),
            (
                r#"{"default": [{"name": "a", "tokens": 1, "per": "minute"}, {"name": "a", "tokens": 2, "per": "day"}]}"#,
                "token_limits.default[1].name",
            ),
            (
                r#"{"default": [{"name": "a", "tokens": 0, "per": "minute"}]}"#,
                "token_limits.default[0].tokens",
            ),
            (
                r#"{"tenants": {"bob": [{"name": "a", "tokens": 1, "per": "minute", "model": ""}]}}"#,
                "token_limits.tenants.bob[0].model",
            ),
            (
                r#"{"tenants": {"bob": [{"name": "a", "tokens": 1, "per": "minute", "weights": {"output": -1}}]}}"#,
                "token_limits.tenants.bob[0].weights.output",
            ),
            (r#"{"tenants": {"a/b": []}}"#, "token_limits.tenants.a/b"),
            (r#"{"max_keys": 0}"#, "token_limits.max_keys"),
        ];
        for (json, field) in cases {
            let e = parse(json).expect_err(json);
            assert_eq!(e.field, field, "{json}: {}", e.message);
        }
        let long = format!(
            r#"{{"default": [{{"name": "{}", "tokens": 1, "per": "minute"}}]}}"#,
            "n".repeat(65)
        );
        assert_eq!(
            parse(&long).expect_err("long").field,
            "token_limits.default[0].name"
        );
        let many: Vec<String> = (0..17)
            .map(|i| format!(r#"{{"name": "l{i}", "tokens": 1, "per": "minute"}}"#))
            .collect();
        let many = format!(r#"{{"default": [{}]}}"#, many.join(","));
        assert_eq!(
            parse(&many).expect_err("many").field,
            "token_limits.default"
        );
        // Unknown fields and periods are serde's errors, with the path.
        let e =
            parse(r#"{"default": [{"name": "a", "tokens": 1, "per": "week"}]}"#).expect_err("week");
        assert!(e.field.contains("default"), "{e:?}");
        assert!(
            parse(r#"{"default": [{"name": "a", "tokens": 1, "per": "minute", "burst": 2}]}"#)
                .is_err()
        );
        assert!(parse(r#"{"default": [{"name": "a", "tokens": -1, "per": "minute"}]}"#).is_err());
    }
}
