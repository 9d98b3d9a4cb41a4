//! The cost plugin configuration: JSON, parsed strictly (unknown fields, wrong types and
//! impossible values refuse the whole configuration, naming the field), except `prices`, which
//! is LiteLLM's price file as it is (`model_prices_and_context_window.json`, or entries of it):
//! entries not priced per token are skipped and LiteLLM's other fields ignored
//! (`price_table`).
//!
//! ```json
//! {
//!   "ledger": "default",
//!   "prices": {
//!     "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
//!                     "cache_read_input_token_cost": 7.5e-08}
//!   },
//!   "remote_prices": {"cluster": "prices", "path": "/model_prices_and_context_window.json",
//!                     "cache_duration_seconds": 3600, "retry_seconds": 60,
//!                     "timeout_ms": 10000, "max_bytes": 16777216},
//!   "tenant": {"header": "x-jwt-sub", "default": "anonymous"},
//!   "budgets": {"default": {"day_nano_usd": 1000000000},
//!               "tenants": {"alice": {"day_nano_usd": 5000000000, "month_nano_usd": 50000000000}}},
//!   "over_budget_status": 402,
//!   "unknown_model": {"action": "refuse_budgeted", "status": 400, "default_price": null},
//!   "add_stream_usage": true,
//!   "identity_encoding": true,
//!   "unpriced_charge": "bytes",
//!   "unpriced_calls": "refuse",
//!   "max_request_body_bytes": 1048576,
//!   "max_event_bytes": 65536,
//!   "max_decoded_bytes": 67108864,
//!   "spend_headers": false,
//!   "cas_retries": 32,
//!   "max_tenants": 100000,
//!   "store_full": {"action": "refuse", "status": 503},
//!   "global": {"service": "ratelimit", "domain": "tollgate", "timeout_ms": 50,
//!              "on_error": "local", "unit_nano_usd": 100000},
//!   "reservation": {"default_max_output_tokens": 4096},
//!   "token_limits": {"default": [{"name": "tpm", "tokens": 100000, "per": "minute"}],
//!                    "max_keys": 100000}
//! }
//! ```
//!
//! See the crate README for each field.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde::Deserialize;
use serde_json::value::RawValue;
use tollgate_common::config::{header_name, parse_json, ConfigError};
use tollgate_common::credential::CredentialError;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::identity::{Identity, IdentitySource, IdentityView, UNAUTHENTICATED};
use tollgate_common::remote::{RawRemote, RemoteDefaults, RemoteSource};
use tollgate_common::shared_data::StoreFull;

use crate::global::CostGlobal;
use crate::ledger::{Budget, Ledger};
use crate::price::ModelPrice;
use crate::price_table::{single_price, Entry, Loaded, PriceTable};
use crate::reservation::ReservationConfig;
use crate::sse::DEFAULT_MAX_EVENT_BYTES;
use crate::token_limits::{RawTokenLimits, TokenLimits, TokenStore};
use crate::unpriced_calls::UnpricedCalls;

/// Default `max_request_body_bytes`: Envoy's default connection buffer limit (the filter holds
/// the request body until it has read it; keep it at or below the listener's
/// `per_connection_buffer_limit_bytes`, beyond which Envoy answers 413 itself).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 1024 * 1024;
/// Default `max_decoded_bytes` (a compressed response's decoded size read at most).
pub const DEFAULT_MAX_DECODED_BYTES: u64 = 64 * 1024 * 1024;
/// Largest `max_decoded_bytes` (4 GiB).
pub const MAX_DECODED_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Default `unknown_model.status` (RFC 9110 section 15.5.1).
pub const DEFAULT_UNKNOWN_MODEL_STATUS: u32 = 400;
/// Largest of the byte bounds.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;
/// Default CAS retries per update.
pub const DEFAULT_CAS_RETRIES: u32 = 32;
/// Largest `cas_retries`.
pub const MAX_CAS_RETRIES: u32 = 1_000;
/// Default `max_tenants`.
pub const DEFAULT_MAX_TENANTS: u64 = 100_000;
/// Longest tenant and ledger name (bytes).
pub const MAX_TENANT_BYTES: usize = 128;

/// Defaults of `remote_prices`: refreshed hourly, retried after 60 s, 10 s timeout, bodies up to
/// 16 MiB (LiteLLM's file is 3.2 MB in 1.109.1), at most 64 MiB.
pub const REMOTE_PRICES_DEFAULTS: RemoteDefaults = RemoteDefaults {
    cache_duration_seconds: 3600,
    retry_seconds: 60,
    timeout_ms: 10_000,
    max_bytes: 16 << 20,
    max_bytes_limit: 64 << 20,
};

/// The shared-data namespace of remote price tables (`tollgate.cost.prices/<cluster><path>`;
/// in nginx, the `shm_kv` zone `tollgate.cost.prices` if declared, else `*`).
pub const PRICES_NAMESPACE: &str = "tollgate.cost.prices";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_ledger")]
    ledger: String,
    #[serde(default)]
    prices: Option<Box<RawValue>>,
    #[serde(default)]
    remote_prices: Option<RawRemote>,
    #[serde(default)]
    tenant: RawTenant,
    #[serde(default)]
    budgets: RawBudgets,
    #[serde(default = "default_status")]
    over_budget_status: u32,
    #[serde(default)]
    unknown_model: RawUnknownModel,
    #[serde(default = "default_true")]
    add_stream_usage: bool,
    #[serde(default = "default_true")]
    identity_encoding: bool,
    #[serde(default)]
    unpriced_charge: UnpricedCharge,
    #[serde(default)]
    unpriced_calls: UnpricedCalls,
    #[serde(default = "default_max_request_body")]
    max_request_body_bytes: usize,
    #[serde(default = "default_max_event")]
    max_event_bytes: usize,
    #[serde(default = "default_max_decoded")]
    max_decoded_bytes: u64,
    #[serde(default)]
    spend_headers: bool,
    #[serde(default = "default_cas_retries")]
    cas_retries: u32,
    #[serde(default = "default_max_tenants")]
    max_tenants: u64,
    #[serde(default)]
    store_full: StoreFull<StoreFullAction>,
    #[serde(default)]
    global: Option<Box<RawValue>>,
    #[serde(default)]
    allow_eviction: bool,
    #[serde(default)]
    reservation: ReservationConfig,
    #[serde(default)]
    token_limits: Option<RawTokenLimits>,
    #[serde(default)]
    error_format: ErrorFormat,
}

/// What happens to a request of a tenant **with a budget** whose ledger record cannot be created
/// (a full nginx zone with `eviction=none`). A tenant without a budget is always admitted, its
/// spend booked into the overflow record. A tenant with a budget whose spend cannot be read at
/// all is always refused.
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StoreFullAction {
    /// Refused before the upstream with `store_full.status` (default).
    #[default]
    Refuse,
    /// Admitted with its budget checked against the pooled spend of the overflow record, into
    /// which its spend is booked (reached sooner, never later).
    Pool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    header: Option<String>,
    unverified_header: Option<String>,
    api_key_header: Option<String>,
    default: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudgets {
    #[serde(default)]
    default: Option<RawBudget>,
    #[serde(default)]
    tenants: BTreeMap<String, RawBudget>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    day_nano_usd: Option<u64>,
    month_nano_usd: Option<u64>,
}

fn default_ledger() -> String {
    "default".into()
}
fn default_status() -> u32 {
    402
}
fn default_true() -> bool {
    true
}
fn default_max_decoded() -> u64 {
    DEFAULT_MAX_DECODED_BYTES
}
fn default_unknown_model_status() -> u32 {
    DEFAULT_UNKNOWN_MODEL_STATUS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnknownModel {
    #[serde(default)]
    action: UnknownModelAction,
    #[serde(default = "default_unknown_model_status")]
    status: u32,
    #[serde(default)]
    default_price: Option<Entry>,
}

impl Default for RawUnknownModel {
    fn default() -> Self {
        RawUnknownModel {
            action: UnknownModelAction::default(),
            status: DEFAULT_UNKNOWN_MODEL_STATUS,
            default_price: None,
        }
    }
}

/// What a request naming a model that has no price gets (when no `default_price` is set).
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnknownModelAction {
    /// Refused before the upstream for tenants with a budget (default); others pass, counted.
    #[default]
    RefuseBudgeted,
    /// Refused before the upstream for every tenant.
    Refuse,
    /// Passed on (counted `unknown_model`; a tenant's spend then misses it).
    Allow,
}

/// What is booked for an LLM response that could not be priced exactly (see the README).
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnpricedCharge {
    /// The request's model price for one input token per byte of the request body and one
    /// output token per byte of the response body (default).
    #[default]
    Bytes,
    /// Nothing (counted and logged only).
    None,
}

/// The `unknown_model` policy.
#[derive(Debug, Clone)]
pub struct UnknownModel {
    /// What to do.
    pub action: UnknownModelAction,
    /// Status of a refusal (4xx or 5xx).
    pub status: u32,
    /// The price of every model missing from `prices`; with it, no model is unknown.
    pub default_price: Option<ModelPrice>,
}
fn default_max_request_body() -> usize {
    DEFAULT_MAX_REQUEST_BODY_BYTES
}
fn default_max_event() -> usize {
    DEFAULT_MAX_EVENT_BYTES
}
fn default_cas_retries() -> u32 {
    DEFAULT_CAS_RETRIES
}
fn default_max_tenants() -> u64 {
    DEFAULT_MAX_TENANTS
}

/// Where the tenant of a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantSource {
    /// A claim header verified by jwt-auth on this request (`{"header": "x-jwt-sub"}`), or a
    /// header trusted as sent (`{"unverified_header": H}`): `tollgate_common::identity`.
    Identity(IdentitySource),
    /// An API key header (an [`IdentitySource::Credential`]): the tenant is `key-` and the first
    /// 16 hex digits of the SHA-256 of the key in canonical form (`tollgate_common::credential`:
    /// one tenant per key, whatever its spelling; the key itself is never stored nor logged).
    ApiKey(IdentitySource),
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The prices of `prices` (until a remote table is installed, and while none can be).
    pub prices: Rc<PriceTable>,
    /// What loading `prices` skipped, for the log line.
    pub prices_loaded: String,
    /// Where a price table is fetched from and refreshed.
    pub remote_prices: Option<RemoteSource>,
    /// Where the tenant comes from.
    pub tenant: TenantSource,
    /// The tenant of requests without a usable tenant value.
    pub default_tenant: String,
    /// Budget of tenants not listed in `tenant_budgets`.
    pub default_budget: Budget,
    /// Per-tenant budgets (replace the default budget entirely).
    pub tenant_budgets: HashMap<String, Budget>,
    /// Status of a refused request (402 or 429).
    pub over_budget_status: u32,
    /// Requests naming a model without a price.
    pub unknown_model: UnknownModel,
    /// Add `stream_options.include_usage` to streaming OpenAI requests that lack it.
    pub add_stream_usage: bool,
    /// Ask the upstream for `Accept-Encoding: identity`.
    pub identity_encoding: bool,
    /// What LLM responses that cannot be priced exactly are charged.
    pub unpriced_charge: UnpricedCharge,
    /// What a tenant whose requests must be read gets for a call that starts billable work the
    /// filter cannot price (`crate::unpriced_calls`).
    pub unpriced_calls: UnpricedCalls,
    /// Largest request body the filter holds to read it (bytes).
    pub max_request_body_bytes: usize,
    /// Largest captured `usage`/`model` value, and SSE event held back (bytes).
    pub max_event_bytes: usize,
    /// Largest decoded size of a compressed response read (bytes).
    pub max_decoded_bytes: u64,
    /// Whether to add the tenant's spend (read at the request) as `x-tollgate-spend-*` headers.
    pub spend_headers: bool,
    /// The shared-data ledger.
    pub ledger: Ledger,
    /// What a tenant with a budget gets when its record cannot be created.
    pub store_full: StoreFull<StoreFullAction>,
    /// Budgets counted by the rate limit service across gateways (`global`), if set.
    pub global: Option<CostGlobal>,
    /// Load with budgets on a shared-data zone that evicts keys (`tollgate_common::eviction`);
    /// off: refuse.
    pub allow_eviction: bool,
    /// How a request's reservation is estimated (`crate::reservation`).
    pub reservation: ReservationConfig,
    /// Weighted tokens per tenant per window (`crate::token_limits`; empty: none).
    pub token_limits: TokenLimits,
    /// Where the token counts live (beside the ledger's keys).
    pub token_store: TokenStore,
    /// The envelope of this filter's refusals (`error_format`: `auto`, the request's API;
    /// `openai`, `anthropic` or `tollgate`), `tollgate_common::error_envelope`.
    pub error_format: ErrorFormat,
}

/// Whether `name` may be a tenant (or ledger) name: 1 to 128 visible ASCII characters other
/// than `/` (so that it cannot reach another key of the ledger).
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_BYTES
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

fn budget(raw: RawBudget) -> Budget {
    Budget {
        day: raw.day_nano_usd,
        month: raw.month_nano_usd,
    }
}

fn bounded(value: usize, field: &str, min: usize) -> Result<usize, ConfigError> {
    if value < min || value > MAX_BYTES {
        return Err(ConfigError::new(
            field,
            format!("must be from {min} to {MAX_BYTES} bytes"),
        ));
    }
    Ok(value)
}

impl Config {
    /// Parses and validates the plugin configuration.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = parse_json(bytes)?;
        if !valid_tenant(&raw.ledger) {
            return Err(ConfigError::new(
                "ledger",
                "must be 1 to 128 visible ASCII characters other than /",
            ));
        }
        let loaded = match &raw.prices {
            Some(json) => PriceTable::parse(json.get().as_bytes(), "prices")?,
            None => Loaded::default(),
        };
        let remote_prices = match raw.remote_prices {
            Some(r) => Some(r.checked("remote_prices", REMOTE_PRICES_DEFAULTS)?),
            None => None,
        };
        if raw.prices.is_none() && remote_prices.is_none() {
            return Err(ConfigError::new(
                "prices",
                "missing: give prices (LiteLLM's price file or entries of it), remote_prices, \
                 or both (prices is then used until the first fetch)",
            ));
        }
        let default_price = match &raw.unknown_model.default_price {
            Some(entry) => Some(single_price(entry, "unknown_model.default_price")?),
            None => None,
        };
        if !(1024..=MAX_DECODED_BYTES).contains(&raw.max_decoded_bytes) {
            return Err(ConfigError::new(
                "max_decoded_bytes",
                format!("must be from 1024 to {MAX_DECODED_BYTES} bytes"),
            ));
        }
        if !(400..=599).contains(&raw.unknown_model.status) {
            return Err(ConfigError::new(
                "unknown_model.status",
                "must be a 4xx or 5xx status code",
            ));
        }
        let t = &raw.tenant;
        let tenant = match (&t.header, &t.unverified_header, &t.api_key_header) {
            (None, None, Some(h)) => TenantSource::ApiKey(IdentitySource::credential(
                &header_name(h, "tenant.api_key_header")?,
            )),
            (None, None, None) => {
                return Err(ConfigError::new(
                    "tenant",
                    "set one of header (a claim header verified by jwt-auth, e.g. x-jwt-sub), \
                     unverified_header or api_key_header",
                ))
            }
            (h, u, None) => TenantSource::Identity(IdentitySource::from_config(
                h.as_deref(),
                u.as_deref(),
                "tenant",
            )?),
            (_, _, Some(_)) => {
                return Err(ConfigError::new(
                    "tenant",
                    "header, unverified_header and api_key_header are exclusive",
                ))
            }
        };
        let default_tenant = raw.tenant.default.unwrap_or_else(|| "anonymous".into());
        if !valid_tenant(&default_tenant) {
            return Err(ConfigError::new(
                "tenant.default",
                "must be 1 to 128 visible ASCII characters other than /",
            ));
        }
        let mut tenant_budgets = HashMap::new();
        for (name, b) in raw.budgets.tenants {
            if !valid_tenant(&name) {
                return Err(ConfigError::new(
                    format!("budgets.tenants.{name}"),
                    "tenant names are 1 to 128 visible ASCII characters other than /",
                ));
            }
            tenant_budgets.insert(name, budget(b));
        }
        if raw.over_budget_status != 402 && raw.over_budget_status != 429 {
            return Err(ConfigError::new("over_budget_status", "must be 402 or 429"));
        }
        if raw.cas_retries > MAX_CAS_RETRIES {
            return Err(ConfigError::new(
                "cas_retries",
                format!("must be at most {MAX_CAS_RETRIES}"),
            ));
        }
        if raw.max_tenants == 0 {
            return Err(ConfigError::new("max_tenants", "must be at least 1"));
        }
        let store_full = raw.store_full.checked()?;
        let default_budget = raw.budgets.default.map(budget).unwrap_or_default();
        let global = match &raw.global {
            Some(g) => {
                let g = CostGlobal::parse(g.get())?;
                let mut all: Vec<(String, &Budget)> =
                    vec![("budgets.default".to_string(), &default_budget)];
                all.extend(
                    tenant_budgets
                        .iter()
                        .map(|(name, b)| (format!("budgets.tenants.{name}"), b)),
                );
                all.sort_by(|a, b| a.0.cmp(&b.0));
                g.check_budgets(all.into_iter())?;
                Some(g)
            }
            None => None,
        };
        let token_limits = match raw.token_limits {
            Some(t) => t.checked(valid_tenant)?,
            None => TokenLimits::default(),
        };
        if token_limits.global && global.is_none() {
            return Err(ConfigError::new(
                "token_limits.global",
                "counts the limits on the rate limit service of the `global` block, which is \
                 missing",
            ));
        }
        let token_store = TokenStore::new(&raw.ledger, raw.cas_retries, token_limits.max_keys);
        Ok(Config {
            token_limits,
            token_store,
            prices_loaded: loaded.summary("the configuration"),
            prices: Rc::new(loaded.table),
            remote_prices,
            tenant,
            default_tenant,
            default_budget,
            tenant_budgets,
            over_budget_status: raw.over_budget_status,
            unknown_model: UnknownModel {
                action: raw.unknown_model.action,
                status: raw.unknown_model.status,
                default_price,
            },
            add_stream_usage: raw.add_stream_usage,
            identity_encoding: raw.identity_encoding,
            unpriced_charge: raw.unpriced_charge,
            unpriced_calls: raw.unpriced_calls,
            max_decoded_bytes: raw.max_decoded_bytes,
            max_request_body_bytes: bounded(
                raw.max_request_body_bytes,
                "max_request_body_bytes",
                0,
            )?,
            max_event_bytes: bounded(raw.max_event_bytes, "max_event_bytes", 256)?,
            spend_headers: raw.spend_headers,
            ledger: Ledger::new(&raw.ledger, raw.cas_retries, raw.max_tenants),
            store_full,
            global,
            allow_eviction: raw.allow_eviction,
            reservation: raw.reservation.checked()?,
            error_format: raw.error_format,
        })
    }

    /// Whether some tenant has a budget (the default one or one of `tenant_budgets`): then the
    /// ledger enforces something and must not live in an evicting zone.
    pub fn has_budgets(&self) -> bool {
        self.default_budget.is_limited() || self.tenant_budgets.values().any(Budget::is_limited)
    }

    /// Whether the shared data enforces something (a budget or a token limit), so that it must
    /// not live in an evicting zone.
    pub fn enforces(&self) -> bool {
        self.has_budgets() || self.token_limits.any()
    }

    /// The price of `model` in `table` (the table in use: `prices` or the remote one, looked up
    /// by `PriceTable::get`'s rules), else `unknown_model.default_price`.
    pub fn price<'a>(
        &'a self,
        table: &'a PriceTable,
        model: Option<&str>,
    ) -> Option<&'a ModelPrice> {
        model
            .and_then(|m| table.get(m))
            .or(self.unknown_model.default_price.as_ref())
    }

    /// Whether a request of a tenant (`budgeted`: it has a budget) naming `model` is refused
    /// before the upstream by the `unknown_model` policy (`table`: the table in use).
    pub fn refuses_model(&self, table: &PriceTable, model: &str, budgeted: bool) -> bool {
        if self.price(table, Some(model)).is_some() {
            return false;
        }
        match self.unknown_model.action {
            UnknownModelAction::Refuse => true,
            UnknownModelAction::RefuseBudgeted => budgeted,
            UnknownModelAction::Allow => false,
        }
    }

    /// The budget of `tenant`.
    pub fn budget(&self, tenant: &str) -> Budget {
        self.tenant_budgets
            .get(tenant)
            .copied()
            .unwrap_or(self.default_budget)
    }

    /// The tenant of a request: its verified identity (or trusted header), or `key-…` of its
    /// API key; `unauthenticated` when jwt-auth did not verify the request (never the client's
    /// own header); the default tenant when the value is absent or not a valid tenant name.
    ///
    /// # Errors
    /// A credential header (`api_key_header`, or `unverified_header: authorization`) that does
    /// not hold exactly one credential: the request is refused, never given a tenant of its own.
    pub fn tenant(&self, request: &impl IdentityView) -> Result<String, CredentialError> {
        let identity = match &self.tenant {
            TenantSource::Identity(source) => source.read(request),
            TenantSource::ApiKey(source) => match source.read(request) {
                Identity::Value(key) => return Ok(api_key_tenant(&key)),
                other => other,
            },
        };
        Ok(match identity {
            Identity::Invalid(e) => return Err(e),
            Identity::Unauthenticated => UNAUTHENTICATED.to_string(),
            Identity::Absent => self.default_tenant.clone(),
            Identity::Value(v) => match tollgate_common::bytes::utf8(&v) {
                Ok(s) if valid_tenant(s) => s.to_string(),
                _ => self.default_tenant.clone(),
            },
        })
    }
}

/// `key-` and the first 16 hex digits of SHA-256(`key`), `key` in canonical form
/// (`tollgate_common::credential`).
pub fn api_key_tenant(key: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key);
    let mut out = String::with_capacity(20);
    out.push_str("key-");
    for b in digest.iter().take(8) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}
