//! What the `wasm {}` directives build: [`CoreConf`], the configuration of a cycle (its modules,
//! read then compiled, its `shm_kv` / `shm_queue` zones and the metrics zone, the guests'
//! limits), and [`core_conf`], the way to it from a cycle. Every other file of the block builds
//! on this one.

use std::path::PathBuf;

use ngx::ffi::{ngx_cycle_t, ngx_module_t, ngx_shm_zone_t, ngx_uint_t};

extern "C" {
    /// The core module (`wasm_block/mod.rs` defines it: its handlers are every other file's),
    /// declared here as a C module's header declares it (as `base.rs` does the HTTP module).
    pub static mut ngx_tollgate_wasm_core_module: ngx_module_t;
}
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
    /// The directory of Kong's `wasmtime { cache_config FILE; }`
    /// (`kong_directives/cache_config.rs`), used when `tollgate_compiled_cache` is not given.
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
