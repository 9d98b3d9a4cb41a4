//! `shm_kv NAME|* SIZE [eviction=...];` and `shm_queue NAME SIZE;`: the shared key/value and
//! queue zones declared in `wasm {}` (also the implicit `*` zone, [`add_kv_zone`]), each an
//! nginx shared memory zone (`shm_zones.rs`) attached to its service when nginx initialises it.

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_parse_size, ngx_shm_zone_t, ngx_str_t};

use super::core_conf::{CoreConf, KvZoneDef, QueueZoneDef};
use super::shm_zones::{add_zone, attach_zone, slab_size};
use crate::util::{conf_args, conf_error, lossy, CONF_OK};
pub(super) unsafe extern "C" fn shm_kv_directive(
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

pub(super) unsafe extern "C" fn shm_queue_directive(
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
