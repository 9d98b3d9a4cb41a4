//! The HTTP module's directives (http, server, location):
//! - `proxy_wasm NAME [CONFIG];` adds a filter (a root context of module `NAME` configured
//!   with `CONFIG`) to the level's chain. Several in a row form a chain run in order. As in
//!   ngx_wasm_module, a level that has its own `proxy_wasm` directives does not inherit the
//!   outer level's chain; one without any inherits it whole.
//! - `tollgate_proxy_wasm_file NAME FILE;`: `proxy_wasm NAME CONFIG;` with `CONFIG` read from
//!   `FILE` (Tollgate's own directive, for configurations of any size: `conf_file`).
//! - `proxy_wasm_isolation none|stream|filter;` (inherited).
//! - `proxy_wasm_request_headers_in_access on|off;` (inherited; default off: rewrite phase).
//! - `tollgate_metrics;` (location): the Prometheus text endpoint (Tollgate's own directive).
//! - ngx_wasm_module's other http directives: `kong_directives/`.

use std::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_conf_ctx_t, ngx_http_core_loc_conf_t, ngx_uint_t,
    NGX_CONF_FLAG, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_CONF_TAKE2,
    NGX_HTTP_LOC_CONF,
};
use ngx::ngx_string;

use crate::base::main_conf_of_cf;
use crate::command_table::{command_table, loc_command, ANY_LEVEL};
use crate::conf::{FilterDef, Isolation, LocConf, MainConf};
use crate::util::{bytes, conf_args, conf_error, lossy, CONF_OK};
use crate::wasm_block::core_conf::core_conf;

pub(crate) unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: pool allocation with a drop cleanup.
    unsafe {
        ngx::core::Pool::from_ngx_pool((*cf).pool)
            .allocate(MainConf::default())
            .cast()
    }
}

pub(crate) unsafe extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: as above.
    unsafe {
        ngx::core::Pool::from_ngx_pool((*cf).pool)
            .allocate(LocConf::default())
            .cast()
    }
}

pub(crate) unsafe extern "C" fn merge_loc_conf(
    _cf: *mut ngx_conf_t,
    prev: *mut c_void,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: both are LocConf from create_loc_conf.
    unsafe {
        let (Some(prev), Some(conf)) = (
            prev.cast::<LocConf>().as_ref(),
            conf.cast::<LocConf>().as_mut(),
        ) else {
            return crate::util::CONF_ERROR;
        };
        conf.merge(prev);
    }
    CONF_OK
}

unsafe extern "C" fn proxy_wasm_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_filter(cf, conf, false) }
}

unsafe extern "C" fn proxy_wasm_file_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_filter(cf, conf, true) }
}

/// `proxy_wasm NAME [CONFIG];`, or with `from_file`, `tollgate_proxy_wasm_file NAME FILE;`.
unsafe fn add_filter(cf: *mut ngx_conf_t, conf: *mut c_void, from_file: bool) -> *mut c_char {
    // SAFETY: `conf` is our LocConf; cf is live.
    unsafe {
        let Some(lcf) = conf.cast::<LocConf>().as_mut() else {
            return conf_error(cf, "tollgate: no configuration");
        };
        let args = conf_args(cf);
        let Some(name) = args.get(1).map(lossy) else {
            return conf_error(cf, "tollgate: proxy_wasm NAME [CONFIG];");
        };
        let Some(core) = core_conf((*cf).cycle) else {
            return conf_error(cf, "tollgate: no wasm{} block");
        };
        let Some((module, _)) = core.module(&name) else {
            return conf_error(cf, &format!("tollgate: unknown module \"{name}\" (declare it with \"module\" in a wasm{{}} block before http{{}})"));
        };
        let Some(main) = main_conf_of_cf(cf) else {
            return conf_error(cf, "tollgate: no http configuration");
        };
        let (config, file) = match (from_file, args.get(2)) {
            (false, arg) => (arg.map(|c| bytes(c).to_vec()).unwrap_or_default(), None),
            (true, Some(arg)) => match crate::conf_file::read(cf, arg) {
                Ok((path, contents)) => (contents, Some(path)),
                Err(e) => {
                    return conf_error(
                        cf,
                        &format!("tollgate: tollgate_proxy_wasm_file {name}: {e}"),
                    )
                }
            },
            (true, None) => return conf_error(cf, "tollgate: tollgate_proxy_wasm_file NAME FILE;"),
        };
        main.filters.push(FilterDef {
            name,
            module,
            config,
        });
        let idx = main.filters.len().saturating_sub(1);
        if let Some(path) = file {
            main.config_files.push((idx, path));
        }
        lcf.chain.get_or_insert_with(Vec::new).push(idx);
        CONF_OK
    }
}

unsafe extern "C" fn isolation_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as above.
    unsafe {
        let Some(lcf) = conf.cast::<LocConf>().as_mut() else {
            return conf_error(cf, "tollgate: no configuration");
        };
        if lcf.isolation.is_some() {
            return conf_error(
                cf,
                "tollgate: \"proxy_wasm_isolation\" directive is duplicate",
            );
        }
        let v = conf_args(cf)
            .get(1)
            .map(|s| bytes(s).to_vec())
            .unwrap_or_default();
        let Some(isolation) = Isolation::parse(&v) else {
            return conf_error(
                cf,
                &format!(
                    "tollgate: invalid isolation \"{}\" (none, stream or filter)",
                    String::from_utf8_lossy(&v)
                ),
            );
        };
        lcf.isolation = Some(isolation);
        CONF_OK
    }
}

unsafe extern "C" fn in_access_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as above.
    unsafe {
        let Some(lcf) = conf.cast::<LocConf>().as_mut() else {
            return conf_error(cf, "tollgate: no configuration");
        };
        let v = conf_args(cf)
            .get(1)
            .map(|s| bytes(s).to_ascii_lowercase())
            .unwrap_or_default();
        lcf.headers_in_access = Some(match v.as_slice() {
            b"on" => true,
            b"off" => false,
            _ => return conf_error(cf, "tollgate: proxy_wasm_request_headers_in_access on|off;"),
        });
        CONF_OK
    }
}

unsafe extern "C" fn metrics_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: the core module's location configuration of the same context.
    unsafe {
        let Some(lcf) = conf.cast::<LocConf>().as_mut() else {
            return conf_error(cf, "tollgate: no configuration");
        };
        lcf.metrics = true;
        let ctx = (*cf).ctx.cast::<ngx_http_conf_ctx_t>();
        let clcf = (*(*ctx)
            .loc_conf
            .add(nginx_sys::ngx_http_core_module.ctx_index))
        .cast::<ngx_http_core_loc_conf_t>();
        if clcf.is_null() {
            return conf_error(cf, "tollgate: no location");
        }
        (*clcf).handler = Some(crate::metrics_endpoint::handler);
        CONF_OK
    }
}

/// The directives of this file.
const TOLLGATE_HTTP_COMMANDS: [ngx_command_t; 5] = [
    loc_command!(
        "proxy_wasm",
        ANY_LEVEL | NGX_CONF_TAKE12,
        proxy_wasm_directive
    ),
    loc_command!(
        "tollgate_proxy_wasm_file",
        ANY_LEVEL | NGX_CONF_TAKE2,
        proxy_wasm_file_directive
    ),
    loc_command!(
        "proxy_wasm_isolation",
        ANY_LEVEL | NGX_CONF_TAKE1,
        isolation_directive
    ),
    loc_command!(
        "proxy_wasm_request_headers_in_access",
        ANY_LEVEL | NGX_CONF_FLAG,
        in_access_directive
    ),
    loc_command!(
        "tollgate_metrics",
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        metrics_directive
    ),
];

pub(crate) static mut HTTP_TABLE: [ngx_command_t; 19] = command_table(
    TOLLGATE_HTTP_COMMANDS,
    crate::kong_directives::KONG_HTTP_COMMANDS,
);
