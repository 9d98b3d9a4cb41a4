//! How modules are compiled and traps reported: `tollgate_compiled_cache DIR|off;`, and
//! ngx_wasm_module's `compiler` and `backtraces`, honoured for the values this host supports.

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use super::core_conf::CoreConf;
use crate::util::{bytes, conf_args, conf_error, full_path, lossy, CONF_OK};
/// An ngx_wasm_module directive this host honours for some values (`compiler`, `backtraces`;
/// docs/DIRECTIVES.md): `CONF_OK` when the value is in `accepted`, else `nginx -t` fails with
/// `refusal(value)`.
unsafe fn one_of(
    cf: *mut ngx_conf_t,
    accepted: &[&str],
    refusal: impl Fn(&str) -> String,
) -> *mut c_char {
    // SAFETY: `cf` is live during the handler that calls this.
    unsafe {
        let value = conf_args(cf).get(1).map(lossy).unwrap_or_default();
        if accepted.contains(&value.as_str()) {
            CONF_OK
        } else {
            conf_error(cf, &refusal(&value))
        }
    }
}

/// `tollgate_compiled_cache DIR|off;` (`wasm{}`, once): where compiled code is kept across
/// starts and reloads (see the file's documentation); a relative `DIR` is relative to the
/// prefix (`-p`). Default `off`.
pub(super) unsafe extern "C" fn compiled_cache_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: `conf` is our CoreConf (NGX_DIRECT_CONF); `cf` is live during the handler.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        if conf.compiled_cache.is_some() {
            return conf_error(
                cf,
                "tollgate: \"tollgate_compiled_cache\" directive is duplicate",
            );
        }
        let Some(arg) = conf_args(cf).get(1).copied() else {
            return conf_error(cf, "tollgate: tollgate_compiled_cache DIR|off;");
        };
        if bytes(&arg) == b"off" {
            conf.compiled_cache = Some(None);
            return CONF_OK;
        }
        let Some(dir) = full_path(cf, &arg) else {
            return conf_error(
                cf,
                &format!(
                    "tollgate: tollgate_compiled_cache: invalid directory \"{}\"",
                    lossy(&arg)
                ),
            );
        };
        conf.compiled_cache = Some(Some(tollgate_host::CompiledCache::new(dir)));
        CONF_OK
    }
}

/// `compiler auto|cranelift;` (`wasm{}`): the runtime's compiler. This host always compiles with
/// wasmtime's Cranelift, which is what both values select on Kong's Wasmtime build; Wasmer's
/// `llvm` and `singlepass` are refused.
pub(super) unsafe extern "C" fn compiler_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: `cf` is live during the handler.
    unsafe {
        one_of(cf, &["auto", "cranelift"], |v| {
            format!(
                "tollgate: compiler \"{v}\" is not available: this host compiles with Cranelift \
                 (compiler auto or compiler cranelift)"
            )
        })
    }
}

/// `backtraces on|off;` (`wasm{}`): how much detail a trap's log line carries. Diagnostics only:
/// this host logs every trap with wasmtime's reason either way, so both values are accepted.
pub(super) unsafe extern "C" fn backtraces_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: `cf` is live during the handler.
    unsafe {
        one_of(cf, &["on", "off"], |v| {
            format!(
                "tollgate: invalid value \"{v}\" in \"backtraces\": it must be \"on\" or \"off\""
            )
        })
    }
}
