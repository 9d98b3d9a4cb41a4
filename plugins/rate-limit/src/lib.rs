//! rate-limit: request rate limits whose state lives in proxy-wasm shared data, updated with
//! compare-and-swap, so that a limit holds for the whole gateway rather than per worker VM.
//!
//! - [`config`]: the plugin configuration (JSON) and its checks.
//! - [`algorithm`]: token bucket and fixed window, pure functions of (state, now, weight).
//! - [`state`]: the compact binary encoding of the shared-data values.
//! - [`key`]: the client key of a request and the shared-data keys.
//! - [`limiter`]: the CAS loop, key creation under the zone lock, several limits per rule.
//! - [`counters`]: the filter's counters, declared once.
//! - [`global`]: global mode's `ShouldRateLimit` request and verdict (Envoy's rate limit service).
//! - [`headers`]: RateLimit-Policy, RateLimit (draft-ietf-httpapi-ratelimit-headers-10) and
//!   Retry-After.
//! - wasm32 only: `filter` (rate-limit on the filters' skeleton, a thin shell), `worker` (what
//!   the root context shares with the requests), `admission` (one request: the request stage,
//!   the first matching rule, its limits in either mode), `answer` (how a verdict answers the
//!   request), `request_view` (the request as keys and rules read it).

pub mod algorithm;
pub mod config;
pub mod counters;
pub mod global;
pub mod headers;
pub mod key;
pub mod limiter;
pub mod state;

#[cfg(target_arch = "wasm32")]
mod admission;
#[cfg(target_arch = "wasm32")]
mod answer;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod request_view;
#[cfg(target_arch = "wasm32")]
mod worker;
