//! What Tollgate's proxy-wasm filters share.
//!
//! Host-free pieces (configuration parsing with field-named errors, HTTP error bodies, header
//! value checks, route matching, metric naming) are plain Rust, unit-tested on the native target.
//! [`host_calls`] is the thin layer over the proxy-wasm ABI (the filters' host calls, never
//! trapping); it compiles only for `wasm32`, as the [`skeleton`]'s contexts do.

pub mod abi_codec;
pub mod authority;
pub mod bytes;
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
pub mod remote;
pub mod rls;
pub mod route;
pub mod shared_data;
pub mod signals;
pub mod skeleton;

/// The allocator of every filter on wasm32: Rust's port of dlmalloc as the global allocator,
/// so that `Box`, `Vec` and `String` call it directly instead of through std's wrappers and
/// wasi-libc's `malloc`/`free` (the same algorithm, four calls deep): 1.7% fewer instructions
/// per request for the likely stack (bench/results/instructions_alloc.md). wasi-libc keeps its
/// own heap for libc's few allocations, so no filter may export `malloc`, which a host would
/// use instead of `proxy_on_memory_allocate` (tests/e2e/test_wasm_exports.py).
#[cfg(target_family = "wasm")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[cfg(target_arch = "wasm32")]
pub mod host_calls;
#[cfg(target_arch = "wasm32")]
pub mod raw;
#[cfg(target_arch = "wasm32")]
pub mod remote_fetch;
