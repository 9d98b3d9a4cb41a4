//! The base of the HTTP module: its `ngx_module_t` as nginx sees it (declared here, defined
//! in `http_module.rs`, as a C module declares `extern ngx_module_t` in its header), the
//! return codes of handlers, and typed access to the module's configuration and request
//! context slot (instead of `ctx_index` arithmetic at every use). Everything else of the HTTP
//! module imports this; this imports only `conf.rs`.

use std::ffi::c_void;

use ngx::ffi::{ngx_conf_t, ngx_cycle_t, ngx_http_conf_ctx_t, ngx_http_request_t, ngx_module_t};

use crate::conf::{LocConf, MainConf};

extern "C" {
    /// The HTTP module (`http_module.rs` defines it: its handlers are every other file's).
    pub static mut ngx_http_tollgate_wasm_module: ngx_module_t;
}

/// `NGX_OK`, `NGX_DONE`, `NGX_DECLINED`, `NGX_ERROR`, `NGX_AGAIN`.
pub mod rc {
    use ngx::ffi::ngx_int_t;
    pub const OK: ngx_int_t = 0;
    pub const ERROR: ngx_int_t = -1;
    pub const AGAIN: ngx_int_t = -2;
    pub const DONE: ngx_int_t = -4;
    pub const DECLINED: ngx_int_t = -5;
    pub const HTTP_INTERNAL_SERVER_ERROR: ngx_int_t = 500;
    pub const HTTP_CLOSE: ngx_int_t = 444;
}

/// This module's index in the http{} configuration arrays and in `r->ctx`.
fn ctx_index() -> usize {
    // SAFETY: nginx sets ctx_index once, before any configuration of the module is created.
    unsafe { ngx_http_tollgate_wasm_module.ctx_index }
}

/// The http{} configuration of the block being parsed.
///
/// # Safety
/// `cf` must be nginx's configuration while it parses an http{} block.
pub unsafe fn main_conf_of_cf<'a>(cf: *mut ngx_conf_t) -> Option<&'a mut MainConf> {
    // SAFETY: during http{} parsing cf->ctx is an ngx_http_conf_ctx_t.
    unsafe {
        let ctx = (*cf).ctx.cast::<ngx_http_conf_ctx_t>();
        (*(*ctx).main_conf.add(ctx_index()))
            .cast::<MainConf>()
            .as_mut()
    }
}

/// The http{} configuration of `cycle` (`None` without an http{} block).
///
/// # Safety
/// `cycle` must be a cycle whose configuration is complete.
pub unsafe fn main_conf_of_cycle<'a>(cycle: *mut ngx_cycle_t) -> Option<&'a MainConf> {
    // SAFETY: conf_ctx is indexed by module index; the http one is an ngx_http_conf_ctx_t.
    unsafe {
        let http_idx = nginx_sys::ngx_http_module.index;
        let http_ctx = *(*cycle).conf_ctx.add(http_idx);
        if http_ctx.is_null() {
            return None;
        }
        let hctx = http_ctx.cast::<ngx_http_conf_ctx_t>();
        (*(*hctx).main_conf.add(ctx_index()))
            .cast::<MainConf>()
            .as_ref()
    }
}

/// The location configuration of `r`.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn loc_conf<'a>(r: *mut ngx_http_request_t) -> Option<&'a LocConf> {
    // SAFETY: r->loc_conf is indexed by ctx_index.
    unsafe { (*(*r).loc_conf.add(ctx_index())).cast::<LocConf>().as_ref() }
}

/// `r->ctx[ctx_index]`: where the request's context is kept.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn ctx_slot(r: *mut ngx_http_request_t) -> *mut *mut c_void {
    // SAFETY: r->ctx has one slot per HTTP module.
    unsafe { (*r).ctx.add(ctx_index()) }
}
