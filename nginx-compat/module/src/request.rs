//! One request through a `proxy_wasm` chain.
//!
//! - rewrite (or access) phase: `on_request_headers` for each filter in order; a local response
//!   ends the chain and is sent by nginx; `Pause` parks the request until a `Vm` resumes it
//!   (`proxy_continue_stream` from `on_http_call_response`, `on_tick` or `on_queue_ready`; a
//!   posted event); then the client body (if any filter reads it) is read in memory and
//!   `on_request_body(end_of_stream)` runs (where a filter may pause too); header and body
//!   changes are written back.
//! - header filter: `on_response_headers`; body filter: `on_response_body` per chunk (a filter
//!   returning `Pause` on a chunk makes the body buffered until the end of the stream), then,
//!   with the last chunk, `on_response_trailers` when nginx has response trailers by then.
//!   Trailer changes go to `headers_out.trailers`. There are never request trailers (nginx
//!   discards them): writes to that map return `BadArgument`.
//! - log phase: `on_log`, `on_done`, `on_delete` (or at pool cleanup when the log phase did not
//!   run).
//!
//! Response callbacks run for the filters whose `on_request_headers` ran (as in Envoy, where a
//! local reply goes back through the filters it passed).
//!
//! Fail closed: a filter of the chain that cannot run on the request (no root context in the
//! worker, its HTTP context could not be created, its instance trapped or was replaced, the
//! worker state is unavailable) fails the request with 500 and an error log line naming the
//! filter, never skips it (Envoy's `fail_open: false`).
//!
//! Internal redirects (`rewrite ... last`, `try_files`, `error_page`, `index`,
//! `X-Accel-Redirect`, named locations): the context lives in the request's pool and survives
//! them. When the request reaches a location whose chain differs from the one it ran, the
//! filters of the new chain that have not run on this request (a filter is the same when its
//! module, name and plugin configuration are) are added and run from `on_request_headers`; the
//! filters that already ran are not run again, so nothing is counted twice. Subrequests
//! (`auth_request`, SSI, `mirror`...) into a location with a chain run that chain as requests of
//! their own (their own contexts and stream).

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_event_t, ngx_http_request_t, ngx_int_t, ngx_pool_cleanup_add,
    ngx_pool_cleanup_t, ngx_uint_t,
};
use tollgate_host::{Action, HttpId, LocalResponse, Stream, StreamCallback, Vm};

use crate::base::{ctx_slot, rc};
use crate::conf::Isolation;
use crate::props::NgxProps;
use crate::util::{level, log};
use crate::worker::{RequestHandle, Worker};

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
    /// The location chain (its address) whose filters this context has added: a different
    /// one after an internal redirect adds the new chain's filters.
    pub chain: *const Vec<usize>,
    /// The filters run on this request, in order.
    pub slots: Vec<Slot>,
    /// Instances owned by the request (isolation `stream`/`filter`).
    pub own_vms: Vec<Vm>,
    /// The stream shared by the filters.
    pub stream: Stream,
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
    /// `response.code_details` of a local response.
    pub local_details: Rc<RefCell<Option<Vec<u8>>>>,
}

/// What a response-side failure did to the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFailure {
    /// `on_response_headers` failed: a 500 replaced the response.
    Replaced,
    /// A body callback failed after the headers went out: the connection is closed.
    Cut,
}

/// How a run of callbacks ended.
pub enum Outcome {
    /// All filters continued.
    Continue,
    /// Paused before filter `n` (0-based index of the next one).
    Paused(usize),
    /// A filter asked for a local response.
    Local(LocalResponse),
    /// A filter trapped, failed or could not run.
    Failed,
    /// A filter closed the stream.
    Closed,
}

thread_local! {
    /// Addresses of the live request contexts (to recognise ours among a pool's cleanups).
    static CTXS: RefCell<rustc_hash::FxHashSet<usize>> = RefCell::new(rustc_hash::FxHashSet::default());
}

/// Whether `p` is one of our live contexts, for the request `r`.
fn is_ctx_of(p: *mut c_void, r: *mut ngx_http_request_t) -> bool {
    if p.is_null() || !CTXS.with(|s| s.try_borrow().is_ok_and(|s| s.contains(&(p as usize)))) {
        return false;
    }
    // SAFETY: a live context (in CTXS until its cleanup runs).
    unsafe { (*p.cast::<RequestCtx>()).r == r }
}

unsafe extern "C" fn ctx_cleanup(data: *mut c_void) {
    let p = data.cast::<RequestCtx>();
    if p.is_null() {
        return;
    }
    CTXS.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.remove(&(p as usize));
        }
    });
    // SAFETY: `data` is the Box created in `RequestCtx::create`, released exactly once here.
    unsafe {
        let mut ctx = Box::from_raw(p);
        if !ctx.finished {
            crate::worker::with_worker(|w| ctx.finish(w));
        } else {
            crate::worker::with_worker(|w| ctx.unregister(w));
        }
        if ctx.resume_ev.posted() != 0 {
            nginx_sys::ngx_delete_posted_event(&mut ctx.resume_ev);
        }
        ctx.stream.property_source = None;
        drop(ctx);
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
            if is_ctx_of((*c).data, r) {
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
        let local_details = Rc::new(RefCell::new(None));
        let stream = Stream {
            property_source: Some(Box::new(NgxProps {
                r,
                local_details: local_details.clone(),
            })),
            // nginx 1.22 discards the trailer section of chunked request bodies and HTTP/2
            // request trailers.
            request_trailers_unavailable: true,
            ..Stream::default()
        };
        let ctx = Box::new(RequestCtx {
            r,
            chain: std::ptr::null(),
            slots: Vec::new(),
            own_vms: Vec::new(),
            stream,
            phase: Phase::Fresh,
            started: 0,
            body_done: 0,
            body_read: false,
            body_loaded: false,
            finished: false,
            response_failed: None,
            refused: false,
            resp_buffering: false,
            resp_eos: false,
            wants_request_body: false,
            wants_response_body: false,
            wants_response_headers: false,
            // SAFETY: a zeroed event is nginx's initial state.
            resume_ev: unsafe { std::mem::zeroed() },
            local_details,
        });
        // SAFETY: the cleanup owns the Box; it runs when the request pool is destroyed.
        unsafe {
            let cln = ngx_pool_cleanup_add((*r).pool, 0);
            if cln.is_null() {
                return None;
            }
            let p = Box::into_raw(ctx);
            CTXS.with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    s.insert(p as usize);
                }
            });
            (*cln).handler = Some(ctx_cleanup);
            (*cln).data = p.cast();
            // Posted events never read `data` in nginx's debug logging (only timers do).
            (*p).resume_ev.handler = Some(resume_handler);
            (*p).resume_ev.data = p.cast();
            (*p).resume_ev.log = (*(*r).connection).log;
            *ctx_slot(r) = p.cast();
            p.as_mut()
        }
    }

    /// Adds the filters of the location chain `chain` that have not run on this request
    /// (all of them for a fresh context; after an internal redirect into a location with a
    /// different chain, those not run yet), creates their HTTP contexts and points the request
    /// side at the first of them. Returns whether filters were added. A filter whose context
    /// cannot be created is marked failed (the request will be refused).
    pub fn enter_chain(
        &mut self,
        w: &mut Worker,
        chain: &Vec<usize>,
        isolation: Isolation,
    ) -> bool {
        if std::ptr::eq(self.chain, chain) {
            return false;
        }
        self.chain = chain;
        let first = self.slots.len();
        for &f in chain {
            let ran = self.slots.iter().any(|s| {
                s.filter == f
                    || w.filters
                        .get(s.filter)
                        .zip(w.filters.get(f))
                        .is_some_and(|(a, b)| a == b)
            });
            if !ran {
                self.slots.push(Slot {
                    filter: f,
                    vm: VmRef::None,
                    http: None,
                    failed: false,
                });
            }
        }
        if self.slots.len() == first {
            return false;
        }
        self.create_contexts(w, isolation, first);
        self.phase = Phase::Headers(first);
        true
    }

    /// Creates the HTTP contexts of the slots from `first` on (and the request's own instances
    /// for `stream`/`filter`).
    fn create_contexts(&mut self, w: &mut Worker, isolation: Isolation, first: usize) {
        let me = RequestHandle::new((self as *mut RequestCtx).cast());
        let req_log = self.log(w);
        for i in first..self.slots.len() {
            let Some(filter) = self.slots.get(i).map(|s| s.filter) else {
                continue;
            };
            let Some(module) = w.filters.get(filter).map(|d| d.module) else {
                continue;
            };
            let created: Result<(VmRef, HttpId), String> = match isolation {
                Isolation::None => {
                    let root = w.roots.get(filter).copied().flatten();
                    let r = match w.vms.get_mut(module) {
                        None => Err("no instance of its module".to_owned()),
                        Some(slot) => {
                            let generation = slot.generation;
                            match (slot.vm.as_mut(), root) {
                                (None, _) => Err("its module has no instance in this worker (see the error log at worker start)".to_owned()),
                                (Some(_), None) => Err("it has no root context in this worker (on_vm_start or on_configure failed, see the error log)".to_owned()),
                                (Some(vm), Some(root)) => vm
                                    .create_http(root)
                                    .map(|h| (VmRef::Shared { module, generation }, h))
                                    .map_err(|e| e.0),
                            }
                        }
                    };
                    if r.is_err() {
                        w.check_poisoned(module);
                    }
                    r
                }
                Isolation::Stream | Isolation::Filter => self.create_owned(w, isolation, i, filter),
            };
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            match created {
                Ok((vm_ref, http)) => {
                    s.vm = vm_ref;
                    s.http = Some(http);
                    if let VmRef::Shared { module, .. } = vm_ref {
                        w.live.insert((module, http.0), me);
                    }
                    let vm = match vm_ref {
                        VmRef::Shared { module, .. } => {
                            w.vms.get(module).and_then(|s| s.vm.as_ref())
                        }
                        VmRef::Owned(k) => self.own_vms.get(k),
                        VmRef::None => None,
                    };
                    if let Some(vm) = vm {
                        self.wants_request_body |= vm.exports_callback(StreamCallback::RequestBody);
                        self.wants_response_body |= vm
                            .exports_callback(StreamCallback::ResponseBody)
                            || vm.exports_callback(StreamCallback::ResponseTrailers);
                        self.wants_response_headers |=
                            vm.exports_callback(StreamCallback::ResponseHeaders);
                    }
                }
                Err(e) => {
                    s.failed = true;
                    let name = w.filters.get(filter).map_or("?", |d| d.name.as_str());
                    log(
                        level::ERR,
                        req_log,
                        &format!("tollgate: filter \"{name}\" cannot run on this request: {e}; refusing it"),
                    );
                }
            }
        }
    }

    /// An HTTP context in an instance of the filter's module owned by this request (isolation
    /// `stream`: one per module, shared by the request's filters of that module; `filter`: one
    /// per filter).
    fn create_owned(
        &mut self,
        w: &mut Worker,
        isolation: Isolation,
        i: usize,
        filter: usize,
    ) -> Result<(VmRef, HttpId), String> {
        let def = w
            .filters
            .get(filter)
            .cloned()
            .ok_or_else(|| "no such filter".to_owned())?;
        let reuse = if isolation == Isolation::Stream {
            self.slots.iter().take(i).find_map(|s| match s.vm {
                VmRef::Owned(k)
                    if w.filters
                        .get(s.filter)
                        .is_some_and(|f| f.module == def.module) =>
                {
                    Some(k)
                }
                _ => None,
            })
        } else {
            None
        };
        let k = match reuse {
            Some(k) => k,
            None => {
                let m = w
                    .modules
                    .get(def.module)
                    .ok_or_else(|| "no such module".to_owned())?;
                let host = Rc::new(crate::worker_host::VmHost {
                    worker: w.host.clone(),
                    vm_slot: usize::MAX,
                    generation: 0,
                    vm_id: m.name.clone(),
                });
                let vm = Vm::new_with_limits(&m.module, host, &m.name, &m.vm_config, &m.limits)
                    .map_err(|e| format!("module \"{}\": {}", m.name, e.0))?;
                self.own_vms.push(vm);
                self.own_vms.len().saturating_sub(1)
            }
        };
        let vm = self
            .own_vms
            .get_mut(k)
            .ok_or_else(|| "no instance".to_owned())?;
        let root = vm.create_root(&def.name, &def.config).map_err(|e| e.0)?;
        let http = vm.create_http(root).map_err(|e| e.0)?;
        Ok((VmRef::Owned(k), http))
    }

    /// The request's connection log (with its client and request in every line), or the
    /// worker's.
    fn log(&self, w: &Worker) -> *mut ngx::ffi::ngx_log_t {
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

    /// Removes this request from the worker's live map.
    pub fn unregister(&mut self, w: &mut Worker) {
        for s in &self.slots {
            if let (VmRef::Shared { module, .. }, Some(h)) = (s.vm, s.http) {
                w.live.remove(&(module, h.0));
            }
        }
    }

    /// Calls `cb` of filter `i`. `Err` (logged, naming the filter and the callback) when the
    /// filter cannot run: it failed before, its context or instance is gone, or it trapped.
    fn call(
        &mut self,
        w: &mut Worker,
        i: usize,
        cb: StreamCallback,
        eos: bool,
    ) -> Result<Action, ()> {
        let Some(slot) = self.slots.get(i) else {
            return Ok(Action::Continue);
        };
        let filter = slot.filter;
        let failed = slot.failed;
        if failed {
            // Logged when it failed; the error response of a refused request goes out without
            // it, anything else is refused.
            return if self.refused {
                Ok(Action::Continue)
            } else {
                Err(())
            };
        }
        let target = match (slot.http, slot.vm) {
            (None, _) | (_, VmRef::None) => Err("it has no HTTP context".to_owned()),
            (Some(id), VmRef::Shared { module, generation }) => match w.vms.get_mut(module) {
                Some(s) if s.generation == generation => match s.vm.as_mut() {
                    Some(vm) => Ok((vm, id, Some(module))),
                    None => Err("its instance is gone".to_owned()),
                },
                _ => Err("its instance was replaced after a trap".to_owned()),
            },
            (Some(id), VmRef::Owned(k)) => match self.own_vms.get_mut(k) {
                Some(vm) => Ok((vm, id, None)),
                None => Err("its instance is gone".to_owned()),
            },
        };
        let (res, module) = match target {
            Ok((vm, id, module)) => {
                // Calls the filter makes take this request's location's directives.
                let _entered = w.host.enter_request(self.r);
                (
                    vm.on_stream(cb, id, &mut self.stream, eos).map_err(|e| e.0),
                    module,
                )
            }
            Err(e) => (Err(e), None),
        };
        match res {
            Ok(a) => Ok(a),
            Err(e) => {
                let name = w
                    .filters
                    .get(filter)
                    .map_or("?", |f| f.name.as_str())
                    .to_owned();
                let module_name = w
                    .filters
                    .get(filter)
                    .and_then(|f| w.modules.get(f.module))
                    .map_or("?", |m| m.name.as_str())
                    .to_owned();
                log(
                    level::ERR,
                    self.log(w),
                    &format!(
                        "tollgate: filter \"{name}\" (module \"{module_name}\") failed in {}: {e}",
                        cb.name()
                    ),
                );
                if let Some(s) = self.slots.get_mut(i) {
                    s.http = None;
                    s.failed = true;
                }
                if let Some(m) = module {
                    w.check_poisoned(m);
                }
                Err(())
            }
        }
    }

    fn run(
        &mut self,
        w: &mut Worker,
        cb: StreamCallback,
        from: usize,
        upto: usize,
        eos: bool,
    ) -> Outcome {
        for i in from..upto {
            if cb == StreamCallback::RequestHeaders {
                self.started = self.started.max(i.saturating_add(1));
            }
            if cb == StreamCallback::RequestBody {
                self.body_done = self.body_done.max(i.saturating_add(1));
            }
            let step = self.call(w, i, cb, eos);
            if let Some(lr) = self.stream.local_response.take() {
                return Outcome::Local(lr);
            }
            if self.stream.closed {
                return Outcome::Closed;
            }
            match step {
                Err(()) => return Outcome::Failed,
                Ok(Action::Pause)
                    if matches!(
                        cb,
                        StreamCallback::RequestHeaders | StreamCallback::RequestBody
                    ) =>
                {
                    // Resumed from inside the callback itself (e.g. a call answered at once).
                    if std::mem::take(&mut self.stream.resumed) {
                        continue;
                    }
                    return Outcome::Paused(i.saturating_add(1));
                }
                Ok(Action::Pause) if cb == StreamCallback::ResponseBody && !eos => {
                    self.resp_buffering = true;
                    return Outcome::Paused(i.saturating_add(1));
                }
                Ok(_) => {}
            }
        }
        Outcome::Continue
    }

    /// `on_request_headers` from filter `from`.
    pub fn request_headers(&mut self, w: &mut Worker, from: usize, eos: bool) -> Outcome {
        let n = self.slots.len();
        self.run(w, StreamCallback::RequestHeaders, from, n, eos)
    }

    /// `on_request_body` (whole body, end of stream) from filter `from` to the started ones.
    pub fn request_body(&mut self, w: &mut Worker, from: usize) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::RequestBody, from, n, true)
    }

    /// `on_response_headers` for the started filters.
    pub fn response_headers(&mut self, w: &mut Worker, eos: bool) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseHeaders, 0, n, eos)
    }

    /// `on_response_body` for the started filters; `Paused` means: buffer until the end.
    pub fn response_body(&mut self, w: &mut Worker, eos: bool) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseBody, 0, n, eos)
    }

    /// `on_response_trailers` for the started filters (the map is `stream.response_trailers`).
    pub fn response_trailers(&mut self, w: &mut Worker) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseTrailers, 0, n, true)
    }

    /// `on_log`, `on_done`, `on_delete` for every filter with a context.
    pub fn finish(&mut self, w: &mut Worker) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.unregister(w);
        let req_log = self.log(w);
        for i in 0..self.slots.len() {
            let Some(slot) = self.slots.get_mut(i) else {
                continue;
            };
            let Some(id) = slot.http.take() else { continue };
            let filter = slot.filter;
            let vm = match slot.vm {
                VmRef::Shared { module, generation } => w
                    .vms
                    .get_mut(module)
                    .filter(|s| s.generation == generation)
                    .and_then(|s| s.vm.as_mut()),
                VmRef::Owned(k) => self.own_vms.get_mut(k),
                VmRef::None => None,
            };
            let Some(vm) = vm else { continue };
            if let Err(e) = vm.on_log_and_delete(id, &mut self.stream) {
                let name = w
                    .filters
                    .get(filter)
                    .map_or("?", |f| f.name.as_str())
                    .to_owned();
                log(
                    level::ERR,
                    req_log,
                    &format!("tollgate: filter \"{name}\" failed in on_log: {}", e.0),
                );
                if let VmRef::Shared { module, .. } = slot.vm {
                    w.check_poisoned(module);
                }
            }
        }
        self.own_vms.clear();
    }
}

/// The context behind a worker's handle.
///
/// # Safety
/// `h` must come from the worker's live map (entries are removed before their request is
/// freed), and no other reference to that context may be live.
pub unsafe fn from_handle<'a>(h: RequestHandle) -> Option<&'a mut RequestCtx> {
    // SAFETY: as the caller guarantees; handles are made from `*mut RequestCtx` only.
    unsafe { h.as_ptr().cast::<RequestCtx>().as_mut() }
}

/// The worker replaced module `module`'s instance: the filters of that module on each request
/// in `orphans` (with the HTTP context it had) cannot run any more, so the request is refused
/// (fail closed); those paused waiting for it are resumed into that refusal instead of waiting
/// for ever. (The worker's hook, see `Worker::orphaned`.)
pub fn orphaned(module: usize, orphans: Vec<(RequestHandle, HttpId)>) {
    let mut resumed = Vec::with_capacity(orphans.len());
    for (h, http) in orphans {
        // SAFETY: the handles come from the worker's live map, just removed from it.
        if let Some(ctx) = unsafe { from_handle(h) } {
            for s in &mut ctx.slots {
                if s.http == Some(http)
                    && matches!(s.vm, VmRef::Shared { module: m, .. } if m == module)
                {
                    s.failed = true;
                }
            }
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

unsafe extern "C" fn resume_handler(ev: *mut ngx_event_t) {
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

/// Sends a filter's local response and finalizes the request (the phase handler then returns
/// `NGX_DONE`). Like Envoy's local replies (`Http::Utility::sendLocalReply`,
/// source/common/http/utility.cc):
/// - on a gRPC request (its `content-type`, as the filters see it now, is `application/grpc` or
///   `application/grpc+...`: `tollgate_services::grpc_status::is_grpc_content_type`), a
///   trailers-only gRPC response: `:status 200`, `content-type: application/grpc`,
///   `grpc-status` (the filter's, else its HTTP status mapped), `grpc-message` (the body,
///   percent-encoded) and the filter's other fields, no body
///   (`tollgate_services::grpc_status::grpc_local_reply`). Over HTTP/2 the fields go out as one
///   HEADERS frame with END_STREAM and no `content-length`; over HTTP/1.x (no trailers-only
///   form) with `Content-Length: 0`, as Envoy's HTTP/1 codec ends a headers-only response;
/// - otherwise the filter's status, fields and body; a body without `content-type` gets
///   `content-type: text/plain`.
///
/// # Safety
/// `r` must be a live request whose header was not sent.
pub unsafe fn send_local(
    r: *mut ngx_http_request_t,
    ctx: &mut RequestCtx,
    lr: LocalResponse,
) -> ngx_int_t {
    ctx.phase = Phase::Forward;
    if let Ok(mut d) = ctx.local_details.try_borrow_mut() {
        *d = Some(if lr.details.is_empty() {
            b"wasm_local_reply".to_vec()
        } else {
            lr.details.clone()
        });
    }
    let grpc = ctx
        .stream
        .request_header(b"content-type")
        .is_some_and(tollgate_services::grpc_status::is_grpc_content_type);
    // SAFETY: standard response sending on a live request.
    unsafe {
        if (*r).header_sent() != 0 {
            return rc::ERROR;
        }
        let _ = nginx_sys::ngx_http_discard_request_body(r);
        let (map, body) = if grpc {
            let head = (*r).method == nginx_sys::NGX_HTTP_HEAD as ngx_uint_t;
            let map = tollgate_services::grpc_status::grpc_local_reply(
                lr.status,
                lr.grpc_status,
                &lr.body,
                &lr.headers,
                head,
            );
            (map, Vec::new())
        } else {
            (http_local_reply(&lr), lr.body)
        };
        (*r).headers_out.status = 0;
        if let Err(e) = crate::headers::apply_response_map(r, &map) {
            log(
                level::ERR,
                (*(*r).connection).log,
                &format!("tollgate: local response: {e}"),
            );
            return rc::HTTP_INTERNAL_SERVER_ERROR;
        }
        if (*r).headers_out.status == 0 {
            (*r).headers_out.status = 500;
        }
        if grpc && (*r).http_version >= nginx_sys::NGX_HTTP_VERSION_20 as ngx_uint_t {
            // Trailers-only: nginx's HTTP/2 header filter sets END_STREAM on the HEADERS frame
            // of a header-only response and writes no content-length for a length of -1.
            (*r).headers_out.content_length_n = -1;
            (*r).set_header_only(1);
        } else if grpc {
            (*r).headers_out.content_length_n = 0;
        }
        let rcode = nginx_sys::ngx_http_send_header(r);
        if rcode == rc::ERROR || rcode > rc::OK || (*r).header_only() != 0 {
            return rcode;
        }
        if body.is_empty() {
            return nginx_sys::ngx_http_send_special(r, 1 /* NGX_HTTP_LAST */);
        }
        let b: *mut ngx_buf_t = nginx_sys::ngx_create_temp_buf((*r).pool, body.len());
        if b.is_null() {
            return rc::ERROR;
        }
        std::ptr::copy_nonoverlapping(body.as_ptr(), (*b).last, body.len());
        (*b).last = (*b).last.add(body.len());
        (*b).set_last_buf(if r == (*r).main { 1 } else { 0 });
        (*b).set_last_in_chain(1);
        let mut out = ngx_chain_t {
            buf: b,
            next: std::ptr::null_mut(),
        };
        nginx_sys::ngx_http_output_filter(r, &mut out)
    }
}

/// The response fields of a local response to a request that is not gRPC: `:status`, the
/// filter's fields but `content-length` (nginx's, from the body), `content-type: text/plain`
/// for a body without one.
fn http_local_reply(lr: &LocalResponse) -> tollgate_host::HeaderMap {
    let mut map: tollgate_host::HeaderMap = Vec::with_capacity(lr.headers.len().saturating_add(3));
    map.push((b":status".to_vec(), lr.status.to_string().into_bytes()));
    for (k, v) in &lr.headers {
        if !k.eq_ignore_ascii_case(b"content-length") {
            map.push((k.clone(), v.clone()));
        }
    }
    if !lr.body.is_empty()
        && !lr
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(b"content-type"))
    {
        map.push((b"content-type".to_vec(), b"text/plain".to_vec()));
    }
    map.push((
        b"content-length".to_vec(),
        lr.body.len().to_string().into_bytes(),
    ));
    map
}
