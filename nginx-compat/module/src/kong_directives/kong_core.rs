//! What ngx_wasm_module's other `wasm{}` directives build: [`KongCore`] (the call defaults they
//! set, `resolver_add`'s map, the tuning directives given), and [`kong_conf`], the way to it
//! from a cycle. Every other file of this folder builds on this one.

use std::net::IpAddr;
use std::time::Duration;

use ngx::ffi::{ngx_cycle_t, ngx_module_t, ngx_uint_t};

use crate::conf::{CallDefaults, LocConf, SocketTimeouts};

extern "C" {
    /// The core module (`kong_directives/mod.rs` defines it: its handlers are every other
    /// file's), declared here as a C module's header declares it (as `base.rs` does the HTTP
    /// module).
    pub static mut ngx_tollgate_wasm_kong_module: ngx_module_t;
}
/// ngx_wasm_module's `wasm{}` settings beyond the core ones (see the module documentation;
/// names, defaults and units from Kong's docs/DIRECTIVES.md).
#[derive(Default)]
pub struct KongCore {
    /// `socket_connect|send|read_timeout TIME;` (nginx's time syntax, kept as a duration;
    /// default 60s each): defaults of the calls of root contexts.
    pub sockets: SocketTimeouts,
    /// `resolver_timeout TIME;` (default 30s): the longest a call's host name may take to
    /// resolve.
    pub resolver_timeout: Option<Duration>,
    /// `proxy_wasm_log_dispatch_errors on|off;` of `wasm{}` (default on).
    pub log_dispatch_errors: Option<bool>,
    /// `resolver_add IP HOST;` of every level, in order (a later one for the same host wins).
    pub hosts: Vec<(String, IpAddr)>,
    /// Tuning directives given (a second one "is duplicate").
    pub tuning: Vec<&'static str>,
    /// A `metrics {}` block was given (a second one "is duplicate", as in Kong's module).
    pub metrics_block: bool,
}

impl KongCore {
    /// The defaults of a call made by a root context (`on_vm_start`, `on_configure`, `on_tick`,
    /// `on_queue_ready`...): the `wasm{}` directives.
    pub fn root_calls(&self) -> CallDefaults {
        CallDefaults {
            sockets: self.sockets,
            resolve: self
                .resolver_timeout
                .unwrap_or(crate::conf::DEFAULT_RESOLVER_TIMEOUT),
            log_errors: self.log_dispatch_errors.unwrap_or(true),
        }
    }

    /// The defaults of a call made by a filter of a request in the location of `lcf`: its
    /// `wasm_socket_*_timeout` directives, `resolver_timeout`, and its
    /// `proxy_wasm_log_dispatch_errors`, else the `wasm{}` one.
    pub fn request_calls(&self, lcf: &LocConf) -> CallDefaults {
        let root = self.root_calls();
        CallDefaults {
            sockets: lcf.sockets,
            resolve: root.resolve,
            log_errors: lcf.log_dispatch_errors.unwrap_or(root.log_errors),
        }
    }
}

/// This module's configuration in `cycle` (`None` before it is created).
///
/// # Safety
/// `cycle` must be a live cycle whose configuration has been created.
pub unsafe fn kong_conf<'a>(cycle: *mut ngx_cycle_t) -> Option<&'a mut KongCore> {
    // SAFETY: conf_ctx is indexed by module index; our slot holds a KongCore from create_conf.
    unsafe {
        let idx = ngx_tollgate_wasm_kong_module.index;
        let ctx = (*cycle).conf_ctx;
        if ctx.is_null() || idx == ngx_uint_t::MAX {
            return None;
        }
        (*ctx.add(idx)).cast::<KongCore>().as_mut()
    }
}
