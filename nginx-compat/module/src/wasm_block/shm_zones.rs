//! The nginx shared memory zones this module owns (`shm_kv`, `shm_queue`, the metrics zone):
//! their size with nginx's slab pool, adding one while the configuration is parsed, and, in its
//! `init`, the region allocated from it (or found again on reload) with a service attached.

use std::ffi::c_void;

use ngx::ffi::{ngx_conf_t, ngx_shared_memory_add, ngx_shm_zone_t};

use super::core_conf::ngx_tollgate_wasm_core_module;
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
