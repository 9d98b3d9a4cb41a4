//! The HTTP module: `proxy_wasm` chains and the request path.
//!
//! Directives (http, server, location):
//! - `proxy_wasm NAME [CONFIG];` adds a filter (a root context of module `NAME` configured
//!   with `CONFIG`) to the level's chain. Several in a row form a chain run in order. As in
//!   ngx_wasm_module, a level that has its own `proxy_wasm` directives does not inherit the
//!   outer level's chain; one without any inherits it whole.
//! - `proxy_wasm_isolation none|stream|filter;` (inherited).
//! - `proxy_wasm_request_headers_in_access on|off;` (inherited; default off: rewrite phase).
//! - `tollgate_proxy_wasm_file NAME FILE;`: `proxy_wasm NAME CONFIG;` with `CONFIG` read from
//!   `FILE` (Tollgate's own directive, for configurations of any size: `conf_file`).
//! - `tollgate_metrics;` (location): the Prometheus text endpoint (Tollgate's own directive).
//! - Every other ngx_wasm_module http directive fails `nginx -t` with a clear message.

use std::ffi::{c_char, c_void};
use std::rc::Rc;

use ngx::ffi::{
    ngx_array_push, ngx_chain_t, ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_conf_ctx_t,
    ngx_http_core_loc_conf_t, ngx_http_core_main_conf_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_output_body_filter_pt, ngx_http_output_header_filter_pt, ngx_http_request_t,
    ngx_int_t, ngx_module_t, ngx_uint_t, NGX_CONF_ANY, NGX_CONF_FLAG, NGX_CONF_NOARGS,
    NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_CONF_TAKE2, NGX_HTTP_LOC_CONF, NGX_HTTP_MAIN_CONF,
    NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF,
};
use ngx::ngx_string;

use crate::core::{command, core_conf, unsupported};
use crate::request::{
    get_ctx, rc, send_local, Isolation, Outcome, Phase, RequestCtx, ResponseFailure,
};
use crate::util::{bytes, conf_args, conf_error, level, log, lossy, CONF_OK};
use crate::worker::{with_worker, FilterDef, ModuleRt, Worker};

/// The http{} level configuration: every `proxy_wasm` directive of the cycle.
#[derive(Default)]
pub struct MainConf {
    /// Filters by index (location chains refer to them).
    pub filters: Vec<FilterDef>,
    /// The file each filter's configuration was read from (`tollgate_proxy_wasm_file`), by
    /// filter index, for error messages.
    pub config_files: Vec<(usize, std::path::PathBuf)>,
}

/// A server or location configuration.
#[derive(Default, Clone)]
pub struct LocConf {
    /// The chain (`None`: not set at this level, inherited).
    pub chain: Option<Vec<usize>>,
    /// `proxy_wasm_isolation`.
    pub isolation: Option<Isolation>,
    /// `proxy_wasm_request_headers_in_access`.
    pub headers_in_access: Option<bool>,
    /// `tollgate_metrics` here.
    pub metrics: bool,
}

static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY_FILTER: ngx_http_output_body_filter_pt = None;

unsafe fn main_conf_of_cf<'a>(cf: *mut ngx_conf_t) -> Option<&'a mut MainConf> {
    // SAFETY: during http{} parsing cf->ctx is an ngx_http_conf_ctx_t.
    unsafe {
        let ctx = (*cf).ctx.cast::<ngx_http_conf_ctx_t>();
        let idx = ngx_http_tollgate_wasm_module.ctx_index;
        (*(*ctx).main_conf.add(idx)).cast::<MainConf>().as_mut()
    }
}

unsafe fn loc_conf<'a>(r: *mut ngx_http_request_t) -> Option<&'a LocConf> {
    // SAFETY: r->loc_conf is indexed by ctx_index.
    unsafe {
        let idx = ngx_http_tollgate_wasm_module.ctx_index;
        (*(*r).loc_conf.add(idx)).cast::<LocConf>().as_ref()
    }
}

unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: pool allocation with a drop cleanup.
    unsafe {
        ngx::core::Pool::from_ngx_pool((*cf).pool)
            .allocate(MainConf::default())
            .cast()
    }
}

unsafe extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: as above.
    unsafe {
        ngx::core::Pool::from_ngx_pool((*cf).pool)
            .allocate(LocConf::default())
            .cast()
    }
}

unsafe extern "C" fn merge_loc_conf(
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
        if conf.chain.is_none() {
            conf.chain = prev.chain.clone();
        }
        if conf.isolation.is_none() {
            conf.isolation = prev.isolation;
        }
        if conf.headers_in_access.is_none() {
            conf.headers_in_access = prev.headers_in_access;
        }
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
        lcf.isolation = Some(match v.as_slice() {
            b"none" => Isolation::None,
            b"stream" => Isolation::Stream,
            b"filter" => Isolation::Filter,
            _ => {
                return conf_error(
                    cf,
                    &format!(
                        "tollgate: invalid isolation \"{}\" (none, stream or filter)",
                        String::from_utf8_lossy(&v)
                    ),
                )
            }
        });
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
        (*clcf).handler = Some(crate::metrics::handler);
        CONF_OK
    }
}

const ANY_LEVEL: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;
const LOC_OFFSET: ngx_uint_t = nginx_sys::NGX_HTTP_LOC_CONF_OFFSET as ngx_uint_t;

macro_rules! loc_command {
    ($name:literal, $type:expr, $set:expr) => {
        ngx_command_t {
            conf: LOC_OFFSET,
            ..command!($name, $type, $set)
        }
    };
}

static mut HTTP_COMMANDS: [ngx_command_t; 18] = [
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
    loc_command!(
        "proxy_wasm_lua_resolver",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!("resolver_add", ANY_LEVEL | NGX_CONF_ANY, unsupported),
    loc_command!("wasm_call", ANY_LEVEL | NGX_CONF_ANY, unsupported),
    loc_command!(
        "wasm_socket_buffer_reuse",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_socket_buffer_size",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_socket_connect_timeout",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_socket_large_buffers",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_socket_read_timeout",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_socket_send_timeout",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_postpone_rewrite",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_postpone_access",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    loc_command!(
        "wasm_response_body_buffers",
        ANY_LEVEL | NGX_CONF_ANY,
        unsupported
    ),
    ngx_command_t::empty(),
];

unsafe fn push_phase(
    cmcf: *mut ngx_http_core_main_conf_t,
    phase: usize,
    h: ngx_http_handler_pt,
) -> bool {
    // SAFETY: cmcf->phases[phase].handlers is an ngx_array_t of handler pointers.
    unsafe {
        let Some(ph) = (*cmcf).phases.get_mut(phase) else {
            return false;
        };
        let slot = ngx_array_push(&mut ph.handlers).cast::<ngx_http_handler_pt>();
        if slot.is_null() {
            return false;
        }
        *slot = h;
        true
    }
}

unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: standard module initialisation on the http configuration.
    unsafe {
        let ctx = (*cf).ctx.cast::<ngx_http_conf_ctx_t>();
        let cmcf = (*(*ctx)
            .main_conf
            .add(nginx_sys::ngx_http_core_module.ctx_index))
        .cast::<ngx_http_core_main_conf_t>();
        let ok = push_phase(
            cmcf,
            nginx_sys::ngx_http_phases_NGX_HTTP_REWRITE_PHASE as usize,
            Some(rewrite_handler),
        ) && push_phase(
            cmcf,
            nginx_sys::ngx_http_phases_NGX_HTTP_ACCESS_PHASE as usize,
            Some(access_handler),
        ) && push_phase(
            cmcf,
            nginx_sys::ngx_http_phases_NGX_HTTP_LOG_PHASE as usize,
            Some(log_handler),
        );
        if !ok {
            return rc::ERROR;
        }
        NEXT_HEADER_FILTER = nginx_sys::ngx_http_top_header_filter;
        nginx_sys::ngx_http_top_header_filter = Some(header_filter);
        NEXT_BODY_FILTER = nginx_sys::ngx_http_top_body_filter;
        nginx_sys::ngx_http_top_body_filter = Some(body_filter);

        if let Err(e) = crate::metrics::configure(cf) {
            crate::util::conf_log(level::EMERG, cf, &e);
            return rc::ERROR;
        }
        match validate(cf) {
            Ok(()) => rc::OK,
            Err(e) => {
                crate::util::conf_log(level::EMERG, cf, &e);
                rc::ERROR
            }
        }
    }
}

/// Fail closed at configuration time: instantiate every module used by a filter and create
/// the filters' root contexts (`on_vm_start`, `on_configure`) in the master; the instances are
/// dropped right after (workers make their own).
unsafe fn validate(cf: *mut ngx_conf_t) -> Result<(), String> {
    // SAFETY: cf is live; configurations were created by nginx.
    unsafe {
        let Some(main) = main_conf_of_cf(cf) else {
            return Ok(());
        };
        let Some(core) = core_conf((*cf).cycle) else {
            return Ok(());
        };
        let queues = core.queue_zones.iter().map(|z| z.name.clone()).collect();
        let host = Rc::new(crate::host::ConfHost::new((*cf).log, queues));
        // The guests' start-up calls run under their deadline here too (a looping on_configure
        // fails `nginx -t`); the ticker thread is joined before this returns, so no thread
        // outlives the configuration into a fork.
        let _ticker = crate::core::engine()
            .and_then(|e| e.start_epoch_ticker().map_err(|e| e.0))
            .map_err(|e| format!("tollgate: {e}"))?;
        for (m, def) in core.modules.iter().enumerate() {
            if !main.filters.iter().any(|f| f.module == m) {
                continue;
            }
            let mut vm = tollgate_host::Vm::new_with_limits(
                &def.module,
                host.clone(),
                &def.name,
                &def.vm_config,
                &core.limits,
            )
            .map_err(|e| format!("tollgate: module \"{}\": {}", def.name, e.0))?;
            for (i, f) in main
                .filters
                .iter()
                .enumerate()
                .filter(|(_, f)| f.module == m)
            {
                vm.create_root(&f.name, &f.config).map_err(|e| {
                    let file = main
                        .config_files
                        .iter()
                        .find(|(idx, _)| *idx == i)
                        .map(|(_, path)| format!(" (read from \"{}\")", path.display()))
                        .unwrap_or_default();
                    format!(
                        "tollgate: filter \"{}\" refused its configuration{file}: {}",
                        f.name, e.0
                    )
                })?;
            }
        }
        Ok(())
    }
}

unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: the cycle's configurations are complete in a worker.
    unsafe {
        let Some(core) = core_conf(cycle) else {
            return rc::OK;
        };
        let http_idx = nginx_sys::ngx_http_module.index;
        let http_ctx = *(*cycle).conf_ctx.add(http_idx);
        if http_ctx.is_null() {
            return rc::OK;
        }
        let hctx = http_ctx.cast::<ngx_http_conf_ctx_t>();
        let idx = ngx_http_tollgate_wasm_module.ctx_index;
        let Some(main) = (*(*hctx).main_conf.add(idx)).cast::<MainConf>().as_ref() else {
            return rc::OK;
        };
        if main.filters.is_empty() {
            return rc::OK;
        }
        let modules: Vec<ModuleRt> = core
            .modules
            .iter()
            .map(|m| ModuleRt {
                name: m.name.clone(),
                vm_config: m.vm_config.clone(),
                module: m.module.clone(),
                limits: core.limits,
            })
            .collect();
        let mut zones = tollgate_services::kv::ZoneSet::new();
        for z in &core.kv_zones {
            if let Some(kv) = z.kv.clone() {
                let _ = zones.insert(kv);
            }
        }
        let metrics = crate::metrics::worker_zone(cycle);
        let queues = core
            .queue_zones
            .iter()
            .filter_map(|z| z.queue.clone())
            .collect();
        // The clock of every guest deadline, from before the first call into a guest (the
        // root contexts' creation in Worker::new) until the worker exits.
        let ticker = match crate::core::engine()
            .and_then(|e| e.start_epoch_ticker().map_err(|e| e.0))
        {
            Ok(t) => Some(t),
            Err(e) => {
                log(
                    level::EMERG,
                    (*cycle).log,
                    &format!("tollgate: {e}: guest calls would have no deadline; the worker exits"),
                );
                return rc::ERROR;
            }
        };
        let mut w = Worker::new(
            modules,
            main.filters.clone(),
            (*cycle).log,
            zones,
            metrics,
            queues,
        );
        w.ticker = ticker;
        w.poll.handler = Some(poll_handler);
        w.poll.data = crate::worker::timer_data();
        w.poll.log = (*cycle).log;
        w.poll.set_cancelable(1);
        w.arm_ticks();
        crate::worker::install(w);
        kick_calls();
        rc::OK
    }
}

unsafe extern "C" fn exit_process(_cycle: *mut ngx_cycle_t) {
    crate::worker::uninstall();
}

/// Runs one step of a request's filter chain with the worker state (`Failed` when it is not
/// available), then arms the poll timer for any HTTP call the filters dispatched.
fn run_chain(step: impl FnOnce(&mut Worker) -> Outcome) -> Outcome {
    let out = with_worker(step).unwrap_or(Outcome::Failed);
    kick_calls();
    out
}

/// Arms the worker's poll timer: every 2 ms while HTTP calls are pending, every
/// [`crate::host::QUEUE_POLL_MS`] while a root context of the worker has registered a shared
/// queue (`on_queue_ready`, not in an exiting worker); not at all otherwise.
pub fn kick_calls() {
    with_worker(|w| {
        // SAFETY: reading nginx's process-wide exit flags (this worker's own memory).
        let exiting = unsafe { nginx_sys::ngx_exiting != 0 || nginx_sys::ngx_quit != 0 };
        let delay: ngx::ffi::ngx_msec_t = if crate::calls::inflight(w) {
            // Requests may be waiting for these answers, exiting or not.
            2
        } else if w.has_queues() && !exiting {
            crate::host::QUEUE_POLL_MS
        } else {
            return;
        };
        // SAFETY: the worker's own timer event.
        unsafe {
            if w.poll.timer_set() == 0 {
                nginx_sys::ngx_add_timer(&mut *w.poll, delay);
            }
        }
    });
}

unsafe extern "C" fn poll_handler(_ev: *mut ngx_event_t) {
    let resumed = with_worker(|w| {
        let mut resumed = crate::calls::poll(w);
        resumed.extend(w.poll_queues());
        resumed
    })
    .unwrap_or_default();
    crate::request::resume_all(resumed);
    kick_calls();
}

use ngx::ffi::ngx_event_t;

fn has_body(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: reading a live request.
    unsafe { (*r).headers_in.content_length_n > 0 || (*r).headers_in.chunked() != 0 }
}

unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a live request.
    unsafe { request_phase(r, false) }
}

unsafe extern "C" fn access_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: as above.
    unsafe { request_phase(r, true) }
}

unsafe fn finalize(r: *mut ngx_http_request_t, code: ngx_int_t) -> ngx_int_t {
    // SAFETY: the phase handler finalizes itself and tells the checker it is done (the same in
    // the rewrite and access phases, whose checkers treat NGX_OK differently).
    unsafe { nginx_sys::ngx_http_finalize_request(r, code) };
    rc::DONE
}

/// The name of a filter among the first `upto` of the request that cannot run any more.
fn failed_filter(ctx: &RequestCtx, upto: usize) -> Option<String> {
    let f = ctx.slots.iter().take(upto).find(|s| s.failed)?.filter;
    Some(
        with_worker(|w| w.filters.get(f).map(|d| d.name.clone()))
            .flatten()
            .unwrap_or_default(),
    )
}

/// Logs why a request is refused (the request's log) and finalizes it with 500.
unsafe fn refuse(r: *mut ngx_http_request_t, why: &str) -> ngx_int_t {
    // SAFETY: a live request.
    unsafe {
        log(
            level::ERR,
            (*(*r).connection).log,
            &format!("tollgate: {why}"),
        );
        finalize(r, rc::HTTP_INTERNAL_SERVER_ERROR)
    }
}

/// The request side of the chain, in the rewrite phase (or the access phase with
/// `proxy_wasm_request_headers_in_access on`): `on_request_headers` of the location's filters,
/// then the body and `on_request_body` when a filter reads it. Re-entered after a pause, after
/// the body is read, and after an internal redirect (see `request.rs`).
unsafe fn request_phase(r: *mut ngx_http_request_t, access: bool) -> ngx_int_t {
    // SAFETY: a live request; nginx is never called while the worker state is borrowed.
    unsafe {
        let Some(lcf) = loc_conf(r) else {
            return rc::DECLINED;
        };
        let chain = lcf.chain.as_ref().filter(|c| !c.is_empty());
        if lcf.headers_in_access.unwrap_or(false) != access {
            return rc::DECLINED;
        }
        let ctx: &mut RequestCtx = match (get_ctx(r), chain) {
            (Some(c), _) => c,
            (None, None) => return rc::DECLINED,
            (None, Some(_)) => match RequestCtx::create(r) {
                Some(c) => c,
                None => {
                    return refuse(
                        r,
                        "cannot allocate the request context: refusing the request",
                    )
                }
            },
        };
        if let Some(chain) = chain {
            let isolation = lcf.isolation.unwrap_or_default();
            let Some(added) = with_worker(|w| ctx.enter_chain(w, chain, isolation)) else {
                return refuse(
                    r,
                    "the worker's filter state is unavailable: refusing the request",
                );
            };
            if added {
                // Fresh, or an internal redirect added filters: they see the request as it is
                // now. Hop-by-hop fields the upstream must not get are dropped by writing the
                // map back.
                let (map, drops) = crate::headers::request_map(r);
                ctx.stream.request_headers = map;
                ctx.stream.request_headers_changed = drops;
            }
        }
        loop {
            match ctx.phase {
                Phase::Fresh => return rc::DECLINED,
                Phase::Headers(from) => {
                    if let Some(name) = failed_filter(ctx, from) {
                        ctx.phase = Phase::Forward;
                        ctx.refused = true;
                        return refuse(r, &format!("filter \"{name}\" cannot run on this request any more (its instance trapped and was replaced): refusing it"));
                    }
                    if let Some(lr) = ctx.stream.local_response.take() {
                        let code = send_local(r, ctx, lr);
                        return finalize(r, code);
                    }
                    if ctx.stream.closed {
                        ctx.phase = Phase::Forward;
                        return finalize(r, rc::HTTP_CLOSE);
                    }
                    let eos = !has_body(r);
                    let out = run_chain(|w| ctx.request_headers(w, from, eos));
                    match out {
                        Outcome::Continue => {
                            if std::mem::take(&mut ctx.stream.request_headers_changed) {
                                if let Err(e) = crate::headers::apply_request_map(
                                    r,
                                    &ctx.stream.request_headers,
                                ) {
                                    ctx.phase = Phase::Forward;
                                    return refuse(r, &format!("request headers: {e}"));
                                }
                                flush_header_variables(r);
                            }
                            if has_body(r) && ctx.wants_request_body && !ctx.body_read {
                                return start_body(r, ctx);
                            }
                            ctx.phase = if ctx.body_read && ctx.body_done < ctx.started {
                                Phase::Body(ctx.body_done)
                            } else {
                                Phase::Forward
                            };
                        }
                        Outcome::Paused(next) => {
                            ctx.phase = Phase::Paused(next);
                            return rc::DONE;
                        }
                        Outcome::Local(lr) => {
                            let code = send_local(r, ctx, lr);
                            return finalize(r, code);
                        }
                        Outcome::Failed => {
                            ctx.phase = Phase::Forward;
                            ctx.refused = true;
                            return finalize(r, rc::HTTP_INTERNAL_SERVER_ERROR);
                        }
                        Outcome::Closed => {
                            ctx.phase = Phase::Forward;
                            return finalize(r, rc::HTTP_CLOSE);
                        }
                    }
                }
                Phase::Paused(_) | Phase::BodyPaused(_) | Phase::ReadingBody => return rc::DONE,
                Phase::Body(from) => {
                    if let Some(name) = failed_filter(ctx, ctx.started) {
                        ctx.phase = Phase::Forward;
                        ctx.refused = true;
                        return refuse(r, &format!("filter \"{name}\" cannot run on this request any more (its instance trapped and was replaced): refusing it"));
                    }
                    if let Some(lr) = ctx.stream.local_response.take() {
                        let code = send_local(r, ctx, lr);
                        return finalize(r, code);
                    }
                    if ctx.stream.closed {
                        ctx.phase = Phase::Forward;
                        return finalize(r, rc::HTTP_CLOSE);
                    }
                    if !ctx.body_loaded {
                        ctx.stream.request_body = crate::body::read_request_body(r);
                        ctx.body_loaded = true;
                    }
                    let out = run_chain(|w| ctx.request_body(w, from));
                    match out {
                        Outcome::Local(lr) => {
                            let code = send_local(r, ctx, lr);
                            return finalize(r, code);
                        }
                        Outcome::Failed => {
                            ctx.phase = Phase::Forward;
                            ctx.refused = true;
                            return finalize(r, rc::HTTP_INTERNAL_SERVER_ERROR);
                        }
                        Outcome::Closed => {
                            ctx.phase = Phase::Forward;
                            return finalize(r, rc::HTTP_CLOSE);
                        }
                        Outcome::Paused(next) => {
                            ctx.phase = Phase::BodyPaused(next);
                            return rc::DONE;
                        }
                        Outcome::Continue => {}
                    }
                    if std::mem::take(&mut ctx.stream.request_body_changed) {
                        let body = std::mem::take(&mut ctx.stream.request_body);
                        if crate::body::replace_request_body(r, &body).is_none() {
                            ctx.phase = Phase::Forward;
                            return refuse(r, "cannot replace the request body");
                        }
                    }
                    ctx.stream.request_body.clear();
                    ctx.body_loaded = false;
                    ctx.phase = Phase::Forward;
                }
                Phase::Forward => return rc::DECLINED,
            }
        }
    }
}

unsafe fn start_body(r: *mut ngx_http_request_t, ctx: &mut RequestCtx) -> ngx_int_t {
    ctx.phase = Phase::ReadingBody;
    // SAFETY: the standard pattern of reading the body from a phase handler (as
    // ngx_http_mirror_module does): the post handler re-runs the phases.
    unsafe {
        (*r).set_request_body_in_single_buf(1);
        (*r).set_request_body_in_clean_file(1);
        let code = nginx_sys::ngx_http_read_client_request_body(r, Some(body_read));
        if code >= 300 {
            return code;
        }
        nginx_sys::ngx_http_finalize_request(r, rc::DONE);
        rc::DONE
    }
}

unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls the post handler with the live request.
    unsafe {
        if let Some(ctx) = get_ctx(r) {
            ctx.body_read = true;
            ctx.phase = Phase::Body(ctx.body_done);
        }
        (*r).write_event_handler = Some(nginx_sys::ngx_http_core_run_phases);
        nginx_sys::ngx_http_core_run_phases(r);
    }
}

/// Invalidates cached `$http_*` and `$cookie_*` variables after the headers changed.
unsafe fn flush_header_variables(r: *mut ngx_http_request_t) {
    // SAFETY: r->variables has one entry per indexed variable of the core main conf.
    unsafe {
        let cmcf = (*(*r)
            .main_conf
            .add(nginx_sys::ngx_http_core_module.ctx_index))
        .cast::<ngx_http_core_main_conf_t>();
        if cmcf.is_null() || (*r).variables.is_null() {
            return;
        }
        let vars = &(*cmcf).variables;
        let defs = std::slice::from_raw_parts(
            vars.elts.cast::<ngx::ffi::ngx_http_variable_t>(),
            vars.nelts,
        );
        for (i, v) in defs.iter().enumerate() {
            let name = bytes(&v.name);
            if name.starts_with(b"http_") || name.starts_with(b"cookie_") {
                let val = (*r).variables.add(i);
                (*val).set_valid(0);
                (*val).set_not_found(0);
            }
        }
    }
}

unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: a live request (a subrequest's only with `log_subrequest on`; otherwise its
    // filters' on_log runs when the main request's pool is freed).
    unsafe {
        if r == (*r).main {
            crate::metrics::count_request();
        }
        if let Some(ctx) = get_ctx(r) {
            with_worker(|w| ctx.finish(w));
            kick_calls();
        }
        rc::DECLINED
    }
}

unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: a live request in the header filter chain.
    unsafe {
        let next = NEXT_HEADER_FILTER;
        let call_next = |r| match next {
            Some(f) => f(r),
            None => rc::ERROR,
        };
        let Some(ctx) = get_ctx(r) else {
            return call_next(r);
        };
        if ctx.started == 0 || ctx.finished || ctx.response_failed.is_some() {
            return call_next(r);
        }
        ctx.stream.response_headers = crate::headers::response_map(r);
        ctx.stream.response_trailers = crate::headers::trailers_map(r);
        let eos = (*r).header_only() != 0 || (*r).headers_out.content_length_n == 0;
        if eos {
            ctx.resp_eos = true;
        }
        let out = run_chain(|w| ctx.response_headers(w, eos));
        match out {
            Outcome::Local(_) => log(
                level::WARN,
                (*(*r).connection).log,
                "tollgate: a local response after the response headers is not supported; ignored",
            ),
            Outcome::Failed => {
                // Fail closed: the response is replaced by a 500 (as nginx's own filters do on
                // an error in their header filter), never passed on without the filter.
                ctx.response_failed = Some(ResponseFailure::Replaced);
                log(
                    level::ERR,
                    (*(*r).connection).log,
                    "tollgate: on_response_headers failed: answering 500 instead of the response",
                );
                return nginx_sys::ngx_http_filter_finalize_request(
                    r,
                    &raw mut ngx_http_tollgate_wasm_module,
                    rc::HTTP_INTERNAL_SERVER_ERROR,
                );
            }
            _ => {}
        }
        if std::mem::take(&mut ctx.stream.response_headers_changed) {
            if let Err(e) = crate::headers::apply_response_map(r, &ctx.stream.response_headers) {
                log(
                    level::ERR,
                    (*(*r).connection).log,
                    &format!("tollgate: response headers: {e}"),
                );
            }
        }
        // A filter that sets trailers with the headers announces them, as `add_trailer` does:
        // nginx then chunks an HTTP/1.1 response (dropping its Content-Length) to carry them.
        // Trailers first set later reach HTTP/1.1 clients only if the response is chunked anyway.
        let announced =
            ctx.stream.response_trailers_changed && !ctx.stream.response_trailers.is_empty();
        apply_trailers_if_changed(r, ctx);
        if announced {
            (*r).set_expect_trailers(1);
        }
        call_next(r)
    }
}

/// Writes the response trailers back to `headers_out.trailers` when a filter changed them.
unsafe fn apply_trailers_if_changed(r: *mut ngx_http_request_t, ctx: &mut RequestCtx) {
    if !std::mem::take(&mut ctx.stream.response_trailers_changed) {
        return;
    }
    // SAFETY: a live main request in a response filter, before its last buffer went on.
    unsafe {
        if let Err(e) = crate::headers::apply_trailers(r, &ctx.stream.response_trailers) {
            log(
                level::ERR,
                (*(*r).connection).log,
                &format!("tollgate: response trailers: {e}"),
            );
        }
    }
}

unsafe extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: a live request in the body filter chain.
    unsafe {
        let next = NEXT_BODY_FILTER;
        let call_next = |r, c| match next {
            Some(f) => f(r, c),
            None => rc::ERROR,
        };
        if chain.is_null() {
            return call_next(r, chain);
        }
        let Some(ctx) = get_ctx(r) else {
            return call_next(r, chain);
        };
        match ctx.response_failed {
            Some(ResponseFailure::Cut) => {
                crate::body::consume(chain);
                return rc::ERROR;
            }
            Some(ResponseFailure::Replaced) => return call_next(r, chain),
            None => {}
        }
        if !ctx.wants_response_body {
            // No filter reads the body or the trailers: nothing to copy or call. Trailers that a
            // filter changed meanwhile (an HTTP call's callback) still go out.
            apply_trailers_if_changed(r, ctx);
            return call_next(r, chain);
        }
        if ctx.started == 0 || ctx.finished || ctx.resp_eos && !ctx.resp_buffering {
            return call_next(r, chain);
        }
        let (data, eos, flush) = crate::body::chain_bytes(chain);
        if data.is_empty() && !eos {
            if ctx.resp_buffering {
                crate::body::consume(chain);
                return rc::OK;
            }
            return call_next(r, chain);
        }
        if ctx.resp_buffering {
            ctx.stream.response_body.extend_from_slice(&data);
        } else {
            ctx.stream.response_body = data;
        }
        if eos {
            ctx.resp_eos = true;
            // The trailers nginx has by the last buffer: an upstream's (grpc_pass) or a filter's
            // earlier writes (`add_trailer`'s are added after this filter).
            ctx.stream.response_trailers = crate::headers::trailers_map(r);
        }
        let trailers_follow = eos && !ctx.stream.response_trailers.is_empty();
        let was_buffering = ctx.resp_buffering;
        ctx.resp_buffering = false;
        let mut out = run_chain(|w| ctx.response_body(w, eos));
        if trailers_follow && !matches!(out, Outcome::Failed) {
            out = run_chain(|w| ctx.response_trailers(w));
        }
        if let Outcome::Failed = out {
            // Fail closed: the rest of the response does not go out without the filter; the
            // connection is closed (Envoy resets the stream in this case).
            ctx.response_failed = Some(ResponseFailure::Cut);
            log(
                level::ERR,
                (*(*r).connection).log,
                "tollgate: a response body callback failed: closing the connection",
            );
            crate::body::consume(chain);
            return rc::ERROR;
        }
        apply_trailers_if_changed(r, ctx);
        if ctx.resp_buffering && !eos {
            // Keep the bytes; nothing goes out until the end of the stream.
            crate::body::consume(chain);
            return rc::OK;
        }
        let changed = std::mem::take(&mut ctx.stream.response_body_changed);
        if !changed && !was_buffering {
            ctx.stream.response_body.clear();
            return call_next(r, chain);
        }
        let body = std::mem::take(&mut ctx.stream.response_body);
        crate::body::consume(chain);
        let Some(out_chain) = crate::body::memory_chain(r, &body, eos, flush) else {
            return rc::ERROR;
        };
        call_next(r, out_chain)
    }
}

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
    commands: (&raw mut HTTP_COMMANDS).cast(),
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};
