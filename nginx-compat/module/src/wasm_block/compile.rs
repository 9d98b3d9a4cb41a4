//! The `wasm {}` block's handler: the block's directives parsed, the modules they read are
//! compiled together when it ends (through the compiled-code cache when one is configured), on
//! the process's one wasmtime engine ([`engine`]).

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::rc::Rc;

use ngx::ffi::{ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_uint_t, NGX_CORE_MODULE};

use super::core_conf::{core_conf, ModuleDef};
use crate::command_table::TOLLGATE_WASM_CONF;
use crate::util::{conf_error, CONF_OK};
thread_local! {
    /// One wasmtime engine per process, created on first use in the master (no threads).
    static ENGINE: RefCell<Option<Rc<tollgate_host::Engine>>> = const { RefCell::new(None) };
}

/// The process's engine (created on first use).
pub fn engine() -> Result<Rc<tollgate_host::Engine>, String> {
    ENGINE.with(|e| {
        let mut e = e.try_borrow_mut().map_err(|_| "engine busy".to_string())?;
        if let Some(engine) = e.as_ref() {
            return Ok(engine.clone());
        }
        let engine = Rc::new(tollgate_host::Engine::new().map_err(|err| err.0)?);
        *e = Some(engine.clone());
        Ok(engine)
    })
}

pub(super) unsafe extern "C" fn wasm_block(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: standard nested-block parsing: save and restore the parser's types around
    // ngx_conf_parse(cf, NULL), which parses the block's contents.
    unsafe {
        let saved_module_type = (*cf).module_type;
        let saved_cmd_type = (*cf).cmd_type;
        (*cf).module_type = NGX_CORE_MODULE as ngx_uint_t;
        (*cf).cmd_type = TOLLGATE_WASM_CONF;
        let rv = ngx_conf_parse(cf, std::ptr::null_mut());
        (*cf).module_type = saved_module_type;
        (*cf).cmd_type = saved_cmd_type;
        if !rv.is_null() {
            return rv;
        }
        compile_pending(cf)
    }
}

/// Compiles the modules the block read (`CoreConf::pending`), through the compiled-code cache
/// when one is configured, logging what the cache did per module (a warning when an entry was
/// not usable or not written).
///
/// # Safety
/// `cf` is live (the `wasm {}` block's handler).
unsafe fn compile_pending(cf: *mut ngx_conf_t) -> *mut c_char {
    // SAFETY: `cf` is live; the cycle's configuration was created before its blocks are parsed.
    unsafe {
        let Some(conf) = core_conf((*cf).cycle) else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        let pending = std::mem::take(&mut conf.pending);
        if pending.is_empty() {
            return CONF_OK;
        }
        let engine = match engine() {
            Ok(e) => e,
            Err(e) => {
                return conf_error(cf, &format!("tollgate: cannot create the wasm engine: {e}"))
            }
        };
        // `tollgate_compiled_cache` (even `off`) before Kong's `cache_config`.
        let cache = match conf.compiled_cache.clone() {
            Some(c) => c,
            None => conf.kong_cache_config.clone(),
        };
        let wasms: Vec<&[u8]> = pending.iter().map(|p| p.wasm.as_slice()).collect();
        let compiled = engine.compile_all(&wasms, cache.as_ref());
        for (p, result) in pending.into_iter().zip(compiled) {
            let (module, note) = match result {
                Ok(m) => m,
                Err(e) => {
                    return conf_error(
                        cf,
                        &format!(
                            "tollgate: module \"{}\": cannot load \"{}\": {}",
                            p.name,
                            p.path.display(),
                            e.0
                        ),
                    )
                }
            };
            if let Some(note) = note {
                let level = if note.warning {
                    crate::util::level::WARN
                } else {
                    crate::util::level::NOTICE
                };
                let line = format!("tollgate: module \"{}\": {}", p.name, note.message);
                crate::util::conf_log(level, cf, &line);
            }
            conf.modules.push(ModuleDef {
                name: p.name,
                path: p.path,
                vm_config: p.vm_config,
                module,
            });
        }
        CONF_OK
    }
}
