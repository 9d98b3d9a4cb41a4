//! The `wasm {}` block: a core module (`NGX_CORE_MODULE`), like ngx_wasm_module's.
//!
//! `wasm {}` is a block directive whose handler switches `cf->cmd_type` to
//! `TOLLGATE_WASM_CONF` (`command_table.rs`) and runs `ngx_conf_parse` on the block, so only
//! the directives below (and `include`) are accepted inside. They are `NGX_DIRECT_CONF`: their `conf` argument is this
//! module's [`CoreConf`], created per cycle in the cycle pool (and dropped with it on reload).
//!
//! - `module NAME PATH [CONFIG];` reads `PATH`; the block's modules are compiled together when
//!   the block ends, in the master, side by side on threads joined before the block's handler
//!   returns (`Engine::compile_all`; a bad `.wasm` fails `nginx -t`, the message naming the
//!   module and its path). `CONFIG` is the VM configuration (`on_vm_start`).
//!   `tollgate_module_file NAME PATH FILE;` reads it from `FILE` (`crate::conf_file`).
//! - `tollgate_compiled_cache DIR|off;` keeps the compiled code in `DIR` (default off): a start
//!   or reload whose modules did not change loads it instead of compiling
//!   (`tollgate_host::CompiledCache`, which says what it trusts). Kong's
//!   `wasmtime { cache_config FILE; }` names the directory the same way
//!   (`kong_directives/cache_config.rs`).
//! - `shm_kv NAME|* SIZE [eviction=lru|slru|none];` declares a shared key/value zone
//!   (`proxy_get/set_shared_data`; a key `NAME/rest` goes to the zone `NAME`, others to `*`).
//! - `shm_queue NAME SIZE;` declares a shared queue zone: the queue `NAME` of
//!   `proxy_register_shared_queue` / `proxy_resolve_shared_queue` (a filter cannot register a
//!   queue that was not declared, as in ngx_wasm_module). Its id is its position among the
//!   `shm_queue` directives, from 1, the same in every worker.
//! - `compiler`, `backtraces` (`engine_options.rs`); ngx_wasm_module's other `wasm{}`
//!   directives and blocks are those of a second core module (`kong_directives/`).
//!
//! # Where things are
//! - `core_conf.rs`: what the directives build ([`CoreConf`]: the modules, zones and limits of
//!   the cycle) and [`core_conf::core_conf`], the way to it from a cycle;
//! - `module_directive.rs`: `module` and `tollgate_module_file` (reading a `.wasm`);
//! - `compile.rs`: the `wasm` block's handler, which compiles the modules read when the block
//!   ends, and the process's wasmtime engine;
//! - `guest_limits.rs`: `tollgate_guest_deadline`, `tollgate_guest_memory`;
//! - `engine_options.rs`: `tollgate_compiled_cache`, `compiler`, `backtraces`;
//! - `zone_directives.rs`: `shm_kv` and `shm_queue`, over `shm_zones.rs` (adding this module's
//!   nginx shared memory zones and attaching a service to each, for the metrics zone too);
//! - this file: the core module nginx loads, its configuration's creation and its command table.

use std::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_core_module_t, ngx_cycle_t, ngx_module_t, ngx_uint_t, NGX_CONF_BLOCK,
    NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_CONF_TAKE2, NGX_CONF_TAKE23,
    NGX_CONF_TAKE3, NGX_CORE_MODULE, NGX_DIRECT_CONF, NGX_MAIN_CONF,
};
use ngx::ngx_string;

pub mod compile;
pub mod core_conf;
mod engine_options;
mod guest_limits;
mod module_directive;
pub mod shm_zones;
pub mod zone_directives;

use crate::command_table::{command, command_table, IN_WASM};
use crate::util::CONF_OK;
use compile::wasm_block;
use core_conf::CoreConf;
use engine_options::{backtraces_directive, compiled_cache_directive, compiler_directive};
use guest_limits::{guest_deadline_directive, guest_memory_directive};
use module_directive::{module_directive, module_file_directive};
use zone_directives::{shm_kv_directive, shm_queue_directive};
unsafe extern "C" fn create_conf(cycle: *mut ngx_cycle_t) -> *mut c_void {
    // SAFETY: the cycle pool lives as long as the cycle; `allocate` registers a cleanup that
    // drops the value (and the compiled modules) when the cycle's pool is destroyed.
    unsafe {
        let pool = ngx::core::Pool::from_ngx_pool((*cycle).pool);
        pool.allocate(CoreConf::default()).cast()
    }
}

unsafe extern "C" fn init_conf(_cycle: *mut ngx_cycle_t, _conf: *mut c_void) -> *mut c_char {
    CONF_OK
}

/// The `wasm{}` directives of this file.
const WASM_BLOCK_COMMANDS: [ngx_command_t; 10] = [
    command!(
        "wasm",
        NGX_MAIN_CONF | NGX_DIRECT_CONF | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        wasm_block
    ),
    command!("module", IN_WASM | NGX_CONF_TAKE23, module_directive),
    command!(
        "tollgate_module_file",
        IN_WASM | NGX_CONF_TAKE3,
        module_file_directive
    ),
    command!(
        "shm_kv",
        IN_WASM | NGX_CONF_TAKE2 | NGX_CONF_TAKE3,
        shm_kv_directive
    ),
    command!("shm_queue", IN_WASM | NGX_CONF_TAKE2, shm_queue_directive),
    command!(
        "tollgate_guest_deadline",
        IN_WASM | NGX_CONF_TAKE12,
        guest_deadline_directive
    ),
    command!(
        "tollgate_guest_memory",
        IN_WASM | NGX_CONF_TAKE1,
        guest_memory_directive
    ),
    command!(
        "tollgate_compiled_cache",
        IN_WASM | NGX_CONF_TAKE1,
        compiled_cache_directive
    ),
    command!("compiler", IN_WASM | NGX_CONF_TAKE1, compiler_directive),
    command!("backtraces", IN_WASM | NGX_CONF_TAKE1, backtraces_directive),
];

static mut WASM_BLOCK_TABLE: [ngx_command_t; 11] = command_table(WASM_BLOCK_COMMANDS, []);

static mut CORE_CTX: ngx_core_module_t = ngx_core_module_t {
    name: ngx_string!("tollgate_wasm"),
    create_conf: Some(create_conf),
    init_conf: Some(init_conf),
};

/// The core module (`wasm {}`).
#[no_mangle]
pub static mut ngx_tollgate_wasm_core_module: ngx_module_t = ngx_module_t {
    ctx: (&raw mut CORE_CTX).cast(),
    commands: (&raw mut WASM_BLOCK_TABLE).cast(),
    type_: NGX_CORE_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};
