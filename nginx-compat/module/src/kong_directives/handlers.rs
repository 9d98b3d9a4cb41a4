//! How this folder's directive handlers are written: [`handler!`] (the handler's name in scope),
//! running on the level's configuration ([`on_core`] for `wasm{}`, [`on_loc`] for the http
//! levels) with the error turned into `nginx -t`'s message, and nested blocks of `wasm{}`
//! ([`block`]).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_uint_t, NGX_CORE_MODULE};

use super::kong_core::KongCore;
use crate::conf::LocConf;
use crate::util::{conf_error, CONF_OK};
/// Runs `f` on this module's `wasm{}` configuration (`conf`, NGX_DIRECT_CONF) and turns its
/// error into `nginx -t`'s message.
pub(super) unsafe fn on_core(
    cf: *mut ngx_conf_t,
    conf: *mut c_void,
    f: impl FnOnce(&mut KongCore) -> Result<(), String>,
) -> *mut c_char {
    // SAFETY: `conf` is our KongCore for the directives of `wasm{}` and its blocks.
    unsafe {
        let Some(core) = conf.cast::<KongCore>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        match f(core) {
            Ok(()) => CONF_OK,
            Err(e) => conf_error(cf, &e),
        }
    }
}

/// Runs `f` on the level's `LocConf` (http{}, server{}, location{}).
pub(super) unsafe fn on_loc(
    cf: *mut ngx_conf_t,
    conf: *mut c_void,
    f: impl FnOnce(&mut LocConf) -> Result<(), String>,
) -> *mut c_char {
    // SAFETY: `conf` is our LocConf (NGX_HTTP_LOC_CONF_OFFSET).
    unsafe {
        let Some(lcf) = conf.cast::<LocConf>().as_mut() else {
            return conf_error(cf, "tollgate: no configuration");
        };
        match f(lcf) {
            Ok(()) => CONF_OK,
            Err(e) => conf_error(cf, &e),
        }
    }
}

/// Defines a directive handler `$fn(cf, cmd, conf)` whose body is `$body` with `cf`, `conf`
/// and the directive's name `$name` in scope.
macro_rules! handler {
    ($(#[$doc:meta])* $fn:ident, |$cf:ident, $conf:ident, $name:ident| $body:expr) => {
        $(#[$doc])*
        pub(super) unsafe extern "C" fn $fn(
            $cf: *mut ngx_conf_t,
            cmd: *mut ngx_command_t,
            $conf: *mut c_void,
        ) -> *mut c_char {
            // SAFETY: nginx's contract for directive handlers: `cf` is live, `cmd` is ours,
            // `conf` the configuration its offset selects.
            unsafe {
                let $name: &'static str = directive_name(cmd);
                $body
            }
        }
    };
}
pub(super) use handler;

/// The name of one of this file's commands (they are 'static literals).
pub(super) unsafe fn directive_name(cmd: *mut ngx_command_t) -> &'static str {
    // SAFETY: `cmd` points into a static command table whose names are 'static literals.
    let name = unsafe { cmd.as_ref().map(|c| c.name) };
    let Some(name) = name else { return "?" };
    if name.data.is_null() {
        return "?";
    }
    // SAFETY: ngx_string! literals live for the program.
    let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(name.data, name.len) };
    std::str::from_utf8(bytes).unwrap_or("?")
}

/// A nested block of `wasm{}`: its directives are those of `cmd_type`.
pub(super) unsafe fn block(cf: *mut ngx_conf_t, cmd_type: ngx_uint_t) -> *mut c_char {
    // SAFETY: standard nested-block parsing, the parser's types restored afterwards.
    unsafe {
        let saved_module_type = (*cf).module_type;
        let saved_cmd_type = (*cf).cmd_type;
        (*cf).module_type = NGX_CORE_MODULE as ngx_uint_t;
        (*cf).cmd_type = cmd_type;
        let rv = ngx_conf_parse(cf, std::ptr::null_mut());
        (*cf).module_type = saved_module_type;
        (*cf).cmd_type = saved_cmd_type;
        rv
    }
}
