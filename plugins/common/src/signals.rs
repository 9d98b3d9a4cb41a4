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
//!
//! One vocabulary for outcomes: each filter that decides publishes what it decided in
//! `wasmx.tollgate.<filter>.outcome`, and counts it in `tollgate_<filter>_requests_total` under
//! the label `outcome`, with the same words.

/// jwt-auth's outcome: `ok`, `bypass`, `invalid_path`, `invalid_authority`,
/// `headers_unavailable`, or the refusal reason (`expired`, `bad_signature`, ...). Named
/// `wasmx.tollgate.jwt_auth.result` before 2026-11-28.
pub const JWT_AUTH_OUTCOME: &str = "wasmx.tollgate.jwt_auth.outcome";
/// The prefix of the properties by which jwt-auth hands a verified claim header to later
/// filters: `wasmx.tollgate.jwt_auth.header.<header name>` holds the value jwt-auth wrote into that
/// request header, set only when it verified this request's token (result `ok`).
pub const JWT_AUTH_HEADER_PREFIX: &str = "wasmx.tollgate.jwt_auth.header.";
/// rate-limit's outcome: `allowed`, `limited`, `contention_allowed`, `contention_denied`,
/// `missing_key_denied`, `missing_key_allowed`, `invalid_weight`, `invalid_credential`,
/// `store_failure_allowed`, `store_failure_denied`, `global_error_allowed`,
/// `global_error_denied`, `invalid_path`, `invalid_authority`. Named
/// `wasmx.tollgate.rate_limit.decision` before 2026-11-28.
pub const RATE_LIMIT_OUTCOME: &str = "wasmx.tollgate.rate_limit.outcome";
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
/// cost: input tokens read from the provider's prompt cache (part of the input tokens; OpenAI
/// `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`).
pub const COST_CACHED_INPUT_TOKENS: &str = "wasmx.tollgate.cost.cached_input_tokens";
/// cost: input tokens written to the provider's prompt cache (part of the input tokens;
/// Anthropic `cache_creation_input_tokens`).
pub const COST_CACHE_CREATION_INPUT_TOKENS: &str =
    "wasmx.tollgate.cost.cache_creation_input_tokens";
/// cost: reasoning tokens (part of the output tokens; OpenAI
/// `completion_tokens_details.reasoning_tokens`).
pub const COST_REASONING_TOKENS: &str = "wasmx.tollgate.cost.reasoning_tokens";
/// cost: the request's price in nano-USD (10^-9 USD), a decimal integer.
pub const COST_NANO_USD: &str = "wasmx.tollgate.cost.cost_nano_usd";
/// cost's outcome: `priced`, `estimated` (an LLM response that could not be priced, charged the
/// estimate), `unpriced` (not charged), or a refusal before the upstream: `budget_exceeded`,
/// `store_failure` (the ledger could not be read or stored), `unknown_model`,
/// `request_too_large`, `invalid_credential`, `unreadable_body`, `global_unavailable`. Named
/// `wasmx.tollgate.cost.status` before 2026-11-28.
pub const COST_OUTCOME: &str = "wasmx.tollgate.cost.outcome";

/// The property of verified claim header `header` (lower case): see [`JWT_AUTH_HEADER_PREFIX`].
pub fn verified_header(header: &str) -> String {
    format!("{JWT_AUTH_HEADER_PREFIX}{header}")
}

/// Sets a property for the current request; a host error is logged, never fatal.
#[cfg(target_arch = "wasm32")]
pub fn set(name: &str, value: &str) {
    if let Err(status) = crate::host_calls::set_property(&[name], value.as_bytes()) {
        log::debug!("could not set property {name}: host status {status}");
    }
}

/// A property set by a filter earlier on this request (`None` if unset or not UTF-8).
#[cfg(target_arch = "wasm32")]
pub fn get(name: &str) -> Option<String> {
    crate::host_calls::property(&[name]).and_then(|b| String::from_utf8(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kong's ngx_wasm_module answers NotFound to `proxy_set_property` outside `wasmx.*` (and
    /// `ngx.*` and its mapped attributes): a signal elsewhere would be lost there.
    #[test]
    fn every_signal_is_under_wasmx_tollgate() {
        for name in [
            JWT_AUTH_OUTCOME,
            JWT_AUTH_HEADER_PREFIX,
            RATE_LIMIT_OUTCOME,
            RATE_LIMIT_RULE,
            COST_MODEL,
            COST_TENANT,
            COST_INPUT_TOKENS,
            COST_OUTPUT_TOKENS,
            COST_CACHED_INPUT_TOKENS,
            COST_CACHE_CREATION_INPUT_TOKENS,
            COST_REASONING_TOKENS,
            COST_NANO_USD,
            COST_OUTCOME,
        ] {
            assert!(name.starts_with("wasmx.tollgate."), "{name}");
        }
        assert_eq!(
            verified_header("x-jwt-sub"),
            "wasmx.tollgate.jwt_auth.header.x-jwt-sub"
        );
    }
}
