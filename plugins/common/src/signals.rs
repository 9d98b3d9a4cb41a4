//! Values the filters pass to each other (the metrics filter) and to access logs: proxy-wasm
//! properties under `wasmx.tollgate.<filter>.<field>`, written with `proxy_set_property` and read
//! with `proxy_get_property` on the same request. One namespace every host accepts for a
//! filter's own keys: Kong's ngx_wasm_module takes only `wasmx.*` (its "host properties", per
//! request; docs/PROXY_WASM.md) besides its mapped attributes and `ngx.*`, and answers NotFound
//! for anything else. Envoy keeps any unknown path as filter state `wasm.<path>` (access logs:
//! `%FILTER_STATE(wasm.wasmx.tollgate.cost.cost_nano_usd:PLAIN)%`); Tollgate's nginx host keeps
//! them per request.
//! Never headers: a client can neither see nor forge them. Values are UTF-8 text: decimal
//! integers, or names from a fixed vocabulary (snake case).

/// jwt-auth's outcome: `ok`, `bypass`, `invalid_path`, or the refusal reason (`expired`,
/// `bad_signature`, ...).
pub const JWT_AUTH_RESULT: &str = "wasmx.tollgate.jwt_auth.result";
/// The prefix of the properties by which jwt-auth hands a verified claim header to later
/// filters: `wasmx.tollgate.jwt_auth.header.<header name>` holds the value jwt-auth wrote into that
/// request header, set only when it verified this request's token (result `ok`).
pub const JWT_AUTH_HEADER_PREFIX: &str = "wasmx.tollgate.jwt_auth.header.";
/// rate-limit's decision: `allowed`, `limited`, `contention_allowed`, `contention_denied`,
/// `missing_key_denied`, `missing_key_allowed`, `invalid_weight`, `invalid_path`.
pub const RATE_LIMIT_DECISION: &str = "wasmx.tollgate.rate_limit.decision";
/// The name of the rate-limit rule that matched.
pub const RATE_LIMIT_RULE: &str = "wasmx.tollgate.rate_limit.rule";
/// cost: the model the request was priced for.
pub const COST_MODEL: &str = "wasmx.tollgate.cost.model";
/// cost: the tenant the spend was booked to.
pub const COST_TENANT: &str = "wasmx.tollgate.cost.tenant";
/// cost: input (prompt) tokens, including cached ones.
pub const COST_INPUT_TOKENS: &str = "wasmx.tollgate.cost.input_tokens";
/// cost: output (completion) tokens, including reasoning ones.
pub const COST_OUTPUT_TOKENS: &str = "wasmx.tollgate.cost.output_tokens";
/// cost: the request's price in nano-USD (10^-9 USD), a decimal integer.
pub const COST_NANO_USD: &str = "wasmx.tollgate.cost.cost_nano_usd";
/// cost: `priced`, `estimated` (an LLM response that could not be priced, charged the estimate),
/// `unpriced` (not charged), or a refusal before the upstream: `budget_exceeded`,
/// `store_failure` (the ledger could not be read or stored), `unknown_model`,
/// `request_too_large`.
pub const COST_STATUS: &str = "wasmx.tollgate.cost.status";

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Kong's ngx_wasm_module answers NotFound to `proxy_set_property` outside `wasmx.*` (and
    /// `ngx.*` and its mapped attributes): a signal elsewhere would be lost there.
    #[test]
    fn every_signal_is_under_wasmx_tollgate() {
        for name in [
            JWT_AUTH_RESULT,
            JWT_AUTH_HEADER_PREFIX,
            RATE_LIMIT_DECISION,
            RATE_LIMIT_RULE,
            COST_MODEL,
            COST_TENANT,
            COST_INPUT_TOKENS,
            COST_OUTPUT_TOKENS,
            COST_NANO_USD,
            COST_STATUS,
        ] {
            assert!(name.starts_with("wasmx.tollgate."), "{name}");
        }
        assert_eq!(
            verified_header("x-jwt-sub"),
            "wasmx.tollgate.jwt_auth.header.x-jwt-sub"
        );
    }
}
