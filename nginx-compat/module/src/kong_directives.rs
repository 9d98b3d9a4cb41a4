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
//!   failed call at `error` (`conf.rs`: [`CallDefaults`]); `wasm_postpone_rewrite|access off`
//!   is this host's order; `wasmtime { cache_config FILE; }`: the `[cache] directory` of that
//!   Wasmtime cache configuration keeps the compiled code (`tollgate_compiled_cache`).
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

use std::ffi::{c_char, c_void};
use std::net::IpAddr;
use std::time::Duration;

use ngx::ffi::{
    ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_core_module_t, ngx_cycle_t, ngx_module_t,
    ngx_str_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_BLOCK, NGX_CONF_NOARGS, NGX_CONF_TAKE1,
    NGX_CONF_TAKE2, NGX_CONF_TAKE3, NGX_CORE_MODULE, NGX_DIRECT_CONF,
};

use ngx::ngx_string;

use crate::command_table::{command, command_table, loc_command, ANY_LEVEL, TOLLGATE_WASM_CONF};
use crate::conf::{CallDefaults, LocConf, SocketTimeouts};
use crate::util::{conf_args, conf_error, lossy, CONF_OK};

/// `cmd_type` inside `wasm { wasmtime {} }`.
const WASMTIME_CONF: ngx_uint_t = 0x0400_0000;
/// `cmd_type` inside `wasm { wasmer {} }` and `wasm { v8 {} }` (other runtimes' blocks).
const OTHER_RUNTIME_CONF: ngx_uint_t = 0x0800_0000;
/// `cmd_type` inside `wasm { metrics {} }`.
const METRICS_CONF: ngx_uint_t = 0x1000_0000;

/// The Wasmtime flags of Kong's module (`flag_handlers` of `ngx_wrt_wasmtime.c`): name and
/// value type. Kong checks the name at configuration time and the value when it starts.
const WASMTIME_FLAGS: &[(&str, FlagType)] = &[
    ("debug_info", FlagType::Bool),
    ("consume_fuel", FlagType::Bool),
    ("epoch_interruption", FlagType::Bool),
    ("max_wasm_stack", FlagType::Size),
    ("wasm_threads", FlagType::Bool),
    ("wasm_reference_types", FlagType::Bool),
    ("wasm_relaxed_simd", FlagType::Bool),
    ("wasm_simd", FlagType::Bool),
    ("wasm_bulk_memory", FlagType::Bool),
    ("wasm_multi_value", FlagType::Bool),
    ("wasm_multi_memory", FlagType::Bool),
    ("wasm_memory64", FlagType::Bool),
    ("strategy", FlagType::Any),
    ("parallel_compilation", FlagType::Bool),
    ("cranelift_debug_verifier", FlagType::Bool),
    ("cranelift_nan_canonicalization", FlagType::Bool),
    ("cranelift_opt_level", FlagType::Any),
    ("profiler", FlagType::Any),
    ("static_memory_maximum_size", FlagType::Size),
    ("static_memory_guard_size", FlagType::Size),
    ("dynamic_memory_guard_size", FlagType::Size),
];

#[derive(Clone, Copy)]
enum FlagType {
    /// `on` or `off` (exactly, as `bool_flag_handler`).
    Bool,
    /// nginx's size syntax.
    Size,
    /// Anything (Kong ignores an unknown `strategy`, `cranelift_opt_level` or `profiler`).
    Any,
}

/// The smallest metrics slab of Kong's module: `3 * pagesize` (`NGX_WA_SHM_MIN_SIZE`).
const MIN_SLAB_BYTES: usize = 3 * 4096;

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

/// Argument `i` of the directive being parsed, lossily decoded (empty when absent).
unsafe fn arg(cf: *mut ngx_conf_t, i: usize) -> String {
    // SAFETY: forwarded from the caller (`cf` live during a handler).
    unsafe { conf_args(cf).get(i).map(lossy).unwrap_or_default() }
}

/// The directive's name and its argument `i` as nginx's parser holds it.
unsafe fn raw_arg<'a>(cf: *mut ngx_conf_t, i: usize) -> Option<&'a ngx_str_t> {
    // SAFETY: forwarded from the caller.
    unsafe { conf_args(cf).get(i) }
}

/// A time in nginx's syntax (`ngx_conf_set_msec_slot`: `ngx_parse_time`, 0 allowed).
unsafe fn msec(cf: *mut ngx_conf_t, directive: &str) -> Result<Duration, String> {
    // SAFETY: forwarded from the caller; ngx_parse_time only reads the string.
    unsafe {
        let Some(v) = raw_arg(cf, 1) else {
            return Err(format!("tollgate: {directive}: missing time"));
        };
        let mut copy = *v;
        let ms = ngx::ffi::ngx_parse_time(&mut copy, 0);
        u64::try_from(ms).map(Duration::from_millis).map_err(|_| {
            format!(
                "tollgate: invalid value \"{}\" in \"{directive}\": a time such as 500ms or 5s",
                lossy(v)
            )
        })
    }
}

/// `on` or `off` (`ngx_conf_set_flag_slot`: case-insensitive).
unsafe fn flag(cf: *mut ngx_conf_t, directive: &str) -> Result<bool, String> {
    // SAFETY: forwarded from the caller.
    let v = unsafe { arg(cf, 1) };
    if v.eq_ignore_ascii_case("on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err(format!(
            "tollgate: invalid value \"{v}\" in \"{directive}\": it must be \"on\" or \"off\""
        ))
    }
}

/// A size in nginx's syntax (`ngx_parse_size`), as bytes.
unsafe fn size_of(v: &ngx_str_t) -> Option<usize> {
    let mut copy = *v;
    // SAFETY: ngx_parse_size only reads the string.
    usize::try_from(unsafe { ngx::ffi::ngx_parse_size(&mut copy) }).ok()
}

/// `ngx_conf_set_size_slot`'s argument.
unsafe fn size(cf: *mut ngx_conf_t, directive: &str) -> Result<usize, String> {
    // SAFETY: forwarded from the caller.
    unsafe {
        raw_arg(cf, 1).and_then(|v| size_of(v)).ok_or_else(|| {
            format!(
                "tollgate: invalid value \"{}\" in \"{directive}\": a size such as 1024 or 4k",
                arg(cf, 1)
            )
        })
    }
}

/// `ngx_conf_set_bufs_slot`'s `NUMBER SIZE`: a positive count and a positive size.
unsafe fn bufs(cf: *mut ngx_conf_t, directive: &str) -> Result<(usize, usize), String> {
    // SAFETY: forwarded from the caller.
    unsafe {
        let n = arg(cf, 1).parse::<usize>().ok().filter(|n| *n > 0);
        let s = raw_arg(cf, 2).and_then(|v| size_of(v)).filter(|s| *s > 0);
        match (n, s) {
            (Some(n), Some(s)) => Ok((n, s)),
            _ => Err(format!(
                "tollgate: invalid value \"{} {}\" in \"{directive}\": NUMBER SIZE, such as 4 8k",
                arg(cf, 1),
                arg(cf, 2)
            )),
        }
    }
}

/// Refuses a second `directive` at one level, as nginx's slots do; records the first.
fn once(seen: &mut Vec<&'static str>, directive: &'static str) -> Result<(), String> {
    if seen.contains(&directive) {
        return Err(format!("tollgate: \"{directive}\" directive is duplicate"));
    }
    seen.push(directive);
    Ok(())
}

/// Stores `value` in an unset `slot`; a set one "is duplicate".
fn set_once<T>(slot: &mut Option<T>, value: T, directive: &str) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("tollgate: \"{directive}\" directive is duplicate"));
    }
    *slot = Some(value);
    Ok(())
}

/// Runs `f` on this module's `wasm{}` configuration (`conf`, NGX_DIRECT_CONF) and turns its
/// error into `nginx -t`'s message.
unsafe fn on_core(
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
unsafe fn on_loc(
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
        unsafe extern "C" fn $fn(
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

/// The name of one of this file's commands (they are 'static literals).
unsafe fn directive_name(cmd: *mut ngx_command_t) -> &'static str {
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

// ----- wasm{} -----

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

handler!(core_flag_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    flag(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(core_size_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    size(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(core_bufs_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    bufs(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(tls_trusted_certificate, |cf, conf, name| on_core(
    cf,
    conf,
    |c| {
        if arg(cf, 1).is_empty() {
            return Err(format!(
                "tollgate: invalid value \"\" in \"{name}\": a PEM file"
            ));
        }
        once(&mut c.tuning, name)
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

/// A nested block of `wasm{}`: its directives are those of `cmd_type`.
unsafe fn block(cf: *mut ngx_conf_t, cmd_type: ngx_uint_t) -> *mut c_char {
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

handler!(wasmtime_block, |cf, _conf, _name| block(cf, WASMTIME_CONF));

handler!(other_runtime_block, |cf, _conf, _name| block(
    cf,
    OTHER_RUNTIME_CONF
));

handler!(metrics_block, |cf, conf, name| {
    let first = on_core(cf, conf, |c| {
        if std::mem::replace(&mut c.metrics_block, true) {
            return Err(format!("tollgate: \"{name}\" directive is duplicate"));
        }
        Ok(())
    });
    if first != CONF_OK {
        return first;
    }
    block(cf, METRICS_CONF)
});

handler!(
/// `flag NAME VALUE;` in `wasmtime{}`: a flag of Kong's Wasmtime table with a value of its
/// type; accepted, no effect (this host configures its engine itself).
wasmtime_flag, |cf, _conf, _name| {
    let (name, value) = (arg(cf, 1), arg(cf, 2));
    let Some((_, kind)) = WASMTIME_FLAGS.iter().find(|(n, _)| *n == name) else {
        return conf_error(
            cf,
            &format!("tollgate: unknown \"wasmtime\" configuration flag: \"{name}\""),
        );
    };
    let ok = match kind {
        FlagType::Bool => value == "on" || value == "off",
        FlagType::Size => raw_arg(cf, 2).and_then(|v| size_of(v)).is_some(),
        FlagType::Any => true,
    };
    if ok {
        CONF_OK
    } else {
        conf_error(
            cf,
            &format!(
                "tollgate: invalid value \"{value}\" of wasmtime flag \"{name}\": flag {name} {};",
                match kind {
                    FlagType::Bool => "on|off",
                    FlagType::Size => "SIZE",
                    FlagType::Any => "VALUE",
                }
            ),
        )
    }
});

handler!(
/// `flag NAME VALUE;` in `wasmer{}` or `v8{}`: ignored, as Kong's Wasmtime build ignores the
/// flags of another runtime's block.
other_runtime_flag, |_cf, _conf, _name| CONF_OK);

handler!(
/// `cache_config FILE;` in `wasmtime{}`: Wasmtime's cache configuration (TOML, which Kong's
/// module hands to `wasmtime_config_cache_config_load`). Its `[cache]` table's `directory` (an
/// absolute path) is this host's compiled-code cache, as `tollgate_compiled_cache DIR;` would
/// set it (which wins when both are given); `enabled = false` leaves the cache off; a file
/// without `directory` is accepted with a warning, and no cache.
cache_config, |cf, conf, name| on_core(cf, conf, |c| {
    once(&mut c.tuning, name)?;
    let Some(file) = raw_arg(cf, 1) else {
        return Err(format!("tollgate: {name} FILE;"));
    };
    let (path, text) = crate::conf_file::read(cf, file).map_err(|e| format!("tollgate: {name}: {e}"))?;
    match cache_directory(&text) {
        Ok(Some(dir)) => {
            // Kept with the `wasm{}` block's own configuration, which compiles the modules.
            let Some(core) = crate::wasm_block::core_conf::core_conf((*cf).cycle) else {
                return Err("tollgate: no wasm configuration".to_string());
            };
            core.kong_cache_config = Some(tollgate_host::CompiledCache::new(dir));
        }
        Ok(None) => {}
        Err(CacheConfigError::NoDirectory) => crate::util::conf_log(
            crate::util::level::WARN,
            cf,
            &format!(
                "tollgate: {name} \"{}\" names no [cache] directory: no compiled-code cache \
                 (tollgate_compiled_cache DIR; sets one)",
                path.display()
            ),
        ),
        Err(CacheConfigError::Invalid(e)) => {
            return Err(format!("tollgate: {name} \"{}\": {e}", path.display()))
        }
    }
    Ok(())
}));

/// Why a Wasmtime cache configuration gives no directory.
#[derive(Debug, PartialEq)]
enum CacheConfigError {
    /// Valid, without `[cache] directory`.
    NoDirectory,
    /// Not TOML, or a field of the wrong type (the message names it).
    Invalid(String),
}

/// The compiled-code directory of a Wasmtime cache configuration: `[cache] directory`, `None`
/// when `[cache] enabled = false`.
fn cache_directory(text: &[u8]) -> Result<Option<std::path::PathBuf>, CacheConfigError> {
    let invalid = |m: &str| CacheConfigError::Invalid(m.to_string());
    let text = std::str::from_utf8(text).map_err(|_| invalid("not UTF-8"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| invalid(e.message()))?;
    let Some(cache) = table.get("cache") else {
        return Err(CacheConfigError::NoDirectory);
    };
    let cache = cache
        .as_table()
        .ok_or_else(|| invalid("cache is not a table"))?;
    match cache.get("enabled").map(toml::Value::as_bool) {
        Some(Some(false)) => return Ok(None),
        Some(None) => return Err(invalid("cache.enabled is not a boolean")),
        _ => {}
    }
    let Some(dir) = cache.get("directory") else {
        return Err(CacheConfigError::NoDirectory);
    };
    let dir = dir
        .as_str()
        .ok_or_else(|| invalid("cache.directory is not a string"))?;
    let dir = std::path::PathBuf::from(dir);
    if !dir.is_absolute() {
        return Err(invalid("cache.directory is not an absolute path"));
    }
    Ok(Some(dir))
}

handler!(slab_size, |cf, conf, name| on_core(cf, conf, |c| {
    let v = arg(cf, 1);
    let Some(bytes) = raw_arg(cf, 1).and_then(|a| size_of(a)) else {
        return Err(format!("tollgate: {name}: invalid shm size \"{v}\""));
    };
    if bytes < MIN_SLAB_BYTES {
        return Err(format!(
            "tollgate: {name}: shm size of {bytes} bytes is too small, minimum required is \
             {MIN_SLAB_BYTES} bytes"
        ));
    }
    if bytes % 4096 != 0 {
        return Err(format!(
            "tollgate: {name}: shm size of {bytes} bytes is not page-aligned, must be a \
             multiple of 4096"
        ));
    }
    once(&mut c.tuning, name)
}));

handler!(max_metric_name_length, |cf, conf, name| on_core(
    cf,
    conf,
    |c| {
        let v = arg(cf, 1);
        match v.parse::<usize>() {
            Ok(n) if n >= 6 => once(&mut c.tuning, name),
            Ok(_) => Err(format!(
                "tollgate: invalid value \"{v}\" in \"{name}\": value too small (min: 6)"
            )),
            Err(_) => Err(format!(
                "tollgate: invalid value \"{v}\" in \"{name}\": a number of bytes"
            )),
        }
    }
));

// ----- http{}, server{}, location{} -----

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

handler!(loc_flag_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    flag(cf, name)?;
    once(&mut l.tuning, name)
}));

handler!(loc_size_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    size(cf, name)?;
    once(&mut l.tuning, name)
}));

handler!(loc_bufs_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    bufs(cf, name)?;
    once(&mut l.tuning, name)
}));

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

// ----- the module -----

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

const IN_WASM: u32 = TOLLGATE_WASM_CONF as u32 | NGX_DIRECT_CONF;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{cache_directory, CacheConfigError};

    #[test]
    fn a_wasmtime_cache_configuration_names_the_directory() {
        let dir = |t: &str| cache_directory(t.as_bytes());
        // Wasmtime's documented form (docs/cli-cache.md).
        assert_eq!(
            dir("[cache]\nenabled = true\ndirectory = \"/var/cache/wasm\"\ncleanup-interval = \"30m\"\n"),
            Ok(Some("/var/cache/wasm".into()))
        );
        assert_eq!(dir("[cache]\ndirectory = \"/c\"\n"), Ok(Some("/c".into())));
        assert_eq!(
            dir("[cache]\nenabled = false\ndirectory = \"/c\"\n"),
            Ok(None)
        );
        assert_eq!(
            dir("[cache]\nenabled = true\n"),
            Err(CacheConfigError::NoDirectory)
        );
        assert_eq!(dir(""), Err(CacheConfigError::NoDirectory));
        for bad in [
            "[cache\n",
            "cache = 1\n",
            "[cache]\nenabled = \"yes\"\n",
            "[cache]\ndirectory = 7\n",
            "[cache]\ndirectory = \"relative/dir\"\n",
        ] {
            assert!(
                matches!(dir(bad), Err(CacheConfigError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            cache_directory(b"\xff"),
            Err(CacheConfigError::Invalid(_))
        ));
    }
}
