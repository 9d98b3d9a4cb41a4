//! What Tollgate's proxy-wasm filters share.
//!
//! Host-free pieces (configuration parsing with field-named errors, HTTP error bodies, header
//! value checks, route matching, metric naming) are plain Rust, unit-tested on the native target.
//! [`host_calls`] is the thin layer over the proxy-wasm ABI (the filters' host calls, never
//! trapping); it compiles only for `wasm32`, as the [`skeleton`]'s contexts do.

pub mod abi_codec;
pub mod allocator;
pub mod arith;
pub mod authority;
pub mod bytes;
pub mod clock;
pub mod config;
pub mod credential;
pub mod error_envelope;
pub mod eviction;
pub mod http;
pub mod identity;
pub mod log_every;
pub mod logfmt;
pub mod metric_help;
pub mod metrics;
pub mod path;
pub mod prefetch;
pub mod remote;
pub mod rls;
pub mod route;
pub mod shared_data;
pub mod signals;
pub mod skeleton;

#[cfg(target_arch = "wasm32")]
pub mod host_calls;
#[cfg(target_arch = "wasm32")]
pub mod raw;
#[cfg(target_arch = "wasm32")]
pub mod remote_fetch;
