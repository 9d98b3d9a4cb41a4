//! What each filter decided on a request, for the metrics filter and for access logs: one
//! proxy-wasm property per filter, `wasmx.tollgate.<filter>`, holding one logfmt line
//! (`crate::logfmt`), e.g. `outcome=priced model=gpt-4o-mini tenant=alice input_tokens=1000
//! output_tokens=500 cost_nano_usd=450000`. Written once with `proxy_set_property` where the
//! filter decides, read once with `proxy_get_property` by the metrics filter on the same
//! request: one host call each way per filter, whatever the number of fields.
//!
//! One namespace every host accepts for a filter's own keys: Kong's ngx_wasm_module takes only
//! `wasmx.*` (its "host properties", per request; docs/PROXY_WASM.md) besides its mapped
//! attributes and `ngx.*`, and answers NotFound for anything else. Envoy keeps any unknown path
//! as filter state `wasm.<path>` (access logs: `%FILTER_STATE(wasm.wasmx.tollgate.cost:PLAIN)%`);
//! Tollgate's nginx host keeps them per request. Never headers: a client can neither see nor
//! forge them.
//!
//! One vocabulary for outcomes: each filter that decides publishes what it decided as the
//! field `outcome` of its line, and counts it in `tollgate_<filter>_requests_total` under the
//! label `outcome`, with the same words. Until 2026-11-29 each field was a property of its own
//! (`wasmx.tollgate.cost.outcome`, ...: the field `outcome` of `wasmx.tollgate.cost` now).

/// jwt-auth's line. `outcome`: `ok`, `bypass`, `invalid_path`, `invalid_authority`,
/// `headers_unavailable`, or the refusal reason (`expired`, `bad_signature`, ...).
pub const JWT_AUTH: &str = "wasmx.tollgate.jwt_auth";
/// The prefix of the properties by which jwt-auth hands a verified claim header to later
/// filters: `wasmx.tollgate.jwt_auth.header.<header name>` holds the value jwt-auth wrote into that
/// request header, set only when it verified this request's token (outcome `ok`).
pub const JWT_AUTH_HEADER_PREFIX: &str = "wasmx.tollgate.jwt_auth.header.";
/// rate-limit's line. `outcome`: `allowed`, `limited`, `contention_allowed`,
/// `contention_denied`, `missing_key_denied`, `missing_key_allowed`, `invalid_weight`,
/// `invalid_credential`, `store_failure_allowed`, `store_failure_denied`,
/// `global_error_allowed`, `global_error_denied`, `invalid_path`, `invalid_authority`; `rule`:
/// the name of the rule that matched.
pub const RATE_LIMIT: &str = "wasmx.tollgate.rate_limit";
/// cost's line. `outcome`: `priced`, `estimated` (an LLM response that could not be priced,
/// charged the estimate), `unpriced` (not charged), or a refusal before the upstream:
/// `budget_exceeded`, `store_failure` (the ledger could not be read or stored),
/// `unknown_model`, `request_too_large`, `invalid_credential`, `unreadable_body`,
/// `global_unavailable`, ... Then `tenant`, `model`, the token counts and `cost_nano_usd`
/// where known ([`field`]).
pub const COST: &str = "wasmx.tollgate.cost";

/// The fields' keys.
pub mod field {
    /// What the filter decided (every line has it).
    pub const OUTCOME: &str = "outcome";
    /// rate-limit: the rule that matched.
    pub const RULE: &str = "rule";
    /// cost: the model the request was priced for.
    pub const MODEL: &str = "model";
    /// cost: the tenant the spend was booked to.
    pub const TENANT: &str = "tenant";
    /// cost: input (prompt) tokens, including cached ones.
    pub const INPUT_TOKENS: &str = "input_tokens";
    /// cost: output (completion) tokens, including reasoning ones.
    pub const OUTPUT_TOKENS: &str = "output_tokens";
    /// cost: input tokens read from the provider's prompt cache (part of the input tokens;
    /// OpenAI `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`);
    /// absent when 0.
    pub const CACHED_INPUT_TOKENS: &str = "cached_input_tokens";
    /// cost: input tokens written to the provider's prompt cache (part of the input tokens;
    /// Anthropic `cache_creation_input_tokens`); absent when 0.
    pub const CACHE_CREATION_INPUT_TOKENS: &str = "cache_creation_input_tokens";
    /// cost: reasoning tokens (part of the output tokens; OpenAI
    /// `completion_tokens_details.reasoning_tokens`); absent when 0.
    pub const REASONING_TOKENS: &str = "reasoning_tokens";
    /// cost: the request's price in nano-USD (10^-9 USD), a decimal integer.
    pub const COST_NANO_USD: &str = "cost_nano_usd";
    /// cost: microseconds from its request headers to the first response body bytes it passed
    /// on (the metrics filter's time to first token); absent when the response had none.
    pub const FIRST_BYTE_US: &str = "first_byte_us";
}

/// The property of verified claim header `header` (lower case): see [`JWT_AUTH_HEADER_PREFIX`].
pub fn verified_header(header: &str) -> String {
    format!("{JWT_AUTH_HEADER_PREFIX}{header}")
}

/// Whether a filter's line (as read) has outcome `outcome`.
pub fn has_outcome(line: &[u8], outcome: &str) -> bool {
    crate::logfmt::value(line, field::OUTCOME).as_deref() == Some(outcome)
}

/// Publishes a filter's line for the current request (`property`: [`JWT_AUTH`],
/// [`RATE_LIMIT`], [`COST`]); a host error is logged, never fatal.
#[cfg(target_arch = "wasm32")]
pub fn publish(property: &str, line: &crate::logfmt::Line) {
    set(property, line.as_str());
}

/// Publishes a line with only its outcome ([`publish_fields`]).
#[cfg(target_arch = "wasm32")]
pub fn publish_outcome(property: &str, outcome: &str) {
    publish_fields(property, &[(field::OUTCOME, outcome)]);
}

/// Publishes a line of `fields` (key, value), in order. Values written bare (the filters' fixed
/// vocabulary, most rule names) are put together on the stack, with no allocation on the
/// per-request path; others go through [`crate::logfmt::Line`].
#[cfg(target_arch = "wasm32")]
pub fn publish_fields(property: &str, fields: &[(&str, &str)]) {
    let mut buf = [0u8; 128];
    if let Some(line) = crate::logfmt::bare_line(&mut buf, fields) {
        set_bytes(property, line);
        return;
    }
    let mut line = crate::logfmt::Line::new();
    for (key, value) in fields {
        line.text(key, value);
    }
    publish(property, &line);
}

#[cfg(target_arch = "wasm32")]
fn set_bytes(name: &str, value: &[u8]) {
    if let Err(status) = crate::host_calls::set_property(&[name], value) {
        log::debug!("could not set property {name}: host status {status}");
    }
}

/// Sets a property for the current request; a host error is logged, never fatal.
#[cfg(target_arch = "wasm32")]
pub fn set(name: &str, value: &str) {
    set_bytes(name, value.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kong's ngx_wasm_module answers NotFound to `proxy_set_property` outside `wasmx.*` (and
    /// `ngx.*` and its mapped attributes): a signal elsewhere would be lost there.
    #[test]
    fn every_signal_is_under_wasmx_tollgate() {
        for name in [JWT_AUTH, JWT_AUTH_HEADER_PREFIX, RATE_LIMIT, COST] {
            assert!(name.starts_with("wasmx.tollgate."), "{name}");
        }
        assert_eq!(
            verified_header("x-jwt-sub"),
            "wasmx.tollgate.jwt_auth.header.x-jwt-sub"
        );
    }

    #[test]
    fn outcome_is_read_from_the_line() {
        assert!(has_outcome(b"outcome=ok", "ok"));
        assert!(has_outcome(b"outcome=ok rule=x", "ok"));
        assert!(!has_outcome(b"outcome=okay", "ok"));
        assert!(!has_outcome(b"rule=\"outcome=ok\"", "ok"));
        assert!(!has_outcome(b"ok", "ok"));
        assert!(!has_outcome(b"", "ok"));
    }
}
