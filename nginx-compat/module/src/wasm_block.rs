//! The `wasm {}` block: a core module (`NGX_CORE_MODULE`), like ngx_wasm_module's.
//!
//! `wasm {}` is a block directive whose handler switches `cf->cmd_type` to
//! [`TOLLGATE_WASM_CONF`] and runs `ngx_conf_parse` on the block, so only the directives below
//! (and `include`) are accepted inside. They are `NGX_DIRECT_CONF`: their `conf` argument is this
//! module's [`CoreConf`], created per cycle in the cycle pool (and dropped with it on reload).
//!
//! - `module NAME PATH [CONFIG];` reads `PATH`; the block's modules are compiled together when
//!   the block ends, in the master, side by side on threads joined before the block's handler
//!   returns (`Engine::compile_all`; a bad `.wasm` fails `nginx -t`, the message naming the
//!   module and its path). `CONFIG` is the VM configuration (`on_vm_start`).
//!   `tollgate_module_file NAME PATH FILE;` reads it from `FILE` (`crate::conf_file`).
//! - `tollgate_compiled_cache DIR|off;` keeps the compiled code in `DIR` (default off): a start
//!   or reload whose modules did not change loads it instead of compiling
//!   (`tollgate_host::CompiledCache`, which says what it trusts). Kong's
//!   `wasmtime { cache_config FILE; }` names the directory the same way (`kong_directives.rs`).
//! - `shm_kv NAME|* SIZE [eviction=lru|slru|none];` declares a shared key/value zone
//!   (`proxy_get/set_shared_data`; a key `NAME/rest` goes to the zone `NAME`, others to `*`).
//! - `shm_queue NAME SIZE;` declares a shared queue zone: the queue `NAME` of
//!   `proxy_register_shared_queue` / `proxy_resolve_shared_queue` (a filter cannot register a
//!   queue that was not declared, as in ngx_wasm_module). Its id is its position among the
//!   `shm_queue` directives, from 1, the same in every worker.
//! - `compiler`, `backtraces` (below); ngx_wasm_module's other `wasm{}` directives and blocks
//!   are those of a second core module (`kong_directives.rs`).

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::rc::Rc;

use ngx::ffi::{
    ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_core_module_t, ngx_cycle_t, ngx_module_t,
    ngx_parse_size, ngx_shared_memory_add, ngx_shm_zone_t, ngx_str_t, ngx_uint_t, NGX_CONF_BLOCK,
    NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_CONF_TAKE2, NGX_CONF_TAKE23,
    NGX_CONF_TAKE3, NGX_CORE_MODULE, NGX_DIRECT_CONF, NGX_MAIN_CONF,
};
use ngx::ngx_string;

use crate::util::{bytes, conf_args, conf_error, full_path, lossy, CONF_OK};

/// The `cmd_type` of the directives inside `wasm {}` (the value other blocks' own directives
/// use, `NGX_HTTP_MAIN_CONF`/`NGX_EVENT_CONF`; no core module uses it for its directives).
pub const TOLLGATE_WASM_CONF: ngx_uint_t = 0x0200_0000;

/// A `module` of the `wasm {}` block, read, compiled when the block ends.
pub struct PendingModule {
    pub name: String,
    pub path: PathBuf,
    pub vm_config: Vec<u8>,
    /// The `.wasm` file's contents.
    pub wasm: Vec<u8>,
}

/// A `module` of the `wasm {}` block, compiled.
pub struct ModuleDef {
    /// The name `proxy_wasm` refers to (also the plugin name and the VM id).
    pub name: String,
    /// Absolute path of the `.wasm` file.
    pub path: PathBuf,
    /// The optional third argument, passed to `proxy_on_vm_start`.
    pub vm_config: Vec<u8>,
    /// The compiled module (instantiated per worker).
    pub module: tollgate_host::Module,
}

/// An `shm_kv` zone.
pub struct KvZoneDef {
    /// The zone name (`*` is the default zone).
    pub name: String,
    /// Size in bytes (of the key/value region; the nginx zone is a little larger).
    pub size: usize,
    /// Eviction policy (`eviction=` as declared; `slru` evicts as `lru`).
    pub policy: tollgate_services::kv::EvictionPolicy,
    /// The nginx shared memory zone (mapped before the workers fork).
    pub zone: *mut ngx_shm_zone_t,
    /// The attached zone (set by the zone's `init`, in the master).
    pub kv: Option<tollgate_services::kv::KvZone>,
}

/// An `shm_queue` zone.
pub struct QueueZoneDef {
    /// The queue name.
    pub name: String,
    /// Size in bytes (of the queue's region: header and data ring).
    pub size: usize,
    /// The nginx shared memory zone (mapped before the workers fork).
    pub zone: *mut ngx_shm_zone_t,
    /// The attached queue (set by the zone's `init`, in the master).
    pub queue: Option<tollgate_services::queue::QueueZone>,
}

/// The metrics zone (per-worker slices summed when scraped).
pub struct MetricsDef {
    /// Its layout (workers and capacity).
    pub layout: tollgate_services::metrics_zone::MetricsLayout,
    /// The nginx shared memory zone.
    pub zone: *mut ngx_shm_zone_t,
    /// The attached zone (set by the zone's `init`, in the master).
    pub metrics: Option<tollgate_services::metrics_zone::MetricsZone>,
}

/// The `wasm {}` configuration of a cycle.
#[derive(Default)]
pub struct CoreConf {
    /// Modules in declaration order.
    pub modules: Vec<ModuleDef>,
    /// Modules read and not compiled yet (until the end of the `wasm {}` block).
    pub pending: Vec<PendingModule>,
    /// `tollgate_compiled_cache` (`Some(None)`: `off`).
    pub compiled_cache: Option<Option<tollgate_host::CompiledCache>>,
    /// The directory of Kong's `wasmtime { cache_config FILE; }` (`kong_directives.rs`), used
    /// when `tollgate_compiled_cache` is not given.
    pub kong_cache_config: Option<tollgate_host::CompiledCache>,
    /// `shm_kv` zones in declaration order (boxed: their zones point to them).
    pub kv_zones: Vec<Box<KvZoneDef>>,
    /// `shm_queue` zones in declaration order (boxed: their zones point to them); queue id
    /// `i + 1` is `queue_zones[i]`.
    pub queue_zones: Vec<Box<QueueZoneDef>>,
    /// The metrics zone, added by the http module's configuration.
    pub metrics: Option<Box<MetricsDef>>,
    /// Bounds on every call into a guest and on its memory (`tollgate_guest_deadline`,
    /// `tollgate_guest_memory`).
    pub limits: tollgate_host::GuestLimits,
    /// Which of those directives were given (a second one is refused).
    pub limits_set: (bool, bool),
}

impl CoreConf {
    /// The `shm_kv` zones' eviction policies, for the property
    /// `tollgate.shared_data.eviction.<KEY>` (the implicit `*` zone is among them once the http
    /// module's configuration added it).
    pub fn zone_evictions(&self) -> crate::zone_props::ZoneEvictions {
        crate::zone_props::ZoneEvictions::new(
            self.kv_zones.iter().map(|z| (z.name.clone(), z.policy)),
        )
    }

    /// The module named `name`.
    pub fn module(&self, name: &str) -> Option<(usize, &ModuleDef)> {
        self.modules
            .iter()
            .enumerate()
            .find(|(_, m)| m.name == name)
    }
}

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

/// This module's configuration in `cycle` (`None` before it is created).
///
/// # Safety
/// `cycle` must be a live cycle whose configuration has been created.
pub unsafe fn core_conf<'a>(cycle: *mut ngx_cycle_t) -> Option<&'a mut CoreConf> {
    // SAFETY: conf_ctx is indexed by module index; our slot holds a CoreConf from create_conf.
    unsafe {
        let idx = ngx_tollgate_wasm_core_module.index;
        let ctx = (*cycle).conf_ctx;
        if ctx.is_null() || idx == ngx_uint_t::MAX {
            return None;
        }
        let conf = (*ctx.add(idx)).cast::<CoreConf>();
        conf.as_mut()
    }
}

unsafe extern "C" fn create_conf(cycle: *mut ngx_cycle_t) -> *mut c_void {
    // SAFETY: the cycle pool lives as long as the cycle; `allocate` registers a cleanup that
    // drops the value (and the compiled modules) when the cycle's pool is destroyed.
    unsafe {
        let pool = ngx::core::Pool::from_ngx_pool((*cycle).pool);
        pool.allocate(CoreConf::default()).cast()
    }
}

unsafe extern "C" fn init_conf(_cycle: *mut ngx_cycle_t, _conf: *mut c_void) -> *mut c_char {
    CONF_OK
}

unsafe extern "C" fn wasm_block(
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

unsafe extern "C" fn module_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_module(cf, conf, false) }
}

unsafe extern "C" fn module_file_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_module(cf, conf, true) }
}

/// `module NAME PATH [CONFIG];`, or with `from_file`, `tollgate_module_file NAME PATH FILE;`.
unsafe fn add_module(cf: *mut ngx_conf_t, conf: *mut c_void, from_file: bool) -> *mut c_char {
    // SAFETY: `conf` is our CoreConf (NGX_DIRECT_CONF); `cf` is live during the handler.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        let args = conf_args(cf);
        let (Some(name), Some(path)) = (args.get(1), args.get(2)) else {
            return conf_error(cf, "tollgate: module NAME PATH [CONFIG];");
        };
        let name_s = lossy(name);
        if name_s.is_empty() || path.len == 0 {
            return conf_error(cf, "tollgate: invalid module name or path");
        }
        if conf.module(&name_s).is_some() || conf.pending.iter().any(|p| p.name == name_s) {
            return conf_error(
                cf,
                &format!("tollgate: \"{name_s}\" module already defined"),
            );
        }
        // Relative paths are relative to the prefix (-p), like ngx_wasm_module's.
        let Some(path_buf) = full_path(cf, path) else {
            return conf_error(cf, "tollgate: cannot resolve the module path");
        };
        let wasm = match std::fs::read(&path_buf) {
            Ok(w) => w,
            Err(e) => {
                return conf_error(
                    cf,
                    &format!(
                        "tollgate: module \"{name_s}\": cannot load \"{}\": cannot read it: {e}",
                        path_buf.display()
                    ),
                )
            }
        };
        let vm_config = match (from_file, args.get(3)) {
            (false, arg) => arg.map(|c| bytes(c).to_vec()).unwrap_or_default(),
            (true, Some(arg)) => match crate::conf_file::read(cf, arg) {
                Ok((_, contents)) => contents,
                Err(e) => {
                    return conf_error(cf, &format!("tollgate: tollgate_module_file {name_s}: {e}"))
                }
            },
            (true, None) => {
                return conf_error(cf, "tollgate: tollgate_module_file NAME PATH FILE;")
            }
        };
        conf.pending.push(PendingModule {
            name: name_s,
            path: path_buf,
            vm_config,
            wasm,
        });
        CONF_OK
    }
}

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
unsafe extern "C" fn guest_deadline_directive(
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
unsafe extern "C" fn guest_memory_directive(
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

unsafe extern "C" fn shm_kv_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as in module_directive; ngx_shared_memory_add registers the zone in the cycle.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        let args = conf_args(cf);
        let (Some(name), Some(size)) = (args.get(1), args.get(2)) else {
            return conf_error(cf, "tollgate: shm_kv NAME|* SIZE [eviction=lru|slru|none];");
        };
        let declared = |n: &str| conf.kv_zones.iter().any(|z| z.name == n);
        let (name_s, size_bytes) =
            match zone_name_size("shm_kv", name, size, declared, MIN_SHM_KV_BYTES, "12k") {
                Ok(v) => v,
                Err(e) => return conf_error(cf, &e),
            };
        let opt = args.get(3).map(lossy);
        let policy = match tollgate_services::kv::EvictionPolicy::from_directive(opt.as_deref()) {
            Ok(p) => p,
            Err(e) => return conf_error(cf, &format!("tollgate: shm_kv \"{name_s}\": {e}")),
        };
        if let Err(e) = add_kv_zone(cf, conf, &name_s, size_bytes, policy) {
            return conf_error(cf, &e);
        }
        CONF_OK
    }
}

/// The smallest `shm_kv` zone: ngx_wasm_module's minimum for every shm zone, `3 * pagesize`
/// (`NGX_WA_SHM_MIN_SIZE` in its source: 12 KiB with 4 KiB pages; its DIRECTIVES.md says
/// `15k`, its code checks 12k). This host's layout needs only
/// [`tollgate_services::kv::MIN_ZONE_BYTES`].
pub const MIN_SHM_KV_BYTES: usize = 12 * 1024;

/// `NAME SIZE` of a `directive` (`shm_kv`, `shm_queue`): a name that is not empty, has no
/// `/` and is not `declared` yet, and a size in bytes (nginx's size syntax: `64k`, `1m`) of at
/// least `min` (`min_text` in the message). The error names the directive and the argument.
///
/// # Safety
/// `size` must be an argument of the directive being parsed (nginx's parser memory).
unsafe fn zone_name_size(
    directive: &str,
    name: &ngx_str_t,
    size: &ngx_str_t,
    declared: impl Fn(&str) -> bool,
    min: usize,
    min_text: &str,
) -> Result<(String, usize), String> {
    let name = lossy(name);
    if name.is_empty() || name.contains('/') {
        return Err(format!("tollgate: invalid {directive} name \"{name}\""));
    }
    if declared(&name) {
        return Err(format!("tollgate: {directive} \"{name}\" already defined"));
    }
    let mut size_str = *size;
    // SAFETY: ngx_parse_size only reads the string (a copy of the argument's descriptor).
    let parsed = unsafe { ngx_parse_size(&mut size_str) };
    let Ok(bytes) = usize::try_from(parsed) else {
        return Err(format!(
            "tollgate: invalid {directive} size \"{}\"",
            lossy(size)
        ));
    };
    if bytes < min {
        return Err(format!(
            "tollgate: {directive} \"{name}\" is too small (at least {min_text})"
        ));
    }
    Ok((name, bytes))
}

unsafe extern "C" fn shm_queue_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as in shm_kv_directive.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        let args = conf_args(cf);
        let (Some(name), Some(size)) = (args.get(1), args.get(2)) else {
            return conf_error(cf, "tollgate: shm_queue NAME SIZE;");
        };
        let declared = |n: &str| conf.queue_zones.iter().any(|z| z.name == n);
        let min = tollgate_services::queue::MIN_QUEUE_BYTES;
        let (name_s, size_bytes) = match zone_name_size(
            "shm_queue",
            name,
            size,
            declared,
            min,
            &format!("{min} bytes"),
        ) {
            Ok(v) => v,
            Err(e) => return conf_error(cf, &e),
        };
        let mut def = Box::new(QueueZoneDef {
            name: name_s.clone(),
            size: size_bytes,
            zone: std::ptr::null_mut(),
            queue: None,
        });
        // SAFETY: the zone keeps a pointer to the boxed definition, which lives in the cycle's
        // configuration as long as the zone is this cycle's.
        match add_zone(
            cf,
            &format!("tollgate_queue:{name_s}"),
            slab_size(size_bytes),
            queue_zone_init,
        ) {
            Ok(zone) => {
                (*zone).data = (&raw mut *def).cast();
                def.zone = zone;
            }
            Err(e) => return conf_error(cf, &e),
        }
        conf.queue_zones.push(def);
        CONF_OK
    }
}

unsafe extern "C" fn queue_zone_init(
    zone: *mut ngx_shm_zone_t,
    data: *mut c_void,
) -> ngx::ffi::ngx_int_t {
    // SAFETY: `zone->data` is our boxed QueueZoneDef (set in shm_queue_directive).
    unsafe {
        let Some(def) = (*zone).data.cast::<QueueZoneDef>().as_mut() else {
            return -1;
        };
        attach_zone(zone, data, def.size, &mut def.queue, |region, init| {
            tollgate_services::queue::QueueZone::attach(region, &def.name, init)
                .map_err(|e| format!("tollgate: shm_queue \"{}\": {e}", def.name))
        })
    }
}

/// Declares an `shm_kv` zone (also used for the implicit default `*` zone).
///
/// # Safety
/// `cf` must be live, during configuration parsing.
pub unsafe fn add_kv_zone(
    cf: *mut ngx_conf_t,
    conf: &mut CoreConf,
    name: &str,
    size: usize,
    policy: tollgate_services::kv::EvictionPolicy,
) -> Result<(), String> {
    let mut def = Box::new(KvZoneDef {
        name: name.to_owned(),
        size,
        policy,
        zone: std::ptr::null_mut(),
        kv: None,
    });
    // SAFETY: the zone keeps a pointer to the boxed definition, which lives in the cycle's
    // configuration as long as the zone is this cycle's.
    unsafe {
        let zone = add_zone(
            cf,
            &format!("tollgate_kv:{name}"),
            slab_size(size),
            kv_zone_init,
        )?;
        (*zone).data = (&raw mut *def).cast();
        def.zone = zone;
    }
    conf.kv_zones.push(def);
    Ok(())
}

/// The size of an nginx zone holding a `want`-byte region allocated from its slab pool (the
/// pool's header and page descriptors come first; nginx initialises them in every zone).
pub fn slab_size(want: usize) -> usize {
    want.saturating_add(want / 32).saturating_add(64 * 1024)
}

/// Adds a shared memory zone owned by this module (mapped by nginx before forking).
///
/// # Safety
/// `cf` must be live, during configuration parsing.
pub unsafe fn add_zone(
    cf: *mut ngx_conf_t,
    name: &str,
    size: usize,
    init: unsafe extern "C" fn(*mut ngx_shm_zone_t, *mut c_void) -> ngx::ffi::ngx_int_t,
) -> Result<*mut ngx_shm_zone_t, String> {
    // SAFETY: the name is copied into the configuration pool (nginx keeps the pointer).
    unsafe {
        let Some(mut zname) = crate::util::pool_str((*cf).pool, name.as_bytes()) else {
            return Err("tollgate: out of memory".into());
        };
        let tag = (&raw mut ngx_tollgate_wasm_core_module).cast::<c_void>();
        let zone = ngx_shared_memory_add(cf, &mut zname, size, tag);
        if zone.is_null() {
            return Err(format!(
                "tollgate: cannot add the shared memory zone \"{name}\""
            ));
        }
        if !(*zone).data.is_null() {
            return Err(format!(
                "tollgate: shared memory zone \"{name}\" is declared twice"
            ));
        }
        (*zone).init = Some(init);
        Ok(zone)
    }
}

/// The region of `want` bytes of a zone, allocated from its slab pool the first time (its
/// address kept in the pool's `data`), or found again when nginx reuses the zone on reload
/// (`data` non-null: the previous cycle's).
///
/// # Safety
/// `zone` must be the zone nginx is initialising, in the master.
pub unsafe fn zone_region(
    zone: *mut ngx_shm_zone_t,
    data: *mut c_void,
    want: usize,
) -> Result<
    (
        tollgate_services::SharedRegion,
        tollgate_services::zone::Init,
    ),
    String,
> {
    use tollgate_services::zone::Init;
    // SAFETY: nginx initialised an ngx_slab_pool_t at the start of every zone; the region is
    // allocated from it once and stays mapped for the zone's lifetime (shared by the workers).
    unsafe {
        let sp = (*zone).shm.addr.cast::<ngx::ffi::ngx_slab_pool_t>();
        let (ptr, init) = if !data.is_null() && !(*sp).data.is_null() {
            ((*sp).data.cast::<u8>(), Init::Existing)
        } else {
            let p = ngx::ffi::ngx_slab_alloc(sp, want);
            if p.is_null() {
                return Err("tollgate: cannot allocate from the shared memory zone".into());
            }
            (*sp).data = p;
            (p.cast::<u8>(), Init::Fresh)
        };
        let region = tollgate_services::SharedRegion::from_raw(ptr, want)
            .map_err(|e| format!("tollgate: {e}"))?;
        Ok((region, init))
    }
}

/// A zone `init`'s work after [`zone_region`]: `attach` the region (fresh, or the previous
/// cycle's on reload) into `slot`, and the `init` handler's return code: 0, or -1 with `slot`
/// empty after logging why at `emerg` (nginx then refuses the cycle).
///
/// # Safety
/// As [`zone_region`].
pub unsafe fn attach_zone<T>(
    zone: *mut ngx_shm_zone_t,
    data: *mut c_void,
    want: usize,
    slot: &mut Option<T>,
    attach: impl FnOnce(
        tollgate_services::SharedRegion,
        tollgate_services::zone::Init,
    ) -> Result<T, String>,
) -> ngx::ffi::ngx_int_t {
    // SAFETY: forwarded from the caller.
    let region = unsafe { zone_region(zone, data, want) };
    match region.and_then(|(region, init)| attach(region, init)) {
        Ok(z) => {
            *slot = Some(z);
            0
        }
        Err(e) => {
            *slot = None;
            crate::util::log(crate::util::level::EMERG, crate::util::cycle_log(), &e);
            -1
        }
    }
}

unsafe extern "C" fn kv_zone_init(
    zone: *mut ngx_shm_zone_t,
    data: *mut c_void,
) -> ngx::ffi::ngx_int_t {
    // SAFETY: `zone->data` is our boxed KvZoneDef (set in add_kv_zone).
    unsafe {
        let Some(def) = (*zone).data.cast::<KvZoneDef>().as_mut() else {
            return -1;
        };
        attach_zone(zone, data, def.size, &mut def.kv, |region, init| {
            tollgate_services::kv::KvZone::attach(region, &def.name, init, def.policy.eviction())
                .map_err(|e| format!("tollgate: shm_kv \"{}\": {e}", def.name))
        })
    }
}

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
unsafe extern "C" fn compiled_cache_directive(
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
unsafe extern "C" fn compiler_directive(
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
unsafe extern "C" fn backtraces_directive(
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

/// A directive entry (`ngx_command_t`) in a const context.
macro_rules! command {
    ($name:literal, $type:expr, $set:expr) => {
        ngx_command_t {
            name: ngx_string!($name),
            type_: $type as ngx_uint_t,
            set: Some($set),
            conf: 0,
            offset: 0,
            post: std::ptr::null_mut(),
        }
    };
}
pub(crate) use command;

/// The http{}, server{} and location{} levels: a directive allowed at each of them.
pub(crate) const ANY_LEVEL: u32 =
    ngx::ffi::NGX_HTTP_MAIN_CONF | ngx::ffi::NGX_HTTP_SRV_CONF | ngx::ffi::NGX_HTTP_LOC_CONF;
/// A directive entry's `conf` for the location configuration (merged from http{} and server{}).
pub(crate) const LOC_OFFSET: ngx_uint_t = nginx_sys::NGX_HTTP_LOC_CONF_OFFSET as ngx_uint_t;

/// A directive entry (`ngx_command_t`) on the location configuration, in a const context.
macro_rules! loc_command {
    ($name:literal, $type:expr, $set:expr) => {
        ngx_command_t {
            conf: $crate::wasm_block::LOC_OFFSET,
            ..$crate::wasm_block::command!($name, $type, $set)
        }
    };
}
pub(crate) use loc_command;

const IN_WASM: u32 = TOLLGATE_WASM_CONF as u32 | NGX_DIRECT_CONF;

/// The `wasm{}` directives of this file.
const WASM_BLOCK_COMMANDS: [ngx_command_t; 10] = [
    command!(
        "wasm",
        NGX_MAIN_CONF | NGX_DIRECT_CONF | NGX_CONF_BLOCK | NGX_CONF_NOARGS,
        wasm_block
    ),
    command!("module", IN_WASM | NGX_CONF_TAKE23, module_directive),
    command!(
        "tollgate_module_file",
        IN_WASM | NGX_CONF_TAKE3,
        module_file_directive
    ),
    command!(
        "shm_kv",
        IN_WASM | NGX_CONF_TAKE2 | NGX_CONF_TAKE3,
        shm_kv_directive
    ),
    command!("shm_queue", IN_WASM | NGX_CONF_TAKE2, shm_queue_directive),
    command!(
        "tollgate_guest_deadline",
        IN_WASM | NGX_CONF_TAKE12,
        guest_deadline_directive
    ),
    command!(
        "tollgate_guest_memory",
        IN_WASM | NGX_CONF_TAKE1,
        guest_memory_directive
    ),
    command!(
        "tollgate_compiled_cache",
        IN_WASM | NGX_CONF_TAKE1,
        compiled_cache_directive
    ),
    command!("compiler", IN_WASM | NGX_CONF_TAKE1, compiler_directive),
    command!("backtraces", IN_WASM | NGX_CONF_TAKE1, backtraces_directive),
];

/// `a` then `b` then nginx's terminating empty command, as one table (`N` = A + B + 1).
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)] // Evaluated at compile time: an index out of range or an overflow fails the build.
pub(crate) const fn command_table<const A: usize, const B: usize, const N: usize>(
    a: [ngx_command_t; A],
    b: [ngx_command_t; B],
) -> [ngx_command_t; N] {
    let mut out = [ngx_command_t::empty(); N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < B {
        out[A + j] = b[j];
        j += 1;
    }
    out
}

static mut WASM_BLOCK_TABLE: [ngx_command_t; 11] = command_table(WASM_BLOCK_COMMANDS, []);

static mut CORE_CTX: ngx_core_module_t = ngx_core_module_t {
    name: ngx_string!("tollgate_wasm"),
    create_conf: Some(create_conf),
    init_conf: Some(init_conf),
};

/// The core module (`wasm {}`).
#[no_mangle]
pub static mut ngx_tollgate_wasm_core_module: ngx_module_t = ngx_module_t {
    ctx: (&raw mut CORE_CTX).cast(),
    commands: (&raw mut WASM_BLOCK_TABLE).cast(),
    type_: NGX_CORE_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};
