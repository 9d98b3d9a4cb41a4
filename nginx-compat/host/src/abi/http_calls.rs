//! Calls out of a filter: `proxy_http_call` (checked like Envoy: `:method`, `:path`,
//! `:authority`; at most [`valid::MAX_PENDING_CALLS`] pending per instance). gRPC calls are
//! linked to the `Unimplemented` stub; `proxy_call_foreign_function` is in `foreign_functions`.

use crate::abi::store::{
    code, guest_str, ms, refused_map, Def, BAD_ARGUMENT, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, OK,
};
use crate::embedder::{HttpCall, LogLevel};
use crate::error::Error;
use crate::mem;
use crate::valid;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_http_call",
        |mut c: C<'_>,
         up: u32,
         ul: u32,
         hp: u32,
         hl: u32,
         bp: u32,
         bl: u32,
         tp: u32,
         tl: u32,
         timeout_ms: u32,
         ret_token: u32|
         -> u32 {
            let upstream = match guest_str(&mut c, up, ul) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(headers), Some(body), Some(trailers)) = (
                mem::slice(mem, hp, hl),
                mem::slice(mem, bp, bl),
                mem::slice(mem, tp, tl),
            ) else {
                return INVALID_MEMORY_ACCESS;
            };
            let (Some(headers), Some(trailers)) = (
                mem::deserialize(headers, true),
                mem::deserialize(trailers, true),
            ) else {
                return BAD_ARGUMENT;
            };
            const F: &str = "proxy_http_call";
            if let Some(code) =
                refused_map(state, F, &headers).or_else(|| refused_map(state, F, &trailers))
            {
                return code;
            }
            // Envoy refuses a call without :method, :path and :authority.
            let has = |name: &[u8]| headers.iter().any(|(k, _)| k == name);
            if !has(b":method") || !has(b":path") || !has(b":authority") {
                return BAD_ARGUMENT;
            }
            if mem::slice(mem, ret_token, 4).is_none() {
                return INVALID_MEMORY_ACCESS;
            }
            if state.calls.len() >= valid::MAX_PENDING_CALLS {
                let msg = format!(
                    "{F}: refused: {} calls of this instance are pending",
                    valid::MAX_PENDING_CALLS
                );
                state.log(LogLevel::Warn, msg.as_bytes());
                return INTERNAL_FAILURE;
            }
            let token = state.next_token;
            state.next_token = token.checked_add(1).unwrap_or(1);
            let call = HttpCall {
                token,
                upstream,
                headers,
                body: body.to_vec(),
                trailers,
                timeout_ms,
            };
            if let Err(s) = state.host.dispatch_http_call(call) {
                return code(s);
            }
            let ctx = state.effective;
            state.calls.insert(token, ctx);
            state.dispatched = state.dispatched.wrapping_add(1);
            if mem::write_u32(mem, ret_token, token) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            }
        },
    )?;
    Ok(())
}
