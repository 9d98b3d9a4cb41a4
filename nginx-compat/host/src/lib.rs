//! CONTRACT SKELETON (to be replaced by the implementation): the public API of `tollgate-host`,
//! a proxy-wasm host on wasmtime that knows nothing of nginx. The nginx module
//! (`nginx-compat/module`) and the in-process tests code against these names and signatures.
//! The implementer may add items and change internals; changing a signature below must be
//! reflected in every caller.
//!
//! Model (the proxy-wasm ABI, https://github.com/proxy-wasm/spec, versions 0.2.1 and 0.2.0):
//! - [`Engine`] compiles a `.wasm` once (in the nginx master, before fork: no threads).
//! - [`Vm`] is one instance of a [`Module`] in one worker (one `Store`); it holds the root
//!   contexts of the plugins that use that module and the HTTP contexts of live streams.
//! - [`Stream`] is the per-request state shared by every filter of a chain (header maps, body
//!   buffers, properties set by filters, the local response). It is moved into the `Store` for
//!   the duration of a callback and moved back out, so the host core needs no `unsafe`.
//! - [`Host`] is what the embedding provides per worker: logging, shared data, metrics, shared
//!   queues, HTTP calls, timers. Lazily computed properties come from [`Stream::properties`]'s
//!   fallback ([`PropertySource`]).

use std::rc::Rc;

/// Errors of loading, instantiating and calling a module. A trap in a callback is an `Error`
/// too: the embedding fails that request with 500 and logs the message; the `Vm` stays usable
/// only if [`Vm::is_poisoned`] says so (a trapped instance is replaced by a fresh one).
#[derive(Debug)]
pub struct Error(pub String);

/// proxy-wasm `WasmResult` status codes (spec: `proxy_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status { Ok = 0, NotFound = 1, BadArgument = 2, SerializationFailure = 3, ParseFailure = 4, Empty = 7, CasMismatch = 8, InternalFailure = 10, Unimplemented = 12 }

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel { Trace = 0, Debug = 1, Info = 2, Warn = 3, Error = 4, Critical = 5 }

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind { Counter = 0, Gauge = 1, Histogram = 2 }

/// What a filter callback returned (spec: `proxy_action_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action { Continue, Pause }

/// Header map (spec: `proxy_map_type_t` values), names lower-case, in order; duplicates allowed.
pub type HeaderMap = Vec<(Vec<u8>, Vec<u8>)>;

/// A local response requested with `proxy_send_local_response`.
#[derive(Debug, Clone, Default)]
pub struct LocalResponse { pub status: u32, pub details: Vec<u8>, pub body: Vec<u8>, pub headers: HeaderMap }

/// Properties computed on demand by the embedding (e.g. `request.path`, `source.address`,
/// `response.code`). `path` is the property path as the ABI passes it, segments joined by `\0`.
pub trait PropertySource { fn property(&self, path: &[u8]) -> Option<Vec<u8>>; }

/// Per-request state shared by the filters of a chain.
#[derive(Default)]
pub struct Stream {
    pub request_headers: HeaderMap,
    pub request_trailers: HeaderMap,
    pub response_headers: HeaderMap,
    pub response_trailers: HeaderMap,
    /// The body chunk the current `on_*_body` callback sees (`proxy_get_buffer_bytes` of
    /// `HttpRequestBody`/`HttpResponseBody`); filters may replace it.
    pub request_body: Vec<u8>,
    pub response_body: Vec<u8>,
    /// Set when a filter changed the corresponding map or buffer, so the embedding copies back.
    pub request_headers_changed: bool,
    pub response_headers_changed: bool,
    pub request_body_changed: bool,
    pub response_body_changed: bool,
    /// Properties set by filters (`proxy_set_property`), keyed by `\0`-joined path; read first.
    pub properties: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    /// Fallback for properties the filters did not set.
    pub property_source: Option<Box<dyn PropertySource>>,
    /// Set by `proxy_send_local_response`; the embedding sends it and stops the chain.
    pub local_response: Option<LocalResponse>,
    /// Set by `proxy_continue_stream` (resume after `Action::Pause`).
    pub resumed: bool,
}

/// A request dispatched with `proxy_dispatch_http_call`; the embedding performs it without
/// blocking and later calls [`Vm::on_http_call_response`] with the same `token`.
#[derive(Debug, Clone)]
pub struct HttpCall { pub token: u32, pub upstream: String, pub headers: HeaderMap, pub body: Vec<u8>, pub trailers: HeaderMap, pub timeout_ms: u32 }

/// The response of an [`HttpCall`]; `None` in [`Vm::on_http_call_response`] means it failed
/// (connect error, timeout): the ABI then reports 0 headers and an empty body.
#[derive(Debug, Clone, Default)]
pub struct HttpCallResponse { pub headers: HeaderMap, pub body: Vec<u8>, pub trailers: HeaderMap }

/// What the embedding provides to every `Vm` of a worker.
pub trait Host {
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str);
    /// Minimum level that reaches `log` (`proxy_get_log_level`).
    fn log_level(&self) -> LogLevel { LogLevel::Info }
    /// `proxy_get_shared_data`: value and CAS token.
    fn get_shared_data(&self, key: &[u8]) -> Result<(Vec<u8>, u32), Status>;
    /// `proxy_set_shared_data`. CAS semantics are the embedding's to document.
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status>;
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status>;
    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status>;
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status>;
    fn get_metric(&self, id: u32) -> Result<u64, Status>;
    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> { let _ = name; Err(Status::Unimplemented) }
    fn resolve_shared_queue(&self, vm_id: &str, name: &str) -> Result<u32, Status> { let _ = (vm_id, name); Err(Status::Unimplemented) }
    fn enqueue_shared_queue(&self, id: u32, value: &[u8]) -> Result<(), Status> { let _ = (id, value); Err(Status::Unimplemented) }
    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> { let _ = id; Err(Status::Unimplemented) }
    /// Start an HTTP call; Err(BadArgument) for an unknown upstream.
    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status>;
}

/// Compiles modules. One per process.
pub struct Engine { /* wasmtime::Engine */ }
/// A compiled module (cheap to clone).
#[derive(Clone)]
pub struct Module { /* wasmtime::Module, detected ABI version */ }

impl Engine {
    /// Cranelift, `parallel_compilation(false)` (safe to call in the nginx master before fork).
    pub fn new() -> Result<Engine, Error> { unimplemented!() }
    /// Compile a `.wasm` file; checks that it exports a supported proxy-wasm ABI version.
    pub fn compile_file(&self, path: &std::path::Path) -> Result<Module, Error> { unimplemented!() }
}

/// A root context id in a [`Vm`] (one per plugin that uses the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RootId(pub u32);
/// An HTTP context id in a [`Vm`] (one per stream per plugin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HttpId(pub u32);

/// One instance of a module in one worker.
pub struct Vm { /* wasmtime::Store<State>, cached TypedFuncs, context table */ }

impl Vm {
    /// Instantiate (WASI preview1 subset: clocks, random, fd_write to `Host::log`, environ,
    /// args), run `_initialize`/`_start`, and remember `vm_config` for `proxy_on_vm_start`.
    pub fn new(module: &Module, host: Rc<dyn Host>, vm_id: &str, vm_config: &[u8]) -> Result<Vm, Error> { unimplemented!() }
    /// Create a root context for a plugin: `proxy_on_context_create(root, 0)`, `proxy_on_vm_start`
    /// (first root only), `proxy_on_configure`. Err when either returns false (fail closed).
    pub fn create_root(&mut self, plugin_name: &str, configuration: &[u8]) -> Result<RootId, Error> { unimplemented!() }
    /// The tick period a root context asked for with `proxy_set_tick_period_milliseconds` (0 = none).
    pub fn tick_period_ms(&self, root: RootId) -> u32 { unimplemented!() }
    pub fn on_tick(&mut self, root: RootId) -> Result<(), Error> { unimplemented!() }
    pub fn on_http_call_response(&mut self, token: u32, response: Option<HttpCallResponse>) -> Result<(), Error> { unimplemented!() }

    /// `proxy_on_context_create(id, root)`.
    pub fn create_http(&mut self, root: RootId) -> Result<HttpId, Error> { unimplemented!() }
    pub fn on_request_headers(&mut self, id: HttpId, stream: &mut Stream, end_of_stream: bool) -> Result<Action, Error> { unimplemented!() }
    pub fn on_request_body(&mut self, id: HttpId, stream: &mut Stream, end_of_stream: bool) -> Result<Action, Error> { unimplemented!() }
    pub fn on_response_headers(&mut self, id: HttpId, stream: &mut Stream, end_of_stream: bool) -> Result<Action, Error> { unimplemented!() }
    pub fn on_response_body(&mut self, id: HttpId, stream: &mut Stream, end_of_stream: bool) -> Result<Action, Error> { unimplemented!() }
    /// `proxy_on_log` then `proxy_on_done` and `proxy_on_delete`.
    pub fn on_log_and_delete(&mut self, id: HttpId, stream: &mut Stream) -> Result<(), Error> { unimplemented!() }
    /// HTTP contexts whose stream is not loaded (e.g. the filter called `proxy_set_effective_context`
    /// then `proxy_continue_stream` from `on_http_call_response` or `on_tick`) and asked to resume
    /// since the last call; the embedding resumes those requests.
    pub fn take_resumed(&mut self) -> Vec<HttpId> { unimplemented!() }
    /// True after a trap: the embedding should drop this `Vm` and instantiate a new one.
    pub fn is_poisoned(&self) -> bool { unimplemented!() }
}
