//! The directives refused with the reason (`resolver`, `proxy_wasm_lua_resolver`, `wasm_call`),
//! and `wasm_postpone_rewrite|access`, whose `off` is this host's order and `on` is refused.

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use super::handlers::{directive_name, handler, on_loc};
use super::slot_values::{flag, once};
use crate::util::conf_error;
handler!(refused, |cf, _conf, name| {
    let why = match name {
        "resolver" => {
            "this host resolves the names of dispatch_http_call with the system resolver \
             (getaddrinfo: /etc/hosts, /etc/resolv.conf), not with nginx's; map names with \
             resolver_add IP HOST or call an upstream{} block by name"
        }
        "proxy_wasm_lua_resolver" => {
            "it requires Lua support (OpenResty), which this host does not have (Kong's module \
             refuses it too when built without Lua)"
        }
        "wasm_call" => {
            "this host runs proxy-wasm filters (proxy_wasm), not exported functions called \
             in nginx phases"
        }
        _ => "",
    };
    conf_error(cf, &format!("tollgate: \"{name}\" is not supported: {why}"))
});

handler!(
/// `wasm_postpone_rewrite|access on|off;`: `off` is this host's order (its handler runs first
/// in the phase); `on` (after every other module's handler of the phase, e.g. after
/// `rewrite`/`return`/`set`) is not implemented and refused.
postpone, |cf, conf, name| on_loc(cf, conf, |l| {
    if flag(cf, name)? {
        return Err(format!(
            "tollgate: \"{name} on\" is not supported: this host runs on_request_headers first \
             in the phase (before rewrite, return and set), as with \"{name} off\""
        ));
    }
    once(&mut l.tuning, name)
}));
