//! The per-request state of a `proxy_wasm` chain: [`RequestCtx`] (in `r->ctx`), its filters'
//! [`Slot`]s and where their HTTP contexts live ([`VmRef`]), the request side's progress
//! ([`Phase`]), and the way to a context from a worker's handle ([`from_handle`]).

use std::cell::RefCell;

use ngx::ffi::{ngx_event_t, ngx_http_request_t, ngx_pool_cleanup_t};
use smallvec::SmallVec;
use tollgate_host::{HeaderEdit, HttpId, Stream, Vm};

use crate::worker::{RequestHandle, Worker};
/// Filters of a chain kept in the request context without an allocation (the shipped chains
/// have 1-5).
pub const INLINE_SLOTS: usize = 6;

/// Where a filter's HTTP context lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmRef {
    /// The worker's `Vm` of `module` (isolation `none`), as of `generation`.
    Shared {
        /// Module index.
        module: usize,
        /// Generation when the context was created.
        generation: u32,
    },
    /// A `Vm` owned by this request (isolation `stream` or `filter`).
    Owned(usize),
    /// Not created yet.
    None,
}

/// One filter of the chain for this request.
#[derive(Debug)]
pub struct Slot {
    /// Filter index (worker's `filters`).
    pub filter: usize,
    /// Its `Vm`.
    pub vm: VmRef,
    /// Its HTTP context (`None`: not created yet, failed, or gone after `on_log`).
    pub http: Option<HttpId>,
    /// The filter cannot run on this request (its context could not be created, or it
    /// failed): the request is refused, never passed on without it.
    pub failed: bool,
    /// Its HTTP context is in the worker's live map (`Worker::live`): from the first of its
    /// callbacks that paused the request or dispatched a call, the only ways an answer, a
    /// resumption or an instance's replacement can later need to find this request.
    pub registered: bool,
}

/// Progress of the request side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Contexts not created yet.
    Fresh,
    /// Run `on_request_headers` from this filter on.
    Headers(usize),
    /// `on_request_headers` paused before this filter; waiting for a resume.
    Paused(usize),
    /// Reading the client body.
    ReadingBody,
    /// Body read: run `on_request_body` from this filter on.
    Body(usize),
    /// `on_request_body` paused before this filter; waiting for a resume.
    BodyPaused(usize),
    /// Request side done.
    Forward,
}

/// Per-request state (in `r->ctx`, freed by a pool cleanup).
pub struct RequestCtx {
    /// The request.
    pub r: *mut ngx_http_request_t,
    /// The pool cleanup that owns this context (set once it is added): unlinked when it runs,
    /// so that a finished context, whose allocation is kept for another request
    /// (`spares.rs`), is never found again by its cleanup (`context_lifetime::get_ctx`).
    pub cleanup: *mut ngx_pool_cleanup_t,
    /// The location chain (its address) whose filters this context has added: a different
    /// one after an internal redirect adds the new chain's filters.
    pub chain: *const Vec<usize>,
    /// The filters run on this request, in order (inline up to [`INLINE_SLOTS`]: no allocation
    /// for a chain of that length).
    pub slots: SmallVec<[Slot; INLINE_SLOTS]>,
    /// Instances owned by the request (isolation `stream`/`filter`).
    pub own_vms: Vec<Vm>,
    /// The stream shared by the filters.
    pub stream: Stream,
    /// Empty lists, kept from an earlier request (`spares.rs`), for the edits of the request
    /// and the response headers' deferred maps: taken when each map is made.
    pub spare_edits: (Vec<HeaderEdit>, Vec<HeaderEdit>),
    /// Request-side progress.
    pub phase: Phase,
    /// Filters whose `on_request_headers` ran.
    pub started: usize,
    /// Filters whose `on_request_body` ran.
    pub body_done: usize,
    /// The client body was read into memory for the filters.
    pub body_read: bool,
    /// `stream.request_body` holds the body for the `on_request_body` callbacks under way.
    pub body_loaded: bool,
    /// `on_log` ran.
    pub finished: bool,
    /// Where this request is in the worker's list of requests in flight
    /// (`Worker::in_flight`), from its first chain on until it is unregistered.
    pub in_flight_at: Option<usize>,
    /// A response-side callback failed: the response was replaced by a 500 (`Replaced`, in the
    /// header filter: that 500 goes out) or the rest of it is cut (`Cut`, in the body filter).
    pub response_failed: Option<ResponseFailure>,
    /// The request was refused (500) because a filter could not run: that error response goes
    /// out without the failed filters (the others still see it).
    pub refused: bool,
    /// The response body is being buffered (a filter paused on a chunk).
    pub resp_buffering: bool,
    /// The response's end of stream was seen.
    pub resp_eos: bool,
    /// Bytes of the main request's response body still to come by the Content-Length it had
    /// when its header filter ran, before the filters' callbacks (`None`: no length). The chunk
    /// that brings it to 0 ends the stream for the filters, as Envoy's codec ends it with the
    /// last data; nginx's own empty last buffer that follows is passed on without a callback.
    pub resp_body_left: Option<u64>,
    /// Some filter's module exports `proxy_on_request_body`: the client body is read into
    /// memory for it. Otherwise nginx streams the body to the upstream as without the chain.
    pub wants_request_body: bool,
    /// Some filter's module exports `proxy_on_response_body` or `proxy_on_response_trailers`:
    /// the body filter copies each chunk for them. Otherwise it passes chunks straight on.
    pub wants_response_body: bool,
    /// Some filter's module exports `proxy_on_response_headers`: the header filter runs the
    /// chain. Otherwise it only points the stream at the response (for `on_log`'s reads).
    pub wants_response_headers: bool,
    /// Event posted to resume a paused request.
    pub resume_ev: ngx_event_t,
    /// `response.code_details` of a local response (read by the stream's `NgxProps` through a
    /// pointer to this field: the context does not move while it lives).
    pub local_details: RefCell<Option<Vec<u8>>>,
}

/// What a response-side failure did to the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFailure {
    /// `on_response_headers` failed: a 500 replaced the response.
    Replaced,
    /// A body callback failed after the headers went out: the connection is closed.
    Cut,
}

impl RequestCtx {
    /// This context's handle for the worker's maps and lists ([`from_handle`] turns it back).
    pub fn handle(&mut self) -> RequestHandle {
        RequestHandle::new((self as *mut RequestCtx).cast())
    }

    /// The request's connection log (with its client and request in every line), or the
    /// worker's.
    pub(super) fn log(&self, w: &Worker) -> *mut ngx::ffi::ngx_log_t {
        // SAFETY: the request (and its connection) outlive its context.
        unsafe {
            let c = (*self.r).connection;
            if c.is_null() || (*c).log.is_null() {
                w.log
            } else {
                (*c).log
            }
        }
    }
}

/// The context behind a worker's handle ([`RequestCtx::handle`]).
///
/// # Safety
/// `h` must come from the worker's live map or its list of requests in flight (entries are
/// removed before their request is freed), and no other reference to that context may be live.
pub unsafe fn from_handle<'a>(h: RequestHandle) -> Option<&'a mut RequestCtx> {
    // SAFETY: as the caller guarantees; handles are made from `*mut RequestCtx` only.
    unsafe { h.as_ptr().cast::<RequestCtx>().as_mut() }
}
