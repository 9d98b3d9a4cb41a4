//! The proxy-wasm ABI (module `env`), one file per area of the spec, each with its own
//! `define`, over the shared [`store`] (the `Store`'s state, guest memory access, status codes).
//! `crate::link` puts them together with WASI.

pub(crate) mod buffers;
pub(crate) mod foreign_functions;
pub(crate) mod grpc_calls;
pub(crate) mod header_maps;
pub(crate) mod http_calls;
pub(crate) mod log_time;
pub(crate) mod metrics;
pub(crate) mod properties;
pub(crate) mod shared_data;
pub(crate) mod shared_queues;
pub(crate) mod store;
pub(crate) mod stream_control;
