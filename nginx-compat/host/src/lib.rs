//! `tollgate-host`: a proxy-wasm host (ABI 0.2.1 and 0.2.0) on wasmtime that knows nothing of
//! nginx. The nginx module (`nginx-compat/module`) and the in-process tests drive the filters
//! through this API.
//!
//! Model (the proxy-wasm ABI, <https://github.com/proxy-wasm/spec>, versions 0.2.1 and 0.2.0):
//! - [`Engine`] compiles a `.wasm` once (in the nginx master, before fork: no thread outlives
//!   the call), or loads its compiled code from a [`CompiledCache`].
//! - [`Vm`] is one instance of a [`Module`] in one worker (one `Store`); it holds the root
//!   contexts of the plugins that use that module and the HTTP contexts of live streams.
//! - [`Stream`] is the per-request state shared by every filter of a chain (header maps, body
//!   buffers, properties set by filters, the local response). It is lent to the `Store` for
//!   the duration of a callback, by pointer (a move in and out cost about 150 instructions a
//!   call): `abi::store`'s `LentStream` ends the loan when the call returns.
//! - [`Host`] is what the embedding provides per worker: logging, shared data, metrics, shared
//!   queues, HTTP and unary gRPC calls, timers. Lazily computed properties come from [`Stream::properties`]'s
//!   fallback ([`PropertySource`]).
//!
//! [`testing::MemoryHost`] is an in-memory [`Host`] for tests.

mod abi;
// Loading compiled code is loading native code (wasmtime's `Module::deserialize`), and the
// entries' owner is checked against `geteuid`. With the lent stream (`State::stream`), the only
// `unsafe` of this crate, each block with its SAFETY comment.
mod combined_calls;
#[allow(unsafe_code)]
mod compiled_cache;
mod context_ids;
mod deferred_headers;
mod embedder;
mod engine;
mod error;
mod guest_call;
mod header_map;
mod limits;
mod link;
mod mem;
mod property_store;
mod stream;
mod stubs;
pub mod testing;
mod valid;
mod vm;
mod wasi;

pub use abi::store::tick_generation;
pub use compiled_cache::{CacheNote, CompiledCache};
pub use context_ids::{HttpId, RootId};
pub use deferred_headers::{DeferredMap, HeaderEdit, HeaderSource, MAX_EDITS};
pub use embedder::{
    GrpcCall, GrpcCallResult, Host, HttpCall, HttpCallResponse, LogLevel, MetricKind, Status,
};
pub use engine::{AbiVersion, Engine, Module};
pub use error::Error;
pub use header_map::HeaderMap;
pub use limits::{EpochTicker, GuestLimits, EPOCH_TICK};
pub use property_store::PropertyStore;
pub use stream::{Action, LocalResponse, PropertySource, Stream, StreamCallback};
pub use vm::Vm;
