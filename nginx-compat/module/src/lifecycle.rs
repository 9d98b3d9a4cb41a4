//! The HTTP module's life cycle: `postconfiguration` (phase handlers and filters installed,
//! every filter's configuration checked in the master: fail closed at `nginx -t`),
//! `init_process` (the worker's instances and root contexts) and `exit_process`.

use std::rc::Rc;

use ngx::ffi::{
    ngx_array_push, ngx_conf_t, ngx_cycle_t, ngx_http_conf_ctx_t, ngx_http_core_main_conf_t,
    ngx_http_handler_pt, ngx_int_t,
};

use crate::base::{main_conf_of_cf, main_conf_of_cycle, rc};
use crate::util::{level, log};
use crate::wasm_block::compile::engine;
use crate::wasm_block::core_conf::core_conf;
use crate::worker::{ModuleRt, Worker};

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

/// Whether every server of the http configuration `cmcf` keeps `underscores_in_headers off` and
/// `ignore_invalid_headers on` (`header_names.rs`); `false` without servers.
///
/// # Safety
/// `cmcf` must be null or the core module's main configuration of a parsed `http {}` block.
unsafe fn nginx_drops_other_names(cmcf: *const ngx_http_core_main_conf_t) -> bool {
    // SAFETY: the caller's configuration; its `servers` array holds one server configuration
    // pointer per `server {}`, live for the cycle.
    unsafe {
        if cmcf.is_null() || (*cmcf).servers.elts.is_null() {
            return false;
        }
        let servers = std::slice::from_raw_parts(
            (*cmcf)
                .servers
                .elts
                .cast::<*mut nginx_sys::ngx_http_core_srv_conf_t>(),
            (*cmcf).servers.nelts,
        );
        !servers.is_empty()
            && servers.iter().all(|&cscf| {
                !cscf.is_null()
                    && (*cscf).underscores_in_headers == 0
                    && (*cscf).ignore_invalid_headers != 0
            })
    }
}

pub(crate) unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
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
            Some(crate::phases::rewrite_handler),
        ) && push_phase(
            cmcf,
            nginx_sys::ngx_http_phases_NGX_HTTP_ACCESS_PHASE as usize,
            Some(crate::phases::access_handler),
        ) && push_phase(
            cmcf,
            nginx_sys::ngx_http_phases_NGX_HTTP_LOG_PHASE as usize,
            Some(crate::phases::log_handler),
        );
        if !ok {
            return rc::ERROR;
        }
        if let Some(main) = main_conf_of_cf(cf) {
            main.plain_header_names = nginx_drops_other_names(cmcf);
        }
        crate::response_filters::install();

        if let Err(e) = crate::metrics_endpoint::configure(cf) {
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
        let host = Rc::new(crate::worker_host::ConfHost::new(
            (*cf).log,
            queues,
            core.zone_evictions(),
            main.plain_header_names,
        ));
        // The guests' start-up calls run under their deadline here too (a looping on_configure
        // fails `nginx -t`); the ticker thread is joined before this returns, so no thread
        // outlives the configuration into a fork.
        let _ticker = engine()
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

pub(crate) unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: the cycle's configurations are complete in a worker.
    unsafe {
        let Some(core) = core_conf(cycle) else {
            return rc::OK;
        };
        let Some(main) = main_conf_of_cycle(cycle) else {
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
        let metrics = crate::metrics_endpoint::worker_zone(cycle);
        let queues = core
            .queue_zones
            .iter()
            .filter_map(|z| z.queue.clone())
            .collect();
        // The clock of every guest deadline, from before the first call into a guest (the
        // root contexts' creation in Worker::new) until the worker exits.
        let ticker = match engine().and_then(|e| e.start_epoch_ticker().map_err(|e| e.0)) {
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
        let calls = crate::kong_directives::kong_core::kong_conf(cycle).map_or_else(
            crate::worker_host::CallConf::default,
            |k| crate::worker_host::CallConf {
                root: k.root_calls(),
                hosts: k.hosts.clone(),
            },
        );
        let host = crate::worker_host::WorkerHost::new((*cycle).log, Some(zones), metrics, queues)
            .with_calls(calls)
            .with_evictions(core.zone_evictions())
            .with_plain_header_names(main.plain_header_names);
        // Completed calls wake the worker through an eventfd; without one (no descriptor or
        // connection left), the poll timer collects them every 2 ms.
        match crate::wake::open(cycle, crate::timers::wake_handler) {
            Ok(waker) => {
                if let Ok(mut r) = host.runner.try_borrow_mut() {
                    r.set_waker(std::sync::Arc::clone(&waker));
                }
                if let Ok(mut g) = host.grpc.try_borrow_mut() {
                    g.set_waker(waker);
                }
            }
            Err(e) => log(
                level::WARN,
                (*cycle).log,
                &format!("tollgate: {e}: call completions are polled every 2 ms instead"),
            ),
        }
        let mut w = Worker::new(
            modules,
            main.filters.clone(),
            (*cycle).log,
            host,
            crate::request::resume::orphaned,
        );
        w.ticker = ticker;
        w.poll.handler = Some(crate::timers::poll_handler);
        w.poll.data = crate::worker::timer_data();
        w.poll.log = (*cycle).log;
        w.poll.set_cancelable(1);
        w.arm_ticks(crate::timers::tick_handler);
        crate::worker::install(w);
        crate::timers::kick_calls();
        rc::OK
    }
}

pub(crate) unsafe extern "C" fn exit_process(_cycle: *mut ngx_cycle_t) {
    crate::worker::with_worker(crate::worker::Worker::done_roots);
    crate::worker::uninstall();
    // SAFETY: the worker's main thread, after its state (and the runners) are gone.
    unsafe { crate::wake::close() };
}
