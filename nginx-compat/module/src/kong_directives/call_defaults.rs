//! The honoured directives that set the defaults of a `dispatch_http_call`: socket timeouts
//! (`socket_*_timeout` of `wasm{}` for root contexts, `wasm_socket_*_timeout` of the http levels
//! for requests' filters), `resolver_timeout`, `resolver_add IP HOST` (any level) and
//! `proxy_wasm_log_dispatch_errors` (both).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};
use std::net::IpAddr;

use super::handlers::{directive_name, handler, on_core, on_loc};
use super::kong_core::{kong_conf, KongCore};
use super::slot_values::{arg, flag, msec, set_once};
use crate::util::{conf_error, CONF_OK};
handler!(socket_timeout, |cf, conf, name| on_core(cf, conf, |c| {
    let t = msec(cf, name)?;
    let slot = match name {
        "socket_connect_timeout" => &mut c.sockets.connect,
        "socket_send_timeout" => &mut c.sockets.send,
        _ => &mut c.sockets.read,
    };
    set_once(slot, t, name)
}));

handler!(resolver_timeout, |cf, conf, name| on_core(cf, conf, |c| {
    let t = msec(cf, name)?;
    set_once(&mut c.resolver_timeout, t, name)
}));

handler!(core_log_dispatch_errors, |cf, conf, name| on_core(
    cf,
    conf,
    |c| {
        let on = flag(cf, name)?;
        set_once(&mut c.log_dispatch_errors, on, name)
    }
));

/// `resolver_add IP HOST;` (`wasm{}` and the http levels): validated as
/// `ngx_http_wasm_resolver_add_directive` does, added to the one map of every call.
unsafe fn resolver_add(cf: *mut ngx_conf_t, core: &mut KongCore) -> Result<(), String> {
    // SAFETY: forwarded from the caller.
    let (address, host) = unsafe { (arg(cf, 1), arg(cf, 2)) };
    if host.is_empty() {
        return Err(format!(
            "tollgate: resolver_add: invalid host value \"{host}\""
        ));
    }
    let ip: IpAddr = address
        .parse()
        .map_err(|_| format!("tollgate: resolver_add: invalid address value \"{address}\""))?;
    core.hosts.push((host, ip));
    Ok(())
}

handler!(core_resolver_add, |cf, conf, _name| on_core(
    cf,
    conf,
    |c| { resolver_add(cf, c) }
));

handler!(http_resolver_add, |cf, _conf, _name| {
    match kong_conf((*cf).cycle) {
        Some(c) => match resolver_add(cf, c) {
            Ok(()) => CONF_OK,
            Err(e) => conf_error(cf, &e),
        },
        None => conf_error(cf, "tollgate: resolver_add: no wasm{} block"),
    }
});

handler!(wasm_socket_timeout, |cf, conf, name| on_loc(
    cf,
    conf,
    |l| {
        let t = msec(cf, name)?;
        let slot = match name {
            "wasm_socket_connect_timeout" => &mut l.sockets.connect,
            "wasm_socket_send_timeout" => &mut l.sockets.send,
            _ => &mut l.sockets.read,
        };
        set_once(slot, t, name)
    }
));

handler!(loc_log_dispatch_errors, |cf, conf, name| on_loc(
    cf,
    conf,
    |l| {
        let on = flag(cf, name)?;
        set_once(&mut l.log_dispatch_errors, on, name)
    }
));
