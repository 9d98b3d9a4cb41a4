//! Values the filters pass to each other (the metrics filter) and to access logs: proxy-wasm
//! properties under `tollgate.<filter>.<field>`, written with `proxy_set_property` and read with
//! `proxy_get_property` on the same request. Envoy keeps them as filter state
//! `wasm.tollgate.<filter>.<field>` (access logs: `%FILTER_STATE(wasm.tollgate.cost.cost_nano_usd:PLAIN)%`).
//! Never headers: a client can neither see nor forge them. Values are UTF-8 text: decimal
//! integers, or names from a fixed vocabulary (snake case).

/// jwt-auth's outcome: `ok`, `bypass`, `invalid_path`, or the refusal reason (`expired`,
/// `bad_signature`, ...).
pub const JWT_AUTH_RESULT: &str = "tollgate.jwt_auth.result";
/// The prefix of the properties by which jwt-auth hands a verified claim header to later
/// filters: `tollgate.jwt_auth.header.<header name>` holds the value jwt-auth wrote into that
/// request header, set only when it verified this request's token (result `ok`).
pub const JWT_AUTH_HEADER_PREFIX: &str = "tollgate.jwt_auth.header.";
/// rate-limit's decision: `allowed`, `limited`, `contention_allowed`, `contention_denied`,
/// `missing_key_denied`, `missing_key_allowed`, `invalid_weight`, `invalid_path`.
pub const RATE_LIMIT_DECISION: &str = "tollgate.rate_limit.decision";
/// The name of the rate-limit rule that matched.
pub const RATE_LIMIT_RULE: &str = "tollgate.rate_limit.rule";
/// cost: the model the request was priced for.
pub const COST_MODEL: &str = "tollgate.cost.model";
/// cost: the tenant the spend was booked to.
pub const COST_TENANT: &str = "tollgate.cost.tenant";
/// cost: input (prompt) tokens, including cached ones.
pub const COST_INPUT_TOKENS: &str = "tollgate.cost.input_tokens";
/// cost: output (completion) tokens, including reasoning ones.
pub const COST_OUTPUT_TOKENS: &str = "tollgate.cost.output_tokens";
/// cost: the request's price in nano-USD (10^-9 USD), a decimal integer.
pub const COST_NANO_USD: &str = "tollgate.cost.cost_nano_usd";
/// cost: `priced`, `estimated` (an LLM response that could not be priced, charged the estimate),
/// `unpriced` (not charged), or a refusal before the upstream: `budget_exceeded`,
/// `store_failure` (the ledger could not be read or stored), `unknown_model`,
/// `request_too_large`.
pub const COST_STATUS: &str = "tollgate.cost.status";

/// The property of verified claim header `header` (lower case): see [`JWT_AUTH_HEADER_PREFIX`].
pub fn verified_header(header: &str) -> String {
    format!("{JWT_AUTH_HEADER_PREFIX}{header}")
}

/// Sets a property for the current request; a host error is logged, never fatal.
#[cfg(target_arch = "wasm32")]
pub fn set(name: &str, value: &str) {
    if let Err(status) = crate::host::set_property(&[name], value.as_bytes()) {
        log::debug!("could not set property {name}: host status {status}");
    }
}

/// A property set by a filter earlier on this request (`None` if unset or not UTF-8).
#[cfg(target_arch = "wasm32")]
pub fn get(name: &str) -> Option<String> {
    crate::host::property(&[name]).and_then(|b| String::from_utf8(b).ok())
}
