//! `ngx_http_tollgate_wasm_module`: an nginx dynamic module that runs Tollgate's proxy-wasm
//! filters (the same `.wasm` files Envoy runs) in stock nginx, configured with the directives of
//! Kong's ngx_wasm_module (`wasm { module ...; shm_kv ...; }`, `proxy_wasm`,
//! `proxy_wasm_isolation`, `proxy_wasm_request_headers_in_access`).
//!
//! The `.so` holds three nginx modules:
//! - [`wasm_block::ngx_tollgate_wasm_core_module`] (`NGX_CORE_MODULE`): the top-level `wasm {}` block.
//!   Modules are compiled there, in the master, at configuration time.
//! - [`kong_directives::ngx_tollgate_wasm_kong_module`] (`NGX_CORE_MODULE`): ngx_wasm_module's
//!   other `wasm{}` directives (sockets, resolver, `wasmtime{}`, `metrics{}`, `tls_*`...).
//! - [`http_module::ngx_http_tollgate_wasm_module`] (`NGX_HTTP_MODULE`): `proxy_wasm` chains, the phase
//!   handlers (rewrite or access, log), the header and body filters, and `tollgate_metrics`.
//!
//! The proxy-wasm ABI itself is `tollgate-host` (wasmtime); this crate only maps nginx's request
//! to its [`tollgate_host::Stream`] and back. References: the nginx development guide
//! (<https://nginx.org/en/docs/dev/development_guide.html>), ngx_wasm_module's
//! `docs/DIRECTIVES.md`, and the proxy-wasm ABI spec (<https://github.com/proxy-wasm/spec>).
#![allow(unsafe_code)] // FFI with nginx: every block carries a SAFETY comment.
#![allow(non_upper_case_globals)] // nginx's module symbols are lower-case by convention.
#![allow(clippy::missing_safety_doc)] // extern "C" callbacks; contracts are nginx's.

// Where to look (imports go down this list, never up; `scripts/check-module-cycles.py`):
// - the module tables nginx loads: `wasm_block/` (the `wasm {}` block: a file per group of its
//   directives, `wasm_block/mod.rs` says which), `http_module.rs`;
// - configuration: `command_table.rs` (how the directive tables are built, the levels a
//   directive is allowed at), `directives.rs` (the http directives), `kong_directives/`
//   (ngx_wasm_module's other directives: honoured, tuning or refused; `kong_directives/mod.rs`
//   says which file has which), `lifecycle.rs` (postconfiguration,
//   worker start and exit), `conf.rs` (what the directives build), `conf_file.rs`
//   (configurations read from files: `tollgate_proxy_wasm_file`, `tollgate_module_file`);
// - the request path: `phases.rs` (request side), `response_filters.rs` (response side),
//   `actions.rs` (a run's outcome to an nginx action), `timers.rs` (the eventfd handler, poll
//   and tick timers), `calls.rs` (HTTP call completions, the delivery of any call's),
//   `grpc_calls.rs` (gRPC call completions), `wake.rs` (the worker's eventfd), `request/`
//   (per-request state and callbacks: `request/mod.rs` says which file has which);
// - the worker: `worker.rs` (instances, root contexts), `worker_host.rs` (the `Host` over
//   the shared-memory services), `metrics_endpoint.rs` (`tollgate_metrics`, metric zones) over
//   `metrics_text.rs` (what that endpoint answers, nginx-free);
// - nginx data: `headers.rs`, `headers_in_place.rs` (the header lists read and edited in place
//   while the filters' maps are deferred), `body.rs`, `props.rs` (over `attributes.rs`, nginx-free),
//   `table_elts.rs` (walking a header list), `upstreams.rs`, `util.rs`, and `base.rs` (the HTTP
//   module's statics and typed configuration access).
pub mod actions;
pub mod attributes;
pub mod base;
pub mod body;
pub mod calls;
pub mod command_table;
pub mod conf;
pub mod conf_file;
pub mod decimal;
pub mod directives;
pub mod grpc_calls;
pub mod header_names;
pub mod headers;
pub mod headers_in_place;
pub mod http_module;
pub mod kong_directives;
pub mod lifecycle;
pub mod metrics_endpoint;
pub mod metrics_text;
pub mod phases;
pub mod props;
pub mod request;
pub mod response_filters;
pub mod table_elts;
pub mod timers;
pub mod typed_fields;
pub mod upstreams;
pub mod util;
pub mod wake;
pub mod wasm_block;
pub mod worker;
pub mod worker_host;
pub mod zone_props;

use crate::http_module::ngx_http_tollgate_wasm_module;
use crate::kong_directives::ngx_tollgate_wasm_kong_module;
use crate::wasm_block::ngx_tollgate_wasm_core_module;

/// The modules of this shared object, in load order (read by nginx's `load_module`).
/// (`ngx::ngx_modules!` of ngx 0.5.1 does not expand for two modules.)
#[no_mangle]
pub static mut ngx_modules: [*const ngx::ffi::ngx_module_t; 4] = [
    &raw const ngx_tollgate_wasm_core_module,
    &raw const ngx_tollgate_wasm_kong_module,
    &raw const ngx_http_tollgate_wasm_module,
    std::ptr::null(),
];

/// Their names, in the same order.
#[no_mangle]
pub static mut ngx_module_names: [*const std::ffi::c_char; 4] = [
    c"ngx_tollgate_wasm_core_module".as_ptr(),
    c"ngx_tollgate_wasm_kong_module".as_ptr(),
    c"ngx_http_tollgate_wasm_module".as_ptr(),
    std::ptr::null(),
];

/// No ordering constraint: appended after the static modules (the filters then run first).
#[no_mangle]
pub static mut ngx_module_order: [*const std::ffi::c_char; 1] = [std::ptr::null()];
