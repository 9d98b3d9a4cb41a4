//! Where a request's context lives: created in the request's pool (owned by a pool cleanup,
//! pointed at by `r->ctx`), found again after an internal redirect cleared `r->ctx`, and freed
//! by that cleanup, which finishes the filters when the log phase did not run.

use std::cell::RefCell;
use std::ffi::c_void;

use ngx::ffi::{ngx_http_request_t, ngx_pool_cleanup_add, ngx_pool_cleanup_t};
use smallvec::SmallVec;
use tollgate_host::Stream;

use super::context::{Phase, RequestCtx};
use super::resume::resume_handler;
use crate::base::ctx_slot;
use crate::props::NgxProps;

/// Whether pool cleanup `c` owns the context of the request `r`: ours are recognised by
/// their handler (nginx modules find their own cleanups so), then by their request (a
/// subrequest shares its parent's pool and has a context of its own).
///
/// # Safety
/// `c` must be a live cleanup of a live pool.
unsafe fn owns_ctx_of(c: *const ngx_pool_cleanup_t, r: *mut ngx_http_request_t) -> bool {
    // SAFETY: a live cleanup; one with our handler holds a live context (`ctx_cleanup` unsets
    // the handler when it runs).
    unsafe {
        let ours = (*c)
            .handler
            .is_some_and(|h| std::ptr::fn_addr_eq(h, ctx_cleanup as unsafe extern "C" fn(_)));
        ours && !(*c).data.is_null() && (*(*c).data.cast::<RequestCtx>()).r == r
    }
}

unsafe extern "C" fn ctx_cleanup(data: *mut c_void) {
    let p = data.cast::<RequestCtx>();
    if p.is_null() {
        return;
    }
    // SAFETY: `data` is the Box created in `RequestCtx::create`, released exactly once here.
    unsafe {
        let mut ctx = Box::from_raw(p);
        // Never found again through this cleanup (`owns_ctx_of`): its allocation goes back to
        // the spares, for another request. nginx reads a cleanup's handler before calling it.
        if let Some(cln) = ctx.cleanup.as_mut() {
            cln.handler = None;
            cln.data = std::ptr::null_mut();
        }
        if !ctx.finished {
            crate::worker::with_worker(|w| ctx.finish(w));
        } else {
            crate::worker::with_worker(|w| ctx.unregister(w));
        }
        if ctx.resume_ev.posted() != 0 {
            nginx_sys::ngx_delete_posted_event(&mut ctx.resume_ev);
        }
        super::spares::keep_context(ctx);
    }
}

/// The request's context, also after an internal redirect cleared `r->ctx` (found through
/// the pool cleanup that owns it; a subrequest, which shares its parent's pool, has its own).
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn get_ctx<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut RequestCtx> {
    // SAFETY: r->ctx is indexed by ctx_index; the cleanup list is the pool's.
    unsafe {
        let slot = ctx_slot(r);
        if !(*slot).is_null() {
            return (*slot).cast::<RequestCtx>().as_mut();
        }
        let mut c: *mut ngx_pool_cleanup_t = (*(*r).pool).cleanup;
        while !c.is_null() {
            if owns_ctx_of(c, r) {
                *slot = (*c).data;
                return (*c).data.cast::<RequestCtx>().as_mut();
            }
            c = (*c).next;
        }
        None
    }
}

impl RequestCtx {
    /// Creates the context of `r` (owned by a pool cleanup) and stores it in `r->ctx`; its
    /// slots are added by [`RequestCtx::enter_chain`].
    ///
    /// # Safety
    /// `r` must be a live request.
    pub unsafe fn create<'a>(r: *mut ngx_http_request_t) -> Option<&'a mut RequestCtx> {
        let ctx = super::spares::context(|buffers| RequestCtx {
            r,
            cleanup: std::ptr::null_mut(),
            chain: std::ptr::null(),
            slots: SmallVec::new(),
            own_vms: Vec::new(),
            stream: Stream {
                // nginx 1.22 discards the trailer section of chunked request bodies and HTTP/2
                // request trailers.
                request_trailers_unavailable: true,
                properties: buffers.properties,
                request_body: buffers.request_body,
                response_body: buffers.response_body,
                ..Stream::default()
            },
            spare_edits: (buffers.request_edits, buffers.response_edits),
            phase: Phase::Fresh,
            started: 0,
            body_done: 0,
            body_read: false,
            body_loaded: false,
            finished: false,
            in_flight_at: None,
            response_failed: None,
            refused: false,
            resp_buffering: false,
            resp_eos: false,
            resp_body_left: None,
            wants_request_body: false,
            wants_response_body: false,
            wants_response_headers: false,
            // SAFETY: a zeroed event is nginx's initial state.
            resume_ev: unsafe { std::mem::zeroed() },
            local_details: RefCell::new(None),
        });
        // SAFETY: the cleanup owns the Box; it runs when the request pool is destroyed.
        unsafe {
            let cln = ngx_pool_cleanup_add((*r).pool, 0);
            if cln.is_null() {
                return None;
            }
            let p = Box::into_raw(ctx);
            // The Box's contents do not move: the source may point at the context's field.
            (*p).stream.property_source = Some(super::spares::props(NgxProps {
                r,
                local_details: &raw const (*p).local_details,
            }));
            (*cln).handler = Some(ctx_cleanup);
            (*cln).data = p.cast();
            (*p).cleanup = cln;
            // Posted events never read `data` in nginx's debug logging (only timers do).
            (*p).resume_ev.handler = Some(resume_handler);
            (*p).resume_ev.data = p.cast();
            (*p).resume_ev.log = (*(*r).connection).log;
            *ctx_slot(r) = p.cast();
            p.as_mut()
        }
    }
}
