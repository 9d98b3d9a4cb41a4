//! Resuming paused requests: a request a `Vm` resumed (or gave a local response from another
//! context's callback) is posted an event that runs nginx's phases again, and the requests whose
//! module instance was replaced are refused and resumed into that refusal.

use ngx::ffi::ngx_event_t;

use super::context::{from_handle, Phase, RequestCtx, VmRef};
use crate::worker::RequestHandle;
/// The worker replaced module `module`'s instance: the filters of that module with an HTTP
/// context on each request in `in_flight` cannot run any more, so the request is refused (fail
/// closed, also where its response would skip the chain); those paused waiting for it are
/// resumed into that refusal instead of waiting for ever. (The worker's hook, see
/// `Worker::orphaned`.)
pub fn orphaned(module: usize, in_flight: &[RequestHandle]) {
    let mut resumed = Vec::new();
    for &h in in_flight {
        // SAFETY: the worker's list holds live contexts only.
        let Some(ctx) = (unsafe { from_handle(h) }) else {
            continue;
        };
        let mut lost = false;
        for s in &mut ctx.slots {
            if s.http.is_some() && matches!(s.vm, VmRef::Shared { module: m, .. } if m == module) {
                s.failed = true;
                lost = true;
            }
        }
        if lost {
            resumed.push(h);
        }
    }
    resume_all(resumed);
}

/// Posts the resume events of `reqs` (requests resumed by a `Vm`, or given a local response
/// from a callback outside their own, such as `on_http_call_response`). A request that is not
/// paused is left alone.
pub fn resume_all(reqs: Vec<RequestHandle>) {
    for h in reqs {
        // SAFETY: pointers come from the worker's live map, whose entries are removed before
        // their request is freed; no nginx code ran since they were looked up.
        unsafe {
            let Some(ctx) = from_handle(h) else { continue };
            ctx.phase = match ctx.phase {
                Phase::Paused(next) => Phase::Headers(next),
                Phase::BodyPaused(next) => Phase::Body(next),
                _ => continue,
            };
            if ctx.resume_ev.posted() == 0 {
                nginx_sys::ngx_post_event(
                    &mut ctx.resume_ev,
                    &raw mut nginx_sys::ngx_posted_events,
                );
            }
        }
    }
}

pub(super) unsafe extern "C" fn resume_handler(ev: *mut ngx_event_t) {
    // SAFETY: `data` is the RequestCtx owning this event; its request is live (the cleanup
    // deletes the posted event before freeing it).
    unsafe {
        let ctx = (*ev).data.cast::<RequestCtx>();
        let Some(ctx) = ctx.as_mut() else { return };
        let r = ctx.r;
        let c = (*r).connection;
        nginx_sys::ngx_http_core_run_phases(r);
        nginx_sys::ngx_http_run_posted_requests(c);
    }
}
