//! What Tollgate's proxy-wasm filters share.
//!
//! Host-free pieces (configuration parsing with field-named errors, HTTP error bodies, header
//! value checks, route matching, metric naming) are plain Rust, unit-tested on the native target.
//! [`host`] is the thin layer over the proxy-wasm ABI; it compiles only for `wasm32`.

pub mod abi_codec;
pub mod bytes;
pub mod config;
pub mod http;
pub mod identity;
pub mod log_every;
pub mod metrics;
pub mod path;
pub mod remote;
pub mod rls;
pub mod route;
pub mod shared_data;
pub mod signals;

#[cfg(target_arch = "wasm32")]
pub mod host;
#[cfg(target_arch = "wasm32")]
pub mod raw;
#[cfg(target_arch = "wasm32")]
pub mod remote_fetch;
