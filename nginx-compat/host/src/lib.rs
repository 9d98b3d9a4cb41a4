//! `tollgate-host`: a proxy-wasm host (ABI 0.2.1 and 0.2.0) on wasmtime that knows nothing of
//! nginx. The nginx module (`nginx-compat/module`) and the in-process tests drive the filters
//! through this API.
//!
//! Model (the proxy-wasm ABI, <https://github.com/proxy-wasm/spec>, versions 0.2.1 and 0.2.0):
//! - [`Engine`] compiles a `.wasm` once (in the nginx master, before fork: no threads).
//! - [`Vm`] is one instance of a [`Module`] in one worker (one `Store`); it holds the root
//!   contexts of the plugins that use that module and the HTTP contexts of live streams.
//! - [`Stream`] is the per-request state shared by every filter of a chain (header maps, body
//!   buffers, properties set by filters, the local response). It is moved into the `Store` for
//!   the duration of a callback and moved back out, so the host core needs no `unsafe`.
//! - [`Host`] is what the embedding provides per worker: logging, shared data, metrics, shared
//!   queues, HTTP calls, timers. Lazily computed properties come from [`Stream::properties`]'s
//!   fallback ([`PropertySource`]).
//!
//! [`testing::MemoryHost`] is an in-memory [`Host`] for tests.

use std::rc::Rc;

mod abi;
mod limits;
mod mem;
pub mod testing;
mod valid;
mod wasi;

use wasmtime::{Instance, InstancePre, Store, TypedFunc};

use limits::CallKind;
pub use limits::{EpochTicker, GuestLimits, EPOCH_TICK};

/// Errors of loading, instantiating and calling a module. A trap in a callback is an `Error`
/// too: the embedding fails that request with 500 and logs the message; the `Vm` stays usable
/// only if [`Vm::is_poisoned`] says so (a trapped instance is replaced by a fresh one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl Error {
    fn wasm(what: &str, e: &wasmtime::Error) -> Error {
        let mut msg = String::from(what);
        for cause in e.chain() {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
        }
        Error(msg)
    }
}

/// proxy-wasm `WasmResult` status codes (spec: `proxy_status_t`), what host functions return to
/// the guest. (The host also returns `InvalidMemoryAccess` = 6 for a guest pointer out of
/// bounds; the [`Host`] trait never needs it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

/// proxy-wasm log levels (spec: `proxy_log_level_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

impl LogLevel {
    /// The level of an ABI value; values above `Critical` are `Critical`.
    pub fn from_u32(v: u32) -> LogLevel {
        match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            _ => LogLevel::Critical,
        }
    }
}

/// proxy-wasm metric types (spec: `proxy_metric_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// What a filter callback returned (spec: `proxy_action_t`): 0 is `Continue`, anything else
/// (`Pause`, Envoy's `StopAllIteration*`) is `Pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

/// Header map (spec: `proxy_map_type_t` values), names lower-case, in order; duplicates allowed.
pub type HeaderMap = Vec<(Vec<u8>, Vec<u8>)>;

/// A local response requested with `proxy_send_local_response`: HTTP status, the details
/// string (Envoy's response code details), the body and extra headers (names lower-case).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub details: Vec<u8>,
    pub body: Vec<u8>,
    pub headers: HeaderMap,
}

/// Properties computed on demand by the embedding (e.g. `request.path`, `source.address`,
/// `response.code`). `path` is the property path as the ABI passes it, segments joined by `\0`
/// (e.g. `b"request\0path"`). Values use Envoy's encodings (strings as bytes, integers as
/// 8-byte little-endian where Envoy does so; the Tollgate filters parse decimal text too).
pub trait PropertySource {
    fn property(&self, path: &[u8]) -> Option<Vec<u8>>;
}

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
    pub request_trailers_changed: bool,
    pub response_headers_changed: bool,
    pub response_trailers_changed: bool,
    pub request_body_changed: bool,
    pub response_body_changed: bool,
    /// Properties set by filters (`proxy_set_property`), keyed by `\0`-joined path; read first.
    pub properties: rustc_hash::FxHashMap<Vec<u8>, Vec<u8>>,
    /// Fallback for properties the filters did not set.
    pub property_source: Option<Box<dyn PropertySource>>,
    /// Set by `proxy_send_local_response`; the embedding sends it and stops the chain.
    pub local_response: Option<LocalResponse>,
    /// Set by `proxy_continue_stream` (resume after `Action::Pause`).
    pub resumed: bool,
    /// Set by `proxy_close_stream` (Envoy resets the stream): the embedding closes the
    /// connection (nginx: 444) or fails the request. (Added to the contract.)
    pub closed: bool,
    /// Set by an embedding that never has request trailers (nginx discards them): the map
    /// reads as empty and writes to it return `BadArgument`, Envoy's status for a trailer map
    /// the stream does not have. (Added.)
    pub request_trailers_unavailable: bool,
}

/// A request dispatched with `proxy_http_call`; the embedding performs it without
/// blocking and later calls [`Vm::on_http_call_response`] with the same `token`.
/// `headers` include the pseudo-headers `:method`, `:path`, `:authority` (checked present, as
/// Envoy does); `timeout_ms` is the guest's timeout in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    pub token: u32,
    pub upstream: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
    pub timeout_ms: u32,
}

/// The response of an [`HttpCall`]; `None` in [`Vm::on_http_call_response`] means it failed
/// (connect error, timeout): the ABI then reports 0 headers and an empty body.
/// `headers` carry the status as `:status`, like Envoy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpCallResponse {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
}

/// What the embedding provides to every `Vm` of a worker.
pub trait Host {
    /// A log line of a plugin (`proxy_log`, and WASI stdout (Info) / stderr (Error) lines).
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str);
    /// Minimum level that reaches `log` (`proxy_get_log_level`); lower levels are dropped by
    /// the host before `log`.
    fn log_level(&self) -> LogLevel {
        LogLevel::Info
    }
    /// `proxy_get_shared_data`: value and CAS token; `Err(NotFound)` for a missing key.
    fn get_shared_data(&self, key: &[u8]) -> Result<(Vec<u8>, u32), Status>;
    /// `proxy_set_shared_data`. CAS semantics are the embedding's to document
    /// ([`testing::MemoryHost`] follows ngx_wasm_module: `Err(CasMismatch)` unless `cas` is
    /// the key's current token; a new key accepts any `cas`).
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status>;
    /// `proxy_define_metric`: the id of the metric `name` (the same id for the same name).
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status>;
    /// `proxy_increment_metric` (counters and gauges; `delta` may be negative for gauges).
    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status>;
    /// `proxy_record_metric` (gauges: set; histograms: record a sample).
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status>;
    /// `proxy_get_metric`.
    fn get_metric(&self, id: u32) -> Result<u64, Status>;
    /// `proxy_register_shared_queue`: the queue's id. The `Vm` remembers which root context
    /// registered it, for [`Vm::on_queue_ready`].
    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> {
        let _ = name;
        Err(Status::Unimplemented)
    }
    /// `proxy_resolve_shared_queue`.
    fn resolve_shared_queue(&self, vm_id: &str, name: &str) -> Result<u32, Status> {
        let _ = (vm_id, name);
        Err(Status::Unimplemented)
    }
    /// `proxy_enqueue_shared_queue`.
    fn enqueue_shared_queue(&self, id: u32, value: &[u8]) -> Result<(), Status> {
        let _ = (id, value);
        Err(Status::Unimplemented)
    }
    /// `proxy_dequeue_shared_queue`: `Err(Empty)` when the queue is empty.
    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> {
        let _ = id;
        Err(Status::Unimplemented)
    }
    /// Start an HTTP call; Err(BadArgument) for an unknown upstream.
    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status>;
}

/// The proxy-wasm ABI version a module exports (`proxy_abi_version_0_2_1` or `_0_2_0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiVersion {
    V0_2_0,
    V0_2_1,
}

/// Compiles modules. One per process (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    engine: wasmtime::Engine,
}

/// A compiled module (cheap to clone): the wasmtime module pre-linked with the host functions.
#[derive(Clone)]
pub struct Module {
    pre: InstancePre<abi::State>,
    abi: AbiVersion,
}

impl Engine {
    /// Cranelift at opt level `speed`, no parallel compilation (wasmtime is built without its
    /// `parallel-compilation` feature, so no thread is ever started: safe to call in the nginx
    /// master before fork), signals-based traps (guard pages instead of bounds checks).
    pub fn new() -> Result<Engine, Error> {
        let mut config = wasmtime::Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        // Every call into a guest has a deadline (limits.rs): compiled code checks the epoch.
        config.epoch_interruption(!cfg!(feature = "unbounded-guests"));
        let engine =
            wasmtime::Engine::new(&config).map_err(|e| Error::wasm("wasmtime engine", &e))?;
        Ok(Engine { engine })
    }

    /// Starts a thread that advances this engine's epoch every [`EPOCH_TICK`] until the
    /// returned ticker is dropped: the clock of every guest deadline ([`GuestLimits`]).
    pub fn start_epoch_ticker(&self) -> Result<EpochTicker, Error> {
        EpochTicker::start(self.engine.clone())
    }

    /// Compile a `.wasm` file; checks that it exports a supported proxy-wasm ABI version and
    /// that every import can be linked (see [`Engine::compile`]).
    pub fn compile_file(&self, path: &std::path::Path) -> Result<Module, Error> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error(format!("cannot read {}: {e}", path.display())))?;
        self.compile(&bytes)
            .map_err(|e| Error(format!("{}: {}", path.display(), e.0)))
    }

    /// Compile a module from its binary. Errors: not Wasm, no `proxy_abi_version_0_2_1` /
    /// `proxy_abi_version_0_2_0` export (0.1.0 is not supported), no exported `memory`, or an
    /// import outside the modules `env` (unknown names there are linked to a stub returning
    /// `Unimplemented`) and `wasi_snapshot_preview1` (unknown names return `ENOSYS`), or an
    /// import whose type differs from the ABI's.
    pub fn compile(&self, wasm: &[u8]) -> Result<Module, Error> {
        let module = wasmtime::Module::new(&self.engine, wasm)
            .map_err(|e| Error::wasm("cannot compile the module", &e))?;
        let has =
            |name: &str| matches!(module.get_export(name), Some(wasmtime::ExternType::Func(_)));
        let abi = if has("proxy_abi_version_0_2_1") {
            AbiVersion::V0_2_1
        } else if has("proxy_abi_version_0_2_0") {
            AbiVersion::V0_2_0
        } else if has("proxy_abi_version_0_1_0") {
            return Err(Error(
                "proxy-wasm ABI 0.1.0 is not supported (0.2.0 and 0.2.1 are)".into(),
            ));
        } else {
            return Err(Error(
                "not a proxy-wasm module: no proxy_abi_version_0_2_1 or proxy_abi_version_0_2_0 export"
                    .into(),
            ));
        };
        if !matches!(
            module.get_export("memory"),
            Some(wasmtime::ExternType::Memory(_))
        ) {
            return Err(Error(
                "the module exports no memory named \"memory\"".into(),
            ));
        }
        let linker = abi::linker(&self.engine, &module)?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| Error::wasm("cannot link the module", &e))?;
        Ok(Module { pre, abi })
    }
}

impl Module {
    /// The ABI version the module exports.
    pub fn abi_version(&self) -> AbiVersion {
        self.abi
    }
}

/// A root context id in a [`Vm`] (one per plugin that uses the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RootId(pub u32);
/// An HTTP context id in a [`Vm`] (one per stream per plugin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HttpId(pub u32);

/// `proxy_on_http_call_response(context, token, headers, body_size, trailers)`.
type OnHttpCallResponse = TypedFunc<(u32, u32, u32, u32, u32), ()>;

/// The guest's exports, looked up once at instantiation (missing optional ones are `None`).
struct Exports {
    on_context_create: Option<TypedFunc<(u32, u32), ()>>,
    on_vm_start: Option<TypedFunc<(u32, u32), u32>>,
    on_configure: Option<TypedFunc<(u32, u32), u32>>,
    on_tick: Option<TypedFunc<u32, ()>>,
    on_request_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    on_request_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    on_request_trailers: Option<TypedFunc<(u32, u32), u32>>,
    on_response_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    on_response_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    on_response_trailers: Option<TypedFunc<(u32, u32), u32>>,
    on_log: Option<TypedFunc<u32, ()>>,
    on_done: Option<TypedFunc<u32, u32>>,
    on_delete: Option<TypedFunc<u32, ()>>,
    on_http_call_response: Option<OnHttpCallResponse>,
    on_queue_ready: Option<TypedFunc<(u32, u32), ()>>,
}

fn typed<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
    store: &mut Store<abi::State>,
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

/// The HTTP stream callbacks a module may export (proxy-wasm ABI 0.2.1, `proxy_on_<name>`). Every
/// one is optional: a host skips the callback a module does not export, as proxy-wasm-cpp-host
/// (Envoy) and ngx_wasm_module do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamCallback {
    /// `proxy_on_request_headers`.
    RequestHeaders,
    /// `proxy_on_request_body`.
    RequestBody,
    /// `proxy_on_request_trailers`.
    RequestTrailers,
    /// `proxy_on_response_headers`.
    ResponseHeaders,
    /// `proxy_on_response_body`.
    ResponseBody,
    /// `proxy_on_response_trailers`.
    ResponseTrailers,
    /// `proxy_on_log`.
    Log,
    /// `proxy_on_done`.
    Done,
}

impl StreamCallback {
    /// The export's name: `proxy_on_<name>`.
    pub fn name(self) -> &'static str {
        match self {
            StreamCallback::RequestHeaders => "proxy_on_request_headers",
            StreamCallback::RequestBody => "proxy_on_request_body",
            StreamCallback::RequestTrailers => "proxy_on_request_trailers",
            StreamCallback::ResponseHeaders => "proxy_on_response_headers",
            StreamCallback::ResponseBody => "proxy_on_response_body",
            StreamCallback::ResponseTrailers => "proxy_on_response_trailers",
            StreamCallback::Log => "proxy_on_log",
            StreamCallback::Done => "proxy_on_done",
        }
    }

    /// Every stream callback, in the order of a request.
    pub const ALL: [StreamCallback; 8] = [
        StreamCallback::RequestHeaders,
        StreamCallback::RequestBody,
        StreamCallback::RequestTrailers,
        StreamCallback::ResponseHeaders,
        StreamCallback::ResponseBody,
        StreamCallback::ResponseTrailers,
        StreamCallback::Log,
        StreamCallback::Done,
    ];
}

/// One instance of a module in one worker.
pub struct Vm {
    store: Store<abi::State>,
    exports: Exports,
    next_context: u32,
    vm_started: bool,
    poisoned: bool,
    limits: GuestLimits,
}

fn action(v: u32) -> Action {
    if v == 0 {
        Action::Continue
    } else {
        Action::Pause
    }
}

/// A call into the guest: the export's name, its deadline and the context it runs for.
struct Guest {
    name: &'static str,
    deadline: std::time::Duration,
    ctx: u32,
}

impl Guest {
    fn new(name: &'static str, limits: &GuestLimits, kind: CallKind, ctx: u32) -> Guest {
        let deadline = match kind {
            CallKind::Startup => limits.configure_deadline,
            CallKind::Call => limits.call_deadline,
        };
        Guest {
            name,
            deadline,
            ctx,
        }
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
            ..
        } = &mut *$vm;
        match &exports.$field {
            None => None,
            Some(f) => {
                let name = concat!("proxy_", stringify!($field));
                let guest = Guest::new(name, limits, $kind, $ctx);
                Some(enter(store, poisoned, &guest, $stream, |s| {
                    f.call(s, $args)
                }))
            }
        }
    }};
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
        let state = abi::State::new(host, vm_id, vm_config, limits::Limiter::new(limits));
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
            data.malloc = malloc.map(std::rc::Rc::new);
        }
        let exports = Exports {
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
            on_delete: typed(&mut store, &instance, "proxy_on_delete")?,
            on_http_call_response: typed(&mut store, &instance, "proxy_on_http_call_response")?,
            on_queue_ready: typed(&mut store, &instance, "proxy_on_queue_ready")?,
        };
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
        })
    }

    /// The bounds every call into this `Vm` runs under.
    pub fn limits(&self) -> &GuestLimits {
        &self.limits
    }

    /// Whether the module exports the stream callback `cb` (a call to one it lacks is a no-op
    /// that continues), so that a host can skip the work that only feeds it, such as buffering a
    /// body no filter reads.
    pub fn exports_callback(&self, cb: StreamCallback) -> bool {
        let e = &self.exports;
        match cb {
            StreamCallback::RequestHeaders => e.on_request_headers.is_some(),
            StreamCallback::RequestBody => e.on_request_body.is_some(),
            StreamCallback::RequestTrailers => e.on_request_trailers.is_some(),
            StreamCallback::ResponseHeaders => e.on_response_headers.is_some(),
            StreamCallback::ResponseBody => e.on_response_body.is_some(),
            StreamCallback::ResponseTrailers => e.on_response_trailers.is_some(),
            StreamCallback::Log => e.on_log.is_some(),
            StreamCallback::Done => e.on_done.is_some(),
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

    /// `proxy_on_context_create(id, root)`.
    pub fn create_http(&mut self, root: RootId) -> Result<HttpId, Error> {
        if self.poisoned {
            return Err(poisoned_error());
        }
        if !self.store.data().is_root(root.0) {
            return Err(Error(format!("unknown root context {}", root.0)));
        }
        let id = self.new_context_id()?;
        self.store.data_mut().add_http(id, root.0);
        let parent = root.0;
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
        Ok(HttpId(id))
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
        let eos = u32::from(end_of_stream);
        let n = |len: usize| len32(len);
        let r = match cb {
            StreamCallback::RequestHeaders => {
                let n = n(stream.request_headers.len())?;
                call_export!(
                    self,
                    on_request_headers,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n, eos)
                )
            }
            StreamCallback::RequestBody => {
                let n = n(stream.request_body.len())?;
                call_export!(
                    self,
                    on_request_body,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n, eos)
                )
            }
            StreamCallback::RequestTrailers => {
                let n = n(stream.request_trailers.len())?;
                call_export!(
                    self,
                    on_request_trailers,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n)
                )
            }
            StreamCallback::ResponseHeaders => {
                let n = n(stream.response_headers.len())?;
                call_export!(
                    self,
                    on_response_headers,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n, eos)
                )
            }
            StreamCallback::ResponseBody => {
                let n = n(stream.response_body.len())?;
                call_export!(
                    self,
                    on_response_body,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n, eos)
                )
            }
            StreamCallback::ResponseTrailers => {
                let n = n(stream.response_trailers.len())?;
                call_export!(
                    self,
                    on_response_trailers,
                    CallKind::Call,
                    ctx,
                    Some(stream),
                    (ctx, n)
                )
            }
            StreamCallback::Log => {
                return self
                    .on_log_and_delete(id, stream)
                    .map(|()| Action::Continue)
            }
            StreamCallback::Done => return Ok(Action::Continue),
        };
        match r {
            Some(r) => r.map(action),
            None if self.poisoned => Err(poisoned_error()),
            None => Ok(Action::Continue),
        }
    }

    /// `proxy_on_request_headers(id, headers, end_of_stream)`.
    pub fn on_request_headers(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::RequestHeaders, id, stream, end_of_stream)
    }

    /// `proxy_on_request_body(id, body_size, end_of_stream)`; the chunk is `stream.request_body`.
    pub fn on_request_body(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::RequestBody, id, stream, end_of_stream)
    }

    /// `proxy_on_request_trailers(id, trailers)`. (Added.)
    pub fn on_request_trailers(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::RequestTrailers, id, stream, true)
    }

    /// `proxy_on_response_headers(id, headers, end_of_stream)`.
    pub fn on_response_headers(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::ResponseHeaders, id, stream, end_of_stream)
    }

    /// `proxy_on_response_body(id, body_size, end_of_stream)`; the chunk is `stream.response_body`.
    pub fn on_response_body(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::ResponseBody, id, stream, end_of_stream)
    }

    /// `proxy_on_response_trailers(id, trailers)`. (Added.)
    pub fn on_response_trailers(
        &mut self,
        id: HttpId,
        stream: &mut Stream,
    ) -> Result<Action, Error> {
        self.on_stream(StreamCallback::ResponseTrailers, id, stream, true)
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

    fn log_and_delete(&mut self, id: HttpId, stream: &mut Stream) -> Result<(), Error> {
        let ctx = id.0;
        call_export!(self, on_log, CallKind::Call, ctx, Some(&mut *stream), ctx).transpose()?;
        call_export!(self, on_done, CallKind::Call, ctx, Some(&mut *stream), ctx).transpose()?;
        call_export!(self, on_delete, CallKind::Call, ctx, Some(stream), ctx).transpose()?;
        Ok(())
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

fn poisoned_error() -> Error {
    Error("the Vm trapped before and is poisoned: instantiate a new one".into())
}

fn len32(n: usize) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| Error(format!("size {n} does not fit the 32-bit ABI")))
}

/// Why a call failed, for the error log: the deadline, a refused growth, or wasmtime's trap.
fn trap_reason(
    store: &mut Store<abi::State>,
    deadline: std::time::Duration,
    e: &wasmtime::Error,
) -> String {
    if e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
        return format!(
            "deadline of {} ms exceeded (the guest was interrupted)",
            deadline.as_millis()
        );
    }
    let mut msg = Error::wasm("wasm trap", e).0;
    if let Some(refused) = store.data_mut().limiter.refused.take() {
        msg.push_str(" (");
        msg.push_str(&refused);
        msg.push(')');
    }
    msg
}

/// Runs one guest callback: loads `stream` into the store (or an empty one), sets the current
/// and effective context and the epoch deadline, calls, moves the stream back, and turns a trap
/// into `Err` naming the callback (poisoning the `Vm`).
fn enter<R>(
    store: &mut Store<abi::State>,
    poisoned: &mut bool,
    guest: &Guest,
    stream: Option<&mut Stream>,
    call: impl FnOnce(&mut Store<abi::State>) -> wasmtime::Result<R>,
) -> Result<R, Error> {
    if *poisoned {
        return Err(poisoned_error());
    }
    let data = store.data_mut();
    let Some(&root_index) = data.contexts.get(&guest.ctx) else {
        return Err(Error(format!("unknown context {}", guest.ctx)));
    };
    data.current = guest.ctx;
    data.effective = guest.ctx;
    data.root_index = root_index;
    let has_stream = stream.is_some();
    data.stream_loaded = has_stream;
    if !cfg!(feature = "unbounded-guests") {
        store.set_epoch_deadline(limits::ticks(guest.deadline));
    }
    let result = match stream {
        Some(stream) => {
            // Swapped with the store's empty scratch stream, and back: no stream is built or
            // dropped per callback.
            std::mem::swap(&mut store.data_mut().stream, stream);
            let result = call(&mut *store);
            let data = store.data_mut();
            std::mem::swap(&mut data.stream, stream);
            data.stream_loaded = false;
            result
        }
        None => {
            let result = call(&mut *store);
            // A root callback may have written into the scratch stream: drop it.
            store.data_mut().stream = Stream::default();
            result
        }
    };
    let data = store.data_mut();
    data.current = 0;
    data.effective = 0;
    result.map_err(|e| {
        *poisoned = true;
        store.data_mut().flush_stdio();
        let why = trap_reason(store, guest.deadline, &e);
        Error(format!("{}: {why}", guest.name))
    })
}
