//! The metrics zone and `tollgate_metrics;`, the Prometheus text endpoint.
//!
//! Filters' metrics (`proxy_define_metric` & co.) live in one nginx shared memory zone, one
//! slice of values per worker (no lock on updates), summed when scraped
//! (`tollgate-services`' `MetricsZone`). The exposition has the names and labels Envoy's
//! `/stats/prometheus` shows with `envoy/metrics.yaml` (the `.label.value` segments of the
//! names become labels). `?format=envoy` gives Envoy's `/stats` text instead
//! (`wasmcustom.<name as defined>: value`), which the end-to-end tests read.

use std::ffi::c_void;

use ngx::ffi::{ngx_conf_t, ngx_core_conf_t, ngx_http_request_t, ngx_int_t, ngx_shm_zone_t};
use tollgate_services::metrics_zone::{MetricsConfig, MetricsLayout, MetricsZone};

use crate::base::rc;
use crate::metrics_text;
use crate::util::{bytes, level, log};
use crate::wasm_block::core_conf::{core_conf, MetricsDef};
use crate::wasm_block::shm_zones::{add_zone, attach_zone, slab_size, zone_region};

/// Most metrics (definitions) and value slots per worker.
const MAX_METRICS: u32 = 4096;
const SLOTS_PER_WORKER: u32 = 16384;

/// Adds the metrics zone, sized for `worker_processes` (read when http{} ends: declare
/// `worker_processes` before http{}; otherwise room is made for 64 workers).
///
/// # Safety
/// `cf` must be live (http postconfiguration).
pub unsafe fn configure(cf: *mut ngx_conf_t) -> Result<(), String> {
    // SAFETY: reading configurations created by nginx; adding a zone during configuration.
    unsafe {
        let cycle = (*cf).cycle;
        let Some(core) = core_conf(cycle) else {
            return Ok(());
        };
        if core.modules.is_empty() || core.metrics.is_some() {
            return Ok(());
        }
        let ccf =
            (*(*cycle).conf_ctx.add(nginx_sys::ngx_core_module.index)).cast::<ngx_core_conf_t>();
        let workers = if ccf.is_null() {
            -1
        } else {
            (*ccf).worker_processes
        };
        let workers = u32::try_from(workers).ok().filter(|w| *w > 0).unwrap_or(64);
        let layout = MetricsLayout::new(MAX_METRICS, workers, SLOTS_PER_WORKER)
            .map_err(|e| format!("tollgate: metrics zone: {e}"))?;
        let bytes = layout.bytes().ok_or("tollgate: metrics zone too large")?;
        let zone = add_zone(
            cf,
            &format!("tollgate_metrics:{workers}"),
            slab_size(bytes),
            metrics_zone_init,
        )?;
        let mut def = Box::new(MetricsDef {
            layout,
            zone,
            metrics: None,
        });
        (*zone).data = (&raw mut *def).cast();
        core.metrics = Some(def);
        add_zone(
            cf,
            "tollgate_workers",
            slab_size(WORKER_SLOTS * 64),
            workers_zone_init,
        )?;
        // The default shm_kv zone `*` (4 MiB) when none was declared: the filters' shared data.
        if !core.kv_zones.iter().any(|z| z.name == "*") {
            crate::wasm_block::zone_directives::add_kv_zone(
                cf,
                core,
                "*",
                4 << 20,
                tollgate_services::kv::EvictionPolicy::Lru,
            )?;
        }
        Ok(())
    }
}

/// Per-worker request counters (one cache line each), for Envoy-like
/// `listener.*.worker_N.downstream_cx_total` lines in `?format=envoy`.
const WORKER_SLOTS: usize = 64;
static WORKER_COUNTS: std::sync::atomic::AtomicPtr<u8> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn workers_zone_init(zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: the region is allocated from the zone's slab pool (see zone_region) and stays
    // mapped in every worker.
    unsafe {
        match zone_region(zone, data, WORKER_SLOTS * 64) {
            Ok((region, init)) => {
                let _ = (region, init);
                let sp = (*zone).shm.addr.cast::<ngx::ffi::ngx_slab_pool_t>();
                WORKER_COUNTS.store((*sp).data.cast(), std::sync::atomic::Ordering::Release);
                (*zone).data = (*sp).data;
                0
            }
            Err(e) => {
                log(level::EMERG, crate::util::cycle_log(), &e);
                -1
            }
        }
    }
}

fn worker_counter(i: usize) -> Option<&'static std::sync::atomic::AtomicU64> {
    let base = WORKER_COUNTS.load(std::sync::atomic::Ordering::Acquire);
    if base.is_null() || i >= WORKER_SLOTS {
        return None;
    }
    // SAFETY: slot `i` is a 64-byte aligned u64 inside the shared region (64 slots of 64 bytes,
    // page-aligned base); only accessed atomically.
    unsafe {
        Some(
            &*base
                .add(i.saturating_mul(64))
                .cast::<std::sync::atomic::AtomicU64>(),
        )
    }
}

/// Counts a request served by this worker.
pub fn count_request() {
    // SAFETY: ngx_worker is this worker's index.
    let i = unsafe { nginx_sys::ngx_worker };
    if let Some(c) = worker_counter(i) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

unsafe extern "C" fn metrics_zone_init(zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: `zone->data` is our boxed MetricsDef (set in configure).
    unsafe {
        let Some(def) = (*zone).data.cast::<MetricsDef>().as_mut() else {
            return -1;
        };
        let want = def.layout.bytes().unwrap_or(0);
        attach_zone(zone, data, want, &mut def.metrics, |region, init| {
            MetricsZone::attach(region, &def.layout, init, 0, MetricsConfig::default())
                .map_err(|e| format!("tollgate: metrics zone: {e}"))
        })
    }
}

/// The metrics zone of this worker (its own slice), if any.
pub(crate) fn worker_zone(cycle: *mut ngx::ffi::ngx_cycle_t) -> Option<MetricsZone> {
    // SAFETY: the cycle's configuration is complete in a worker; ngx_worker is its index.
    unsafe {
        let core = core_conf(cycle)?;
        let m = core.metrics.as_ref()?.metrics.as_ref()?;
        let w = u32::try_from(nginx_sys::ngx_worker).ok()?;
        match m.for_worker(w) {
            Ok(z) => Some(z),
            Err(e) => {
                log(
                    level::ERR,
                    (*cycle).log,
                    &format!("tollgate: metrics: {e} (declare worker_processes before http{{}})"),
                );
                None
            }
        }
    }
}

/// (index, requests) of each worker slot.
fn worker_requests() -> Vec<(usize, u64)> {
    (0..WORKER_SLOTS)
        .filter_map(|i| {
            worker_counter(i).map(|c| (i, c.load(std::sync::atomic::Ordering::Relaxed)))
        })
        .collect()
}

/// Content handler of a `tollgate_metrics` location: Prometheus text, or Envoy's `/stats`
/// text when the location's URI ends with `/stats` or with `?format=envoy` (`filter=REGEX`
/// keeps the matching names, like Envoy's).
pub unsafe extern "C" fn handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: a content handler with a live request.
    unsafe {
        let zone = core_conf(nginx_sys::ngx_cycle)
            .and_then(|c| c.metrics.as_ref())
            .and_then(|m| m.metrics.clone());
        let query = metrics_text::query(bytes(&(*r).uri), bytes(&(*r).args));
        let (status, body) = match (zone, query.filter) {
            (_, Some(Err(e))) => (400, format!("bad filter: {e}\n")),
            (Some(z), filter) if query.envoy => (
                200,
                metrics_text::envoy_stats(
                    &worker_requests(),
                    z.overflow(),
                    &z.snapshot().unwrap_or_default(),
                    filter.and_then(Result::ok).as_ref(),
                ),
            ),
            (zone, _) => match zone {
                Some(z) => match z.render() {
                    Ok(text) => (200, text + &metrics_text::overflow_exposition(z.overflow())),
                    Err(e) => (500, format!("metrics: {e}\n")),
                },
                None => (200, String::new()),
            },
        };
        let _ = nginx_sys::ngx_http_discard_request_body(r);
        let body = body.into_bytes();
        let map = vec![
            (b":status".to_vec(), status.to_string().into_bytes()),
            (
                b"content-type".to_vec(),
                b"text/plain; version=0.0.4".to_vec(),
            ),
            (
                b"content-length".to_vec(),
                body.len().to_string().into_bytes(),
            ),
        ];
        if crate::headers::apply_response_map(r, &map).is_err() {
            return rc::HTTP_INTERNAL_SERVER_ERROR;
        }
        let code = nginx_sys::ngx_http_send_header(r);
        if code == rc::ERROR || code > rc::OK || (*r).header_only() != 0 {
            return code;
        }
        match crate::body::memory_chain(r, &body, true, false) {
            Some(cl) => nginx_sys::ngx_http_output_filter(r, cl),
            None => rc::ERROR,
        }
    }
}
