//! The skeleton every filter is built on: the proxy-wasm root and HTTP contexts, written once and
//! generic over the filter ([`Filter`]), so that a filter's `filter.rs` holds only what is its
//! own.
//!
//! - [`contexts`]: the root context (the plugin configuration read, parsed and refused with a log
//!   line naming the field; ticks; the root's call replies) and the HTTP context (the "not
//!   configured" refusal, then the filter's phases). Monomorphised per filter: no dynamic
//!   dispatch beyond the SDK's own per callback.
//! - [`request_stage`]: what a filter reads of the request before its rules: the path's normal
//!   form and the canonical host, each refused (400), counted and published in one way.
//! - [`global_call`]: a call to the rate limit service as every filter makes it: the circuit
//!   breaker, failures counted by reason, `on_error` applied and counted, one log line per
//!   interval.

#[cfg(target_arch = "wasm32")]
pub mod contexts;
#[cfg(target_arch = "wasm32")]
pub mod global_call;
#[cfg(target_arch = "wasm32")]
pub mod request_stage;

#[cfg(target_arch = "wasm32")]
pub use contexts::{Filter, FilterConfig};
