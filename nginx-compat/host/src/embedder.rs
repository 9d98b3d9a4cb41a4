//! What the embedding provides to the host ([`Host`]: logging, shared data, metrics, shared
//! queues, HTTP calls) and the ABI's value types those calls carry.

use crate::header_map::HeaderMap;

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

/// A unary gRPC call dispatched with `proxy_grpc_call`; the embedding performs it without
/// blocking and later calls [`Vm::on_grpc_call_done`] with the same `token`, unless the filter
/// cancelled it first ([`Host::cancel_grpc_call`]). `upstream` is the name the filter gave (an
/// Envoy cluster name there; for nginx an `upstream {}` or `host:port`), `service` the fully
/// qualified service and `method` its method (the call is `POST /{service}/{method}`),
/// `initial_metadata` the request's extra headers (checked like header map writes),
/// `message` the serialized request (no length prefix), `timeout_ms` the deadline in
/// milliseconds (0: the embedding's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcCall {
    pub token: u32,
    pub upstream: String,
    pub service: String,
    pub method: String,
    pub initial_metadata: HeaderMap,
    pub message: Vec<u8>,
    pub timeout_ms: u32,
}

/// How a [`GrpcCall`] ended: `status` is the gRPC status (0 OK; Envoy's `InvalidCode` as
/// `u32::MAX`), `message` the `grpc-message` or the reason of a failure (what
/// `proxy_get_status` returns during `proxy_on_grpc_close`), `body` the reply message (read
/// only when `status` is 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcCallResult {
    pub status: u32,
    pub message: String,
    pub body: Vec<u8>,
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
    /// A read-only property the embedding answers itself, in every context (root contexts,
    /// `on_configure` included, and HTTP contexts): `path` as the ABI passes it (segments
    /// joined by `\0`). `proxy_get_property` asks after the properties filters set and the
    /// host's builtins, before the stream's [`crate::PropertySource`]; `proxy_set_property` of
    /// a path answered here is refused with `BadArgument` (read-only). Called on every property
    /// read and write: an implementation rejects foreign paths with a cheap prefix test.
    /// Default: none.
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        let _ = path;
        None
    }
    /// `proxy_get_shared_data`: the key's value, written into `value` (cleared first: the host
    /// core passes one buffer, reused from call to call, so a read allocates nothing once it
    /// has grown), and its CAS token; `Err(NotFound)` for a missing key.
    fn get_shared_data(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status>;
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
    /// Start a unary gRPC call. Errors as Envoy's `Context::grpcCall`
    /// (source/extensions/common/wasm/context.cc): `ParseFailure` for an unknown upstream,
    /// `InternalFailure` when the call cannot start (the only statuses the Rust SDK's
    /// `dispatch_grpc_call` accepts besides `Ok`; any other makes it panic).
    fn dispatch_grpc_call(&self, call: GrpcCall) -> Result<(), Status> {
        let _ = call;
        Err(Status::InternalFailure)
    }
    /// `proxy_grpc_cancel` / `proxy_grpc_close` of a pending unary call: drop the call, which
    /// must then never complete.
    fn cancel_grpc_call(&self, token: u32) {
        let _ = token;
    }
}
