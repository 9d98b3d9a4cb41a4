//! jwt-auth: JWT authentication as a proxy-wasm HTTP filter, what users of Envoy's native
//! `jwt_authn` filter expect (providers, rules, remote JWKS, claim headers), on `jwt-simple`.
//!
//! - [`config`]: the plugin configuration (JSON) and its checks.
//! - [`keys`]: HMAC secrets, PEM keys and JWKS, one algorithm per key.
//! - [`rsa`]: RSA signature verification fast enough for Wasm (the RS*/PS* hot path).
//! - [`token`]: where a request carries its token.
//! - [`verify`]: signature, claims and route checks; the reasons for refusals.
//! - [`cache`]: the per-VM verified-token cache.
//! - [`counters`]: the filter's counters, declared once.
//! - wasm32 only: `filter` (jwt-auth on the filters' skeleton, a thin shell) and
//!   `request_headers` (the request's headers as it reads and strips them).

pub mod cache;
pub mod config;
pub mod counters;
pub mod keys;
pub mod rsa;
pub mod token;
pub mod verify;

#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod request_headers;
