//! `tollgate_guest_deadline CALL [STARTUP];` and `tollgate_guest_memory SIZE;`: the bounds on
//! every call into a guest and on its memory (`tollgate_host::GuestLimits`).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_parse_size, ngx_str_t};

use super::core_conf::CoreConf;
use crate::util::{conf_args, conf_error, lossy, CONF_OK};
/// A time argument in milliseconds (nginx's syntax: `100ms`, `5s`, `1m`), at least 1 ms.
///
/// # Safety
/// `arg` must be an argument of the directive being parsed.
unsafe fn time_ms(directive: &str, arg: &ngx_str_t) -> Result<std::time::Duration, String> {
    let mut a = *arg;
    // SAFETY: ngx_parse_time only reads the string.
    let ms = unsafe { ngx::ffi::ngx_parse_time(&mut a, 0) };
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => Ok(std::time::Duration::from_millis(ms)),
        _ => Err(format!(
            "tollgate: {directive}: invalid time \"{}\" (a positive time such as 100ms or 5s)",
            lossy(arg)
        )),
    }
}

/// `tollgate_guest_deadline CALL [STARTUP];` (in `wasm{}`): how long one call into a guest may
/// run: `CALL` for the stream callbacks, `on_tick`, `on_http_call_response` and
/// `on_queue_ready` (default 100ms), `STARTUP` for the module's start, `on_vm_start` and
/// `on_configure` (default 5s). Past it the call is interrupted: a trap.
pub(super) unsafe extern "C" fn guest_deadline_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: `conf` is our CoreConf (NGX_DIRECT_CONF); `cf` is live during the handler.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        if conf.limits_set.0 {
            return conf_error(
                cf,
                "tollgate: \"tollgate_guest_deadline\" directive is duplicate",
            );
        }
        let args = conf_args(cf);
        let d = "tollgate_guest_deadline";
        if let Some(a) = args.get(1) {
            match time_ms(d, a) {
                Ok(t) => conf.limits.call_deadline = t,
                Err(e) => return conf_error(cf, &e),
            }
        }
        if let Some(a) = args.get(2) {
            match time_ms(d, a) {
                Ok(t) => conf.limits.configure_deadline = t,
                Err(e) => return conf_error(cf, &e),
            }
        }
        conf.limits_set.0 = true;
        CONF_OK
    }
}

/// `tollgate_guest_memory SIZE;` (in `wasm{}`): the most linear memory one instance of a
/// module may have (nginx's size syntax; default 128m, at least 1m). `memory.grow` beyond it
/// fails (the guest gets -1; Rust guests then abort: a trap, and the instance is replaced).
pub(super) unsafe extern "C" fn guest_memory_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as in guest_deadline_directive.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        if conf.limits_set.1 {
            return conf_error(
                cf,
                "tollgate: \"tollgate_guest_memory\" directive is duplicate",
            );
        }
        let Some(arg) = conf_args(cf).get(1) else {
            return conf_error(cf, "tollgate: tollgate_guest_memory SIZE;");
        };
        let mut a = *arg;
        let parsed = ngx_parse_size(&mut a);
        match usize::try_from(parsed) {
            Ok(n) if n >= 1 << 20 => conf.limits.memory_max = n,
            _ => {
                return conf_error(
                    cf,
                    &format!(
                        "tollgate: tollgate_guest_memory: invalid size \"{}\" (at least 1m)",
                        lossy(arg)
                    ),
                )
            }
        }
        conf.limits_set.1 = true;
        CONF_OK
    }
}
