//! sticky-upstream: cookie session affinity as a proxy-wasm HTTP filter, what users of nginx's
//! `sticky cookie` and Envoy's `stateful_session` filter (cookie-based session state) expect.
//! The filter pins a client to one upstream with a signed cookie and hands the choice to the
//! proxy's routing through a request header (Envoy: a route with `cluster_header`, one cluster
//! per upstream).
//!
//! - [`config`]: the plugin configuration (JSON) and its checks.
//! - [`cookie_value`]: the cookie value (upstream, expiry, HMAC-SHA256 tag), signing and
//!   verification.
//! - [`cookie_cache`]: the per-VM cache of values that verified, bounded and keyed.
//! - [`choose`]: weighted and hash-of-key choice of an upstream; the random source.
//! - [`counters`]: the filter's counters, declared once.
//! - [`sticky`]: the request and response decisions (cookie parsing, expiry, re-pinning).
//! - `filter` (wasm32 only): the proxy-wasm root and HTTP contexts, a thin shell over the above.

pub mod choose;
pub mod config;
pub mod cookie_cache;
pub mod cookie_value;
pub mod counters;
pub mod sticky;

#[cfg(target_arch = "wasm32")]
mod filter;
