//! The HTTP module's `ngx_module_t` (`ngx_http_tollgate_wasm_module`), what nginx loads: its
//! configuration callbacks (`directives.rs`), commands and life cycle (`lifecycle.rs`). Other
//! files reach it through `base.rs`.

use ngx::ffi::{ngx_http_module_t, ngx_module_t, ngx_uint_t, NGX_HTTP_MODULE};

use crate::directives::{create_loc_conf, create_main_conf, merge_loc_conf, HTTP_TABLE};
use crate::lifecycle::{exit_process, init_process, postconfiguration};

static mut HTTP_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(create_loc_conf),
    merge_loc_conf: Some(merge_loc_conf),
};

/// The HTTP module.
#[no_mangle]
pub static mut ngx_http_tollgate_wasm_module: ngx_module_t = ngx_module_t {
    ctx: (&raw mut HTTP_CTX).cast(),
    commands: (&raw mut HTTP_TABLE).cast(),
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};
