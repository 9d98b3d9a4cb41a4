//! ngx_wasm_module's directives beyond `module`, `shm_kv`, `shm_queue`, `proxy_wasm*`
//! (Kong's docs/DIRECTIVES.md; their argument forms and checks from its source:
//! `src/wasm/ngx_wasm_core_module.c`, `ngx_wasm_directives.c`, `src/http/ngx_http_wasm_module.c`,
//! `ngx_http_wasm_directives.c`, `src/wasm/wrt/ngx_wrt_wasmtime.c`), so that a configuration
//! written for Kong's module loads here unchanged where this host can honour it:
//!
//! - **honoured**: `socket_connect|send|read_timeout` (`wasm{}`: calls of root contexts) and
//!   `wasm_socket_connect|send|read_timeout` (http levels: calls of a request's filters) are the
//!   defaults of a `dispatch_http_call` whose filter gave a timeout of 0; `resolver_timeout`
//!   bounds resolving a call's host name; `resolver_add IP HOST` maps a call's host name to an
//!   address (any level; one map for every call); `proxy_wasm_log_dispatch_errors on|off` logs a
//!   failed call at `error` (`conf.rs`: [`CallDefaults`](crate::conf::CallDefaults));
//!   `wasm_postpone_rewrite|access off` is this host's order; `wasmtime { cache_config FILE; }`:
//!   the `[cache] directory` of that Wasmtime cache configuration keeps the compiled code
//!   (`tollgate_compiled_cache`).
//! - **accepted as tuning** (validated as ngx_wasm_module validates them, no effect here, see
//!   nginx-compat/README.md): `wasmtime { flag NAME VALUE; }`, `wasmer {}`
//!   and `v8 {}` (ignored by Kong's Wasmtime build too), `metrics { slab_size SIZE;
//!   max_metric_name_length N; }`, `socket_buffer_size|reuse`, `socket_large_buffers`,
//!   `tls_*`, `wasm_socket_buffer_size|reuse`, `wasm_socket_large_buffers`,
//!   `wasm_response_body_buffers`.
//! - **refused** with the reason: `resolver`, `proxy_wasm_lua_resolver`, `wasm_call`,
//!   `wasm_postpone_rewrite|access on`.
//!
//! Values are refused like nginx's slots refuse them (`ngx_conf_set_msec_slot`, `_flag_slot`,
//! `_size_slot`, `_bufs_slot`; a second occurrence at one level "is duplicate"), with a message
//! naming the directive and the value.
//!
//! # Where things are
//! - `call_defaults.rs`: the honoured directives that set the defaults of `dispatch_http_call`
//!   (socket and resolver timeouts, `resolver_add`, `proxy_wasm_log_dispatch_errors`);
//! - `tuning.rs`: the tuning directives, validated, no effect;
//! - `refused.rs`: the refused directives, and `wasm_postpone_rewrite|access` (`on` refused);
//! - `runtime_blocks.rs`: `wasmtime {}` (its `flag`s), `wasmer {}`, `v8 {}`;
//!   `cache_config.rs`: `wasmtime { cache_config FILE; }`;
//! - `metrics_block.rs`: `metrics {}` (`slab_size`, `max_metric_name_length`);
//! - `kong_core.rs`: what the `wasm{}` directives build ([`KongCore`]) and the way to it from a
//!   cycle; `slot_values.rs`: arguments parsed as nginx's slots parse them; `handlers.rs`: the
//!   `handler!` every directive is written with, and nested blocks;
//! - this file: the core module nginx loads and the command tables.

use std::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_core_module_t, ngx_cycle_t, ngx_module_t, ngx_uint_t, NGX_CONF_1MORE,
    NGX_CONF_BLOCK, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE2, NGX_CONF_TAKE3,
    NGX_CORE_MODULE, NGX_DIRECT_CONF,
};
use ngx::ngx_string;

mod cache_config;
mod call_defaults;
mod handlers;
pub mod kong_core;
mod metrics_block;
mod refused;
mod runtime_blocks;
mod slot_values;
mod tuning;

use crate::command_table::{command, command_table, loc_command, ANY_LEVEL, IN_WASM};
use crate::util::CONF_OK;
use cache_config::cache_config;
use call_defaults::{
    core_log_dispatch_errors, core_resolver_add, http_resolver_add, loc_log_dispatch_errors,
    resolver_timeout, socket_timeout, wasm_socket_timeout,
};
use kong_core::KongCore;
use metrics_block::{max_metric_name_length, metrics_block, slab_size, METRICS_CONF};
use refused::{postpone, refused};
use runtime_blocks::{
    other_runtime_block, other_runtime_flag, wasmtime_block, wasmtime_flag, OTHER_RUNTIME_CONF,
    WASMTIME_CONF,
};
use tuning::{
    core_bufs_tuning, core_flag_tuning, core_size_tuning, loc_bufs_tuning, loc_flag_tuning,
    loc_size_tuning, tls_trusted_certificate,
};
unsafe extern "C" fn create_conf(cycle: *mut ngx_cycle_t) -> *mut c_void {
    // SAFETY: the cycle pool lives as long as the cycle; `allocate` registers a cleanup that
    // drops the value with the pool.
    unsafe {
        let pool = ngx::core::Pool::from_ngx_pool((*cycle).pool);
        pool.allocate(KongCore::default()).cast()
    }
}

unsafe extern "C" fn init_conf(_cycle: *mut ngx_cycle_t, _conf: *mut c_void) -> *mut c_char {
    CONF_OK
}

static mut KONG_WASM_BLOCK_TABLE: [ngx_command_t; 25] = command_table(KONG_WASM_BLOCK_COMMANDS, []);

static mut KONG_CTX: ngx_core_module_t = ngx_core_module_t {
    name: ngx_string!("tollgate_wasm_kong"),
    create_conf: Some(create_conf),
    init_conf: Some(init_conf),
};

/// The core module of ngx_wasm_module's other `wasm{}` directives (its own configuration,
/// [`KongCore`], so that `wasm_block/` does not depend on this file).
#[no_mangle]
pub static mut ngx_tollgate_wasm_kong_module: ngx_module_t = ngx_module_t {
    ctx: (&raw mut KONG_CTX).cast(),
    commands: (&raw mut KONG_WASM_BLOCK_TABLE).cast(),
    type_: NGX_CORE_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};

// ----- the command tables -----

const IN_WASMTIME: u32 = WASMTIME_CONF as u32 | NGX_DIRECT_CONF;
const IN_OTHER_RUNTIME: u32 = OTHER_RUNTIME_CONF as u32 | NGX_DIRECT_CONF;
const IN_METRICS: u32 = METRICS_CONF as u32 | NGX_DIRECT_CONF;

/// The `wasm{}` commands of this file.
const KONG_WASM_BLOCK_COMMANDS: [ngx_command_t; 24] = [
    command!(
        "socket_connect_timeout",
        IN_WASM | NGX_CONF_TAKE1,
        socket_timeout
    ),
    command!(
        "socket_send_timeout",
        IN_WASM | NGX_CONF_TAKE1,
        socket_timeout
    ),
    command!(
        "socket_read_timeout",
        IN_WASM | NGX_CONF_TAKE1,
        socket_timeout
    ),
    command!(
        "resolver_timeout",
        IN_WASM | NGX_CONF_TAKE1,
        resolver_timeout
    ),
    command!("resolver_add", IN_WASM | NGX_CONF_TAKE2, core_resolver_add),
    command!(
        "proxy_wasm_log_dispatch_errors",
        IN_WASM | NGX_CONF_TAKE1,
        core_log_dispatch_errors
    ),
    command!(
        "socket_buffer_size",
        IN_WASM | NGX_CONF_TAKE1,
        core_size_tuning
    ),
    command!(
        "socket_buffer_reuse",
        IN_WASM | NGX_CONF_TAKE1,
        core_flag_tuning
    ),
    command!(
        "socket_large_buffers",
        IN_WASM | NGX_CONF_TAKE2,
        core_bufs_tuning
    ),
    command!(
        "tls_verify_cert",
        IN_WASM | NGX_CONF_TAKE1,
        core_flag_tuning
    ),
    command!(
        "tls_verify_host",
        IN_WASM | NGX_CONF_TAKE1,
        core_flag_tuning
    ),
    command!(
        "tls_no_verify_warn",
        IN_WASM | NGX_CONF_TAKE1,
        core_flag_tuning
    ),
    command!(
        "tls_trusted_certificate",
        IN_WASM | NGX_CONF_TAKE1,
        tls_trusted_certificate
    ),
    command!("resolver", IN_WASM | NGX_CONF_1MORE, refused),
    command!("proxy_wasm_lua_resolver", IN_WASM | NGX_CONF_TAKE1, refused),
    command!(
        "wasmtime",
        IN_WASM | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        wasmtime_block
    ),
    command!(
        "wasmer",
        IN_WASM | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        other_runtime_block
    ),
    command!(
        "v8",
        IN_WASM | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        other_runtime_block
    ),
    command!(
        "metrics",
        IN_WASM | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        metrics_block
    ),
    command!("flag", IN_WASMTIME | NGX_CONF_TAKE2, wasmtime_flag),
    command!(
        "flag",
        IN_OTHER_RUNTIME | NGX_CONF_TAKE2,
        other_runtime_flag
    ),
    command!("cache_config", IN_WASMTIME | NGX_CONF_TAKE1, cache_config),
    command!("slab_size", IN_METRICS | NGX_CONF_TAKE1, slab_size),
    command!(
        "max_metric_name_length",
        IN_METRICS | NGX_CONF_TAKE1,
        max_metric_name_length
    ),
];

/// The http{}, server{}, location{} commands of this file (appended to the http module's).
pub const KONG_HTTP_COMMANDS: [ngx_command_t; 13] = [
    loc_command!(
        "wasm_socket_connect_timeout",
        ANY_LEVEL | NGX_CONF_TAKE1,
        wasm_socket_timeout
    ),
    loc_command!(
        "wasm_socket_send_timeout",
        ANY_LEVEL | NGX_CONF_TAKE1,
        wasm_socket_timeout
    ),
    loc_command!(
        "wasm_socket_read_timeout",
        ANY_LEVEL | NGX_CONF_TAKE1,
        wasm_socket_timeout
    ),
    loc_command!(
        "proxy_wasm_log_dispatch_errors",
        ANY_LEVEL | NGX_CONF_TAKE1,
        loc_log_dispatch_errors
    ),
    loc_command!(
        "resolver_add",
        ANY_LEVEL | NGX_CONF_TAKE2,
        http_resolver_add
    ),
    loc_command!(
        "wasm_socket_buffer_size",
        ANY_LEVEL | NGX_CONF_TAKE1,
        loc_size_tuning
    ),
    loc_command!(
        "wasm_socket_buffer_reuse",
        ANY_LEVEL | NGX_CONF_TAKE1,
        loc_flag_tuning
    ),
    loc_command!(
        "wasm_socket_large_buffers",
        ANY_LEVEL | NGX_CONF_TAKE2,
        loc_bufs_tuning
    ),
    loc_command!(
        "wasm_response_body_buffers",
        ANY_LEVEL | NGX_CONF_TAKE2,
        loc_bufs_tuning
    ),
    loc_command!(
        "wasm_postpone_rewrite",
        ANY_LEVEL | NGX_CONF_TAKE1,
        postpone
    ),
    loc_command!("wasm_postpone_access", ANY_LEVEL | NGX_CONF_TAKE1, postpone),
    loc_command!("wasm_call", ANY_LEVEL | NGX_CONF_TAKE3, refused),
    loc_command!(
        "proxy_wasm_lua_resolver",
        ANY_LEVEL | NGX_CONF_TAKE1,
        refused
    ),
];
