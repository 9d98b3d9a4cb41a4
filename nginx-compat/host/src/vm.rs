//! One instance of a module in one worker ([`Vm`]): its root and HTTP contexts, and every call
//! into the guest, each under the instance's [`GuestLimits`] (see [`enter`]).

use std::rc::Rc;

use wasmtime::{Instance, Store, TypedFunc};

use crate::abi::store::State;
use crate::combined_calls::{Combined, Plan};
use crate::context_ids::{HttpId, RootId};
use crate::embedder::{GrpcCallResult, Host, HttpCallResponse};
use crate::engine::Module;
use crate::error::Error;
use crate::guest_call::{enter, poisoned_error, trap_reason, Guest};
use crate::limits::{self, CallKind, GuestLimits};
use crate::stream::{Action, Stream, StreamCallback};

/// `proxy_on_http_call_response(context, token, headers, body_size, trailers)`.
type OnHttpCallResponse = TypedFunc<(u32, u32, u32, u32, u32), ()>;

/// `proxy_on_{request,response}_{headers,body}(context, size, end_of_stream)`.
type OnStream = TypedFunc<(u32, u32, u32), u32>;
/// `proxy_on_{request,response}_trailers(context, size)`.
type OnTrailers = TypedFunc<(u32, u32), u32>;

/// The export behind a stream callback: with `end_of_stream` or without (trailers).
enum StreamExport<'a> {
    WithEos(&'a OnStream),
    Trailers(&'a OnTrailers),
}

/// The guest's exports, looked up once at instantiation (missing optional ones are `None`).
struct Exports {
    on_context_create: Option<TypedFunc<(u32, u32), ()>>,
    on_vm_start: Option<TypedFunc<(u32, u32), u32>>,
    on_configure: Option<TypedFunc<(u32, u32), u32>>,
    on_tick: Option<TypedFunc<u32, ()>>,
    on_request_headers: Option<OnStream>,
    on_request_body: Option<OnStream>,
    on_request_trailers: Option<OnTrailers>,
    on_response_headers: Option<OnStream>,
    on_response_body: Option<OnStream>,
    on_response_trailers: Option<OnTrailers>,
    on_log: Option<TypedFunc<u32, ()>>,
    on_done: Option<TypedFunc<u32, u32>>,
    /// `proxy_on_done` for root contexts: the export even where HTTP contexts skip it (a stub, or
    /// left out of the module's `tollgate.http_callbacks`, `stubs.rs`).
    on_root_done: Option<TypedFunc<u32, u32>>,
    on_http_call_response: Option<OnHttpCallResponse>,
    on_queue_ready: Option<TypedFunc<(u32, u32), ()>>,
    /// `proxy_on_grpc_receive(context, token, response_size)`.
    on_grpc_receive: Option<TypedFunc<(u32, u32, u32), ()>>,
    /// `proxy_on_grpc_close(context, token, status_code)`.
    on_grpc_close: Option<TypedFunc<(u32, u32, u32), ()>>,
}

impl Exports {
    /// Forgets the stream callbacks exported as constant stubs (`stubs.rs`): skipping one is
    /// what calling it would do.
    fn skip_stubs(&mut self, stubs: &[StreamCallback]) {
        for cb in stubs {
            match cb {
                StreamCallback::RequestHeaders => self.on_request_headers = None,
                StreamCallback::RequestBody => self.on_request_body = None,
                StreamCallback::RequestTrailers => self.on_request_trailers = None,
                StreamCallback::ResponseHeaders => self.on_response_headers = None,
                StreamCallback::ResponseBody => self.on_response_body = None,
                StreamCallback::ResponseTrailers => self.on_response_trailers = None,
                StreamCallback::Log => self.on_log = None,
                StreamCallback::Done => self.on_done = None,
            }
        }
    }
}

fn typed<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
    store: &mut Store<State>,
    instance: &Instance,
    name: &str,
) -> Result<Option<TypedFunc<P, R>>, Error> {
    match instance.get_func(&mut *store, name) {
        None => Ok(None),
        Some(f) => f
            .typed::<P, R>(&*store)
            .map(Some)
            .map_err(|e| Error::wasm(&format!("export {name} has the wrong type"), &e)),
    }
}

/// One instance of a module in one worker.
pub struct Vm {
    store: Store<State>,
    exports: Exports,
    next_context: u32,
    vm_started: bool,
    poisoned: bool,
    limits: GuestLimits,
    /// The epoch deadlines of `limits` in ticks (`Call`, `Startup`), computed once: the
    /// conversion divides 128-bit integers, on every call into the guest otherwise.
    ticks: (u64, u64),
    /// The callbacks the module implements for HTTP contexts, and the adapter that calls them
    /// back to back in one entry (`combined_calls.rs`).
    plan: Plan,
    combined: Combined,
}

fn action(v: u32) -> Action {
    if v == 0 {
        Action::Continue
    } else {
        Action::Pause
    }
}

/// Calls the export `proxy_<$field>` of `$vm` with `$args` for context `$ctx` under the `Vm`'s
/// limits (see [`enter`]): `None` when the module does not export it, else the call's result.
macro_rules! call_export {
    ($vm:expr, $field:ident, $kind:expr, $ctx:expr, $stream:expr, $args:expr) => {{
        let Vm {
            store,
            exports,
            poisoned,
            limits,
            ticks,
            ..
        } = &mut *$vm;
        match &exports.$field {
            None => None,
            Some(f) => {
                let name = concat!("proxy_", stringify!($field));
                let guest = Guest::new(name, limits, *ticks, $kind, $ctx);
                Some(enter(store, poisoned, &guest, $stream, |s| {
                    f.call(s, $args)
                }))
            }
        }
    }};
}

impl Exports {
    /// The export of a header, body or trailer callback (`None` for `Log`/`Done`, or when the
    /// module does not export it).
    fn stream(&self, cb: StreamCallback) -> Option<StreamExport<'_>> {
        let (with_eos, trailers) = match cb {
            StreamCallback::RequestHeaders => (&self.on_request_headers, &None),
            StreamCallback::RequestBody => (&self.on_request_body, &None),
            StreamCallback::RequestTrailers => (&None, &self.on_request_trailers),
            StreamCallback::ResponseHeaders => (&self.on_response_headers, &None),
            StreamCallback::ResponseBody => (&self.on_response_body, &None),
            StreamCallback::ResponseTrailers => (&None, &self.on_response_trailers),
            StreamCallback::Log | StreamCallback::Done => return None,
        };
        match (with_eos, trailers) {
            (Some(f), _) => Some(StreamExport::WithEos(f)),
            (None, Some(f)) => Some(StreamExport::Trailers(f)),
            (None, None) => None,
        }
    }
}

impl Vm {
    /// [`Vm::new_with_limits`] with [`GuestLimits::DEFAULT`].
    pub fn new(
        module: &Module,
        host: Rc<dyn Host>,
        vm_id: &str,
        vm_config: &[u8],
    ) -> Result<Vm, Error> {
        Vm::new_with_limits(module, host, vm_id, vm_config, &GuestLimits::DEFAULT)
    }

    /// Instantiate (WASI preview1 subset: clocks, random, fd_write to `Host::log`, environ,
    /// args), run `_initialize`/`_start` (within `limits.configure_deadline`), and remember
    /// `vm_config` for `proxy_on_vm_start`. Every later call into the guest is bounded by
    /// `limits` (see [`GuestLimits`]). Errors: the module's start function trapped or ran out
    /// of time, the module's initial memory exceeds `limits.memory_max`, or an export has the
    /// wrong type.
    pub fn new_with_limits(
        module: &Module,
        host: Rc<dyn Host>,
        vm_id: &str,
        vm_config: &[u8],
        limits: &GuestLimits,
    ) -> Result<Vm, Error> {
        let state = State::new(host, vm_id, vm_config, limits::Limiter::new(limits));
        let mut store = Store::new(module.pre.module().engine(), state);
        if !cfg!(feature = "unbounded-guests") {
            store.limiter(|s| &mut s.limiter);
            store.set_epoch_deadline(limits::ticks(limits.configure_deadline));
        }
        let instance = module
            .pre
            .instantiate(&mut store)
            .map_err(|e| Error::wasm("cannot instantiate the module", &e))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| Error("the module exports no memory".into()))?;
        let malloc = match typed::<u32, u32>(&mut store, &instance, "proxy_on_memory_allocate")? {
            Some(f) => Some(f),
            None => typed::<u32, u32>(&mut store, &instance, "malloc")?,
        };
        {
            let data = store.data_mut();
            data.memory = Some(memory);
            data.malloc = malloc.map(Rc::new);
        }
        let mut exports = Exports {
            on_context_create: typed(&mut store, &instance, "proxy_on_context_create")?,
            on_vm_start: typed(&mut store, &instance, "proxy_on_vm_start")?,
            on_configure: typed(&mut store, &instance, "proxy_on_configure")?,
            on_tick: typed(&mut store, &instance, "proxy_on_tick")?,
            on_request_headers: typed(&mut store, &instance, "proxy_on_request_headers")?,
            on_request_body: typed(&mut store, &instance, "proxy_on_request_body")?,
            on_request_trailers: typed(&mut store, &instance, "proxy_on_request_trailers")?,
            on_response_headers: typed(&mut store, &instance, "proxy_on_response_headers")?,
            on_response_body: typed(&mut store, &instance, "proxy_on_response_body")?,
            on_response_trailers: typed(&mut store, &instance, "proxy_on_response_trailers")?,
            on_log: typed(&mut store, &instance, "proxy_on_log")?,
            on_done: typed(&mut store, &instance, "proxy_on_done")?,
            on_root_done: typed(&mut store, &instance, "proxy_on_done")?,
            on_http_call_response: typed(&mut store, &instance, "proxy_on_http_call_response")?,
            on_queue_ready: typed(&mut store, &instance, "proxy_on_queue_ready")?,
            on_grpc_receive: typed(&mut store, &instance, "proxy_on_grpc_receive")?,
            on_grpc_close: typed(&mut store, &instance, "proxy_on_grpc_close")?,
        };
        exports.skip_stubs(&module.stubs);
        let combined = Combined::instantiate(&mut store, &instance, &module.plan, &module.adapter)?;
        let start = match typed::<(), ()>(&mut store, &instance, "_initialize")? {
            Some(f) => Some(f),
            None => typed::<(), ()>(&mut store, &instance, "_start")?,
        };
        if let Some(start) = start {
            start.call(&mut store, ()).map_err(|e| {
                let why = trap_reason(&mut store, limits.configure_deadline, &e);
                Error(format!("the module's start function failed: {why}"))
            })?;
        }
        Ok(Vm {
            store,
            exports,
            next_context: 1,
            vm_started: false,
            poisoned: false,
            limits: *limits,
            ticks: (
                limits::ticks(limits.call_deadline),
                limits::ticks(limits.configure_deadline),
            ),
            plan: module.plan,
            combined,
        })
    }

    /// The bounds every call into this `Vm` runs under.
    pub fn limits(&self) -> &GuestLimits {
        &self.limits
    }

    /// Whether the module exports the stream callback `cb` other than as a constant stub
    /// (`stubs.rs`; a call to one it lacks is a no-op that continues), so that a host can skip
    /// the work that only feeds it, such as buffering a body no filter reads.
    pub fn exports_callback(&self, cb: StreamCallback) -> bool {
        match cb {
            StreamCallback::Log => self.exports.on_log.is_some(),
            StreamCallback::Done => self.exports.on_done.is_some(),
            _ => self.exports.stream(cb).is_some(),
        }
    }

    fn new_context_id(&mut self) -> Result<u32, Error> {
        let id = self.next_context;
        self.next_context = id
            .checked_add(1)
            .ok_or_else(|| Error("context ids exhausted".into()))?;
        Ok(id)
    }

    /// Create a root context for a plugin: `proxy_on_context_create(root, 0)`, `proxy_on_vm_start`
    /// (first root only), `proxy_on_configure`. Err when either returns false (fail closed).
    /// The plugin name is also the root id (`plugin_root_id` property) and the name logs carry.
    pub fn create_root(
        &mut self,
        plugin_name: &str,
        configuration: &[u8],
    ) -> Result<RootId, Error> {
        if self.poisoned {
            return Err(poisoned_error());
        }
        let id = self.new_context_id()?;
        self.store
            .data_mut()
            .add_root(id, plugin_name, configuration);
        let result = self.init_root(id, configuration.len());
        if result.is_err() {
            self.store.data_mut().remove_root(id);
        }
        result.map(|()| RootId(id))
    }

    fn init_root(&mut self, id: u32, configuration_len: usize) -> Result<(), Error> {
        call_export!(
            self,
            on_context_create,
            CallKind::Startup,
            id,
            None,
            (id, 0)
        )
        .transpose()?;
        if !self.vm_started {
            let len = len32(self.store.data().vm_config.len())?;
            let ok = call_export!(self, on_vm_start, CallKind::Startup, id, None, (id, len));
            if ok.transpose()? == Some(0) {
                return Err(Error("proxy_on_vm_start returned false".into()));
            }
            self.vm_started = true;
        }
        let len = len32(configuration_len)?;
        let ok = call_export!(self, on_configure, CallKind::Startup, id, None, (id, len));
        if ok.transpose()? == Some(0) {
            let name = self.store.data().root_name(id).to_owned();
            return Err(Error(format!(
                "plugin {name}: proxy_on_configure returned false (bad configuration? see the log)"
            )));
        }
        Ok(())
    }

    /// The tick period a root context asked for with `proxy_set_tick_period_milliseconds` (0 = none).
    pub fn tick_period_ms(&self, root: RootId) -> u32 {
        self.store.data().tick_period(root.0)
    }

    /// `proxy_on_tick(root)`, with an empty stream.
    pub fn on_tick(&mut self, root: RootId) -> Result<(), Error> {
        let id = root.0;
        call_export!(self, on_tick, CallKind::Call, id, None, id).unwrap_or(Ok(()))
    }

    /// `proxy_on_done(root)`: the plugin is shutting down (the worker exits). The root context
    /// hands over what it holds (the metrics filter its counters); its answer (true: done,
    /// false: it would call `proxy_done` later) is not waited for: the worker is going.
    pub fn on_root_done(&mut self, root: RootId) -> Result<(), Error> {
        let id = root.0;
        call_export!(self, on_root_done, CallKind::Call, id, None, id)
            .transpose()
            .map(|_| ())
    }

    /// Whether a root context of this `Vm` registered the shared queue `queue_id`. (Added.)
    pub fn has_queue(&self, queue_id: u32) -> bool {
        self.store.data().queues.contains_key(&queue_id)
    }

    /// `proxy_on_queue_ready(root, queue_id)` for the root context that registered `queue_id`
    /// (with an empty stream). A queue this `Vm` did not register is ignored. (Added.)
    pub fn on_queue_ready(&mut self, queue_id: u32) -> Result<(), Error> {
        let Some(&root) = self.store.data().queues.get(&queue_id) else {
            return Ok(());
        };
        call_export!(
            self,
            on_queue_ready,
            CallKind::Call,
            root,
            None,
            (root, queue_id)
        )
        .unwrap_or(Ok(()))
    }

    /// The HTTP context that dispatched the call `token`, when it was not a root context
    /// (the embedding may then pass that request's stream to
    /// [`Vm::on_http_call_response_with_stream`]). (Added.)
    pub fn http_call_context(&self, token: u32) -> Option<HttpId> {
        let data = self.store.data();
        let ctx = *data.calls.get(&token)?;
        (!data.is_root(ctx)).then_some(HttpId(ctx))
    }

    /// `proxy_on_http_call_response(context, token, headers, body_size, trailers)` for the
    /// context that dispatched `token`, with an empty stream. An unknown token (e.g. a call of
    /// a replaced `Vm`) is ignored.
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        response: Option<HttpCallResponse>,
    ) -> Result<(), Error> {
        self.http_call_response(token, response, None)
    }

    /// [`Vm::on_http_call_response`] with the stream of the HTTP context that dispatched the
    /// call loaded (its maps and properties are then visible to the filter, and a
    /// `proxy_continue_stream` or local response of the filter lands in it). (Added.)
    pub fn on_http_call_response_with_stream(
        &mut self,
        token: u32,
        response: Option<HttpCallResponse>,
        stream: &mut Stream,
    ) -> Result<(), Error> {
        self.http_call_response(token, response, Some(stream))
    }

    fn http_call_response(
        &mut self,
        token: u32,
        response: Option<HttpCallResponse>,
        stream: Option<&mut Stream>,
    ) -> Result<(), Error> {
        let Some(ctx) = self.store.data_mut().calls.remove(&token) else {
            return Ok(());
        };
        if self.exports.on_http_call_response.is_none() {
            return Ok(());
        }
        let response = response.unwrap_or_default();
        let headers = len32(response.headers.len())?;
        let body = len32(response.body.len())?;
        let trailers = len32(response.trailers.len())?;
        self.store.data_mut().call_response = Some(response);
        let args = (ctx, token, headers, body, trailers);
        let result = call_export!(
            self,
            on_http_call_response,
            CallKind::Call,
            ctx,
            stream,
            args
        )
        .unwrap_or(Ok(()));
        self.store.data_mut().call_response = None;
        result
    }

    /// The HTTP context that dispatched the unary gRPC call `token`, when it was not a root
    /// context and still exists (the embedding may then pass that request's stream to
    /// [`Vm::on_grpc_call_done_with_stream`]). (Added.)
    pub fn grpc_call_context(&self, token: u32) -> Option<HttpId> {
        let data = self.store.data();
        let (_, ctx) = *data.grpc_calls.get(&token)?;
        (!data.is_root(ctx) && data.contexts.contains_key(&ctx)).then_some(HttpId(ctx))
    }

    /// Delivers the end of the unary gRPC call `token` to the root context that owns it (the
    /// root of the context that dispatched it, as proxy-wasm-cpp-host's `grpc_call` makes it;
    /// the call outlives the dispatching request), with an empty stream, as Envoy does for a
    /// unary call (`GrpcCallClientHandler::onSuccessRaw` /
    /// `onFailure` in source/extensions/common/wasm/context.h, fed by
    /// `AsyncRequestImpl::onRemoteClose`, source/common/grpc/async_client_impl.cc):
    /// - status 0: `proxy_on_grpc_receive(context, token, body_size)` only, the reply readable
    ///   as buffer type 5 (`GrpcReceiveBuffer`) during the callback (`onGrpcReceiveWrapper`);
    /// - any other status: `proxy_on_grpc_close(context, token, status)` only, with
    ///   `proxy_get_status` answering the status and message during the callback
    ///   (`onGrpcCloseWrapper`; the message is cleared after it).
    ///
    /// No `proxy_on_grpc_receive_initial_metadata` / `_trailing_metadata` for a unary call
    /// (`AsyncRequestImpl::onReceiveInitialMetadata` and `onReceiveTrailingMetadata` are empty),
    /// so the metadata maps (types 4 and 5) are never available (`NotFound`). The proxy-wasm
    /// Rust SDK turns either callback into `on_grpc_call_response(token, status_code,
    /// response_size)`: `(token, 0, size)` on success, `(token, status, 0)` on failure
    /// (dispatcher.rs `on_grpc_receive`, `on_grpc_close`). An unknown or cancelled token is
    /// ignored. (Added.)
    pub fn on_grpc_call_done(&mut self, token: u32, result: GrpcCallResult) -> Result<(), Error> {
        self.grpc_call_done(token, result, None)
    }

    /// [`Vm::on_grpc_call_done`] with the stream of the HTTP context that dispatched the call
    /// loaded (as [`Vm::on_http_call_response_with_stream`]). (Added.)
    pub fn on_grpc_call_done_with_stream(
        &mut self,
        token: u32,
        result: GrpcCallResult,
        stream: &mut Stream,
    ) -> Result<(), Error> {
        self.grpc_call_done(token, result, Some(stream))
    }

    fn grpc_call_done(
        &mut self,
        token: u32,
        result: GrpcCallResult,
        stream: Option<&mut Stream>,
    ) -> Result<(), Error> {
        // The owner is the root context (see `abi::grpc_calls`): its id is the callback's.
        let Some(&(ctx, _)) = self.store.data().grpc_calls.get(&token) else {
            return Ok(());
        };
        let r = if result.status == 0 {
            let size = len32(result.body.len())?;
            self.store.data_mut().grpc_receive = Some(result.body);
            let args = (ctx, token, size);
            let r = call_export!(self, on_grpc_receive, CallKind::Call, ctx, stream, args);
            self.store.data_mut().grpc_receive = None;
            r
        } else {
            self.store.data_mut().grpc_status = (result.status, result.message.into_bytes());
            let args = (ctx, token, result.status);
            let r = call_export!(self, on_grpc_close, CallKind::Call, ctx, stream, args);
            self.store.data_mut().grpc_status.1.clear();
            r
        };
        self.store.data_mut().grpc_calls.remove(&token);
        r.unwrap_or(Ok(()))
    }

    /// A new HTTP context of `root`. Its `proxy_on_context_create(id, root)` runs with its first
    /// callback, in the same guest entry where that is `proxy_on_request_headers`, or with
    /// its end ([`Vm::on_log_and_delete`]) when it gets none (`combined_calls.rs`); so a trap
    /// in it is that callback's error.
    pub fn create_http(&mut self, root: RootId) -> Result<HttpId, Error> {
        if self.poisoned {
            return Err(poisoned_error());
        }
        if !self.store.data().is_root(root.0) {
            return Err(Error(format!("unknown root context {}", root.0)));
        }
        let id = self.new_context_id()?;
        let pending_create = self.plan.creates();
        self.store.data_mut().add_http(id, root.0, pending_create);
        Ok(HttpId(id))
    }

    /// `proxy_on_context_create(id, parent)` in an entry of its own; the context is forgotten
    /// when it fails.
    fn create_now(&mut self, id: u32, parent: u32) -> Result<(), Error> {
        let r = call_export!(
            self,
            on_context_create,
            CallKind::Call,
            id,
            None,
            (id, parent)
        );
        if let Some(Err(e)) = r {
            self.store.data_mut().contexts.remove(&id);
            return Err(e);
        }
        Ok(())
    }

    /// The stream callback `cb` of HTTP context `id`: `proxy_on_<cb>(id, n, end_of_stream)`,
    /// where `n` is the size of the map (`*Headers`, `*Trailers`: entries) or of the chunk
    /// (`*Body`: `stream.request_body` / `stream.response_body`, bytes); the trailer callbacks
    /// take no `end_of_stream`. `Log` runs `proxy_on_log`, then `proxy_on_done` and
    /// `proxy_on_delete`, and forgets the context even when one traps (use
    /// [`Vm::on_log_and_delete`]; `Done` alone is a no-op here). A callback the module does
    /// not export continues (an `Err` if the `Vm` is poisoned).
    pub fn on_stream(
        &mut self,
        cb: StreamCallback,
        id: HttpId,
        stream: &mut Stream,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        let ctx = id.0;
        let n = match cb {
            StreamCallback::RequestHeaders => stream.headers_len(false),
            StreamCallback::RequestBody => stream.request_body.len(),
            StreamCallback::RequestTrailers => stream.request_trailers.len(),
            StreamCallback::ResponseHeaders => stream.headers_len(true),
            StreamCallback::ResponseBody => stream.response_body.len(),
            StreamCallback::ResponseTrailers => stream.response_trailers.len(),
            StreamCallback::Log => {
                return self
                    .on_log_and_delete(id, stream)
                    .map(|()| Action::Continue)
            }
            StreamCallback::Done => return Ok(Action::Continue),
        };
        let n = len32(n)?;
        if self.exports.stream(cb).is_some() {
            if let Some(root) = self.store.data_mut().take_pending_create(ctx) {
                if cb == StreamCallback::RequestHeaders
                    && self.combined.create_request_headers.is_some()
                {
                    let eos = u32::from(end_of_stream);
                    return self
                        .enter_combined(cb.name(), ctx, stream, |c, s| {
                            match &c.create_request_headers {
                                Some(f) => f.call(s, (ctx, root, n, eos)),
                                // Checked above; Continue, as a missing callback answers.
                                None => Ok(0),
                            }
                        })
                        .map(action);
                }
                self.create_now(ctx, root)?;
            }
        }
        let Vm {
            store,
            exports,
            poisoned,
            limits,
            ticks,
            ..
        } = self;
        let guest = || Guest::new(cb.name(), limits, *ticks, CallKind::Call, ctx);
        let r = match exports.stream(cb) {
            None if *poisoned => return Err(poisoned_error()),
            None => return Ok(Action::Continue),
            Some(StreamExport::WithEos(f)) => {
                let eos = u32::from(end_of_stream);
                enter(store, poisoned, &guest(), Some(stream), |s| {
                    f.call(s, (ctx, n, eos))
                })
            }
            Some(StreamExport::Trailers(f)) => {
                enter(store, poisoned, &guest(), Some(stream), |s| {
                    f.call(s, (ctx, n))
                })
            }
        };
        r.map(action)
    }

    /// `proxy_on_log` then `proxy_on_done` and `proxy_on_delete`. The context is forgotten
    /// even when a callback traps.
    pub fn on_log_and_delete(&mut self, id: HttpId, stream: &mut Stream) -> Result<(), Error> {
        let r = self.log_and_delete(id, stream);
        let data = self.store.data_mut();
        data.contexts.remove(&id.0);
        data.calls.retain(|_, ctx| *ctx != id.0);

        data.resumed.retain(|h| *h != id);
        r
    }

    /// One entry through the adapter's `end` (`combined_calls.rs`): the context's creation if it
    /// is still pending, then the log, done and delete callbacks the module implements.
    fn log_and_delete(&mut self, id: HttpId, stream: &mut Stream) -> Result<(), Error> {
        let ctx = id.0;
        let (create, root) = match self.store.data_mut().take_pending_create(ctx) {
            Some(root) => (1, root),
            None => (0, 0),
        };
        if !self.plan.ends(create == 1) {
            return if self.poisoned {
                Err(poisoned_error())
            } else {
                Ok(())
            };
        }
        self.enter_combined("proxy_on_log", ctx, stream, |c, s| {
            c.end.call(s, (ctx, create, root))
        })
    }

    /// A call through the callbacks' adapter for HTTP context `ctx`, with its stream (see
    /// [`enter`]; `name`: the callback it stands for, before the adapter names the one that
    /// failed). `call` gets the adapter by reference: cloning one of its `TypedFunc`s clones
    /// its registered type, about 770 instructions a request in the likely chain.
    fn enter_combined<R>(
        &mut self,
        name: &'static str,
        ctx: u32,
        stream: &mut Stream,
        call: impl FnOnce(&Combined, &mut Store<State>) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        let Vm {
            store,
            poisoned,
            limits,
            ticks,
            combined,
            ..
        } = self;
        let guest = Guest::new(name, limits, *ticks, CallKind::Call, ctx).through(combined);
        enter(store, poisoned, &guest, Some(stream), |s| call(combined, s))
    }

    /// How many HTTP and gRPC calls the instance has dispatched (wrapping): a value that changed
    /// across a callback says the callback dispatched one, whose answer the embedding must be
    /// able to route to its request (`proxy_on_http_call_response`, `proxy_on_grpc_receive`).
    pub fn calls_dispatched(&self) -> u64 {
        self.store.data().dispatched
    }

    /// HTTP contexts whose stream is not loaded (e.g. the filter called `proxy_set_effective_context`
    /// then `proxy_continue_stream` from `on_http_call_response` or `on_tick`) and asked to resume
    /// since the last call; the embedding resumes those requests.
    pub fn take_resumed(&mut self) -> Vec<HttpId> {
        std::mem::take(&mut self.store.data_mut().resumed)
    }

    /// True after a trap: the embedding should drop this `Vm` and instantiate a new one.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The bytes of linear memory the instance has now (grows with `memory.grow`, never
    /// shrinks; at most `limits().memory_max`).
    pub fn memory_size(&mut self) -> usize {
        match self.store.data().memory {
            Some(m) => m.data_size(&self.store),
            None => 0,
        }
    }
}

impl Drop for Vm {
    /// Its roots' tick periods end with it: an embedding that follows
    /// [`crate::tick_generation`] re-reads the periods.
    fn drop(&mut self) {
        crate::abi::store::tick_periods_changed();
    }
}

fn len32(n: usize) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| Error(format!("size {n} does not fit the 32-bit ABI")))
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::{Stream, StreamCallback, Vm};

    /// The stream is lent to the store for one HTTP callback only: a root callback after it
    /// sees no stream (here, not the property the HTTP callback set on it), and the stream
    /// keeps what the callback wrote.
    #[test]
    fn a_stream_is_lent_for_its_callback_only() {
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_set_property" (func $set (param i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_get_property" (func $get (param i32 i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 16) "k")
               (data (i32.const 20) "v")
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (if (call $set (i32.const 16) (i32.const 1) (i32.const 20) (i32.const 1))
                   (then unreachable))
                 (i32.const 0))
               (func (export "proxy_on_tick") (param i32)
                 ;; Status 0 (found): the HTTP callback's stream is still visible.
                 (if (i32.eqz (call $get (i32.const 16) (i32.const 1) (i32.const 32) (i32.const 36)))
                   (then unreachable)))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let id = vm.create_http(root).unwrap();
        let mut s = Stream::default();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(s.properties.get(b"k"), Some(b"v".as_slice()));
        vm.on_tick(root).unwrap();
    }

    #[test]
    fn a_trap_is_an_error_and_poisons_the_vm() {
        let m = compile(&wat(
            "0_2_1",
            "",
            r#"(func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (i32.load (i32.const 70000)))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let id = vm.create_http(root).unwrap();
        let mut s = Stream {
            request_headers: vec![(b":path".to_vec(), b"/".to_vec())],
            ..Default::default()
        };
        let err = vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap_err();
        assert!(err.0.contains("out of bounds"), "{err}");
        assert!(vm.is_poisoned());
        // The stream came back.
        assert_eq!(s.request_headers.len(), 1);
        assert!(vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .is_err());
        assert!(vm.create_http(root).is_err());
    }
}
