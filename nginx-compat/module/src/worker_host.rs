//! `tollgate_host::Host` implementations: what a `Vm` gets from nginx.
//!
//! - [`WorkerHost`]: one per worker, shared by its `Vm`s: logging to the cycle's error log,
//!   shared data, metrics, and HTTP and unary gRPC calls run on background threads, whose
//!   completions wake the worker through its eventfd (`wake.rs`).
//! - [`VmHost`]: the per-`Vm` view of it (it tags HTTP calls with the `Vm` that made them,
//!   since call tokens are per `Vm`).
//! - [`ConfHost`]: used at configuration time in the master (validation instances): logs to
//!   the configuration's log so a filter's refusal appears in `nginx -t`; no shared state.
//!
//! Shared data and metrics are `tollgate-services`' shared-memory zones (CAS, per-worker
//! metric slices); shared queues its `shm_queue` zones; HTTP calls its `CallRunner`.
//!
//! # Shared queues
//! - A queue is an `shm_queue NAME SIZE;` zone; its id is its position among those directives
//!   (from 1), the same in every worker. `proxy_register_shared_queue(NAME)` of an undeclared
//!   name is `NotFound` (logged, naming the directive to add), as in ngx_wasm_module.
//! - `proxy_resolve_shared_queue(vm_id, NAME)` finds a queue some worker registered from the
//!   module named `vm_id` (a `module` of `wasm {}` is this host's VM; the last registration wins,
//!   as in Envoy); otherwise `NotFound`.
//! - `proxy_enqueue_shared_queue`: a full queue drops its oldest messages to make room (logged
//!   with the count); a message larger than the queue is `BadArgument`.
//! - `proxy_on_queue_ready`: every worker in which a root context registered a queue polls the
//!   queue's sequence number from its poll timer (every [`QUEUE_POLL_MS`]) and, when messages
//!   arrived, calls `on_queue_ready` of the registering root once per new message, stopping as
//!   soon as the queue is empty. Envoy notifies only the last registrant; here every registering
//!   worker is woken and the messages go to whichever dequeues first (each exactly once).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use ngx::ffi::{ngx_http_request_t, ngx_log_t};
use tollgate_host::{GrpcCall, HttpCall, LogLevel, MetricKind, Status};
use tollgate_services::grpc_client::{
    CallId, GrpcConfig, GrpcDispatchError, GrpcRequest, GrpcRunner,
};
use tollgate_services::http_client::{CallRunner, DispatchError, HttpRequest, RunnerConfig};
use tollgate_services::kv::{KvError, ZoneSet};
use tollgate_services::metrics_zone::{MetricsError, MetricsZone};
use tollgate_services::queue::{QueueError, QueueZone};

use crate::conf::CallDefaults;
use crate::util::{level, log};
use crate::zone_props::ZoneEvictions;

/// nginx level for a proxy-wasm level.
pub fn ngx_level(l: LogLevel) -> ngx::ffi::ngx_uint_t {
    match l {
        LogLevel::Trace | LogLevel::Debug => level::DEBUG,
        LogLevel::Info => level::INFO,
        LogLevel::Warn => level::WARN,
        LogLevel::Error => level::ERR,
        LogLevel::Critical => level::CRIT,
    }
}

/// The proxy-wasm level matching an nginx log's threshold.
pub(crate) fn wasm_level(log: *mut ngx_log_t) -> LogLevel {
    if log.is_null() {
        return LogLevel::Info;
    }
    // SAFETY: a live nginx log.
    let l = unsafe { (*log).log_level };
    match l {
        x if x >= level::DEBUG => LogLevel::Debug,
        x if x >= level::INFO => LogLevel::Info,
        x if x >= level::WARN => LogLevel::Warn,
        x if x >= level::ERR => LogLevel::Error,
        _ => LogLevel::Critical,
    }
}

/// One metric of the configuration-time store (validation instances only).
#[derive(Debug, Clone)]
pub struct Metric {
    /// Name as defined by the filter.
    pub name: String,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
}

/// Restores the previously running request when dropped (see [`WorkerHost::enter_request`]).
pub struct CurrentRequest<'a> {
    host: &'a WorkerHost,
    previous: *mut ngx_http_request_t,
}

impl Drop for CurrentRequest<'_> {
    fn drop(&mut self) {
        self.host.current.set(self.previous);
    }
}

/// What an HTTP call's completion is delivered to: the `Vm` slot (and generation) that made
/// it, and its token there.
#[derive(Debug, Clone, Default)]
pub struct CallTag {
    /// Index of the `Vm` slot in the worker (see `worker.rs`); `usize::MAX` for an instance
    /// owned by a request (isolation `stream`/`filter`).
    pub vm_slot: usize,
    /// Generation of that `Vm` (a replaced `Vm` does not get the answer).
    pub generation: u32,
    /// The call's token in that `Vm`.
    pub token: u32,
    /// The `upstream` the filter gave (for the log line of a failed call).
    pub upstream: String,
    /// `proxy_wasm_log_dispatch_errors` where the call was made: log a failure at `error`.
    pub log_errors: bool,
}

fn kv_status(e: KvError, set: bool) -> Status {
    match e {
        KvError::NotFound => Status::NotFound,
        KvError::CasMismatch => Status::CasMismatch,
        KvError::TooLarge => Status::BadArgument,
        KvError::NoZone if set => Status::BadArgument,
        KvError::NoZone => Status::NotFound,
        KvError::NoSpace | KvError::Corrupt => Status::InternalFailure,
    }
}

fn metrics_status(e: MetricsError) -> Status {
    match e {
        MetricsError::NotFound => Status::NotFound,
        MetricsError::BadArgument => Status::BadArgument,
        MetricsError::NoSpace | MetricsError::Corrupt => Status::InternalFailure,
    }
}

fn services_kind(k: MetricKind) -> tollgate_services::metrics_zone::MetricKind {
    match k {
        MetricKind::Counter => tollgate_services::metrics_zone::MetricKind::Counter,
        MetricKind::Gauge => tollgate_services::metrics_zone::MetricKind::Gauge,
        MetricKind::Histogram => tollgate_services::metrics_zone::MetricKind::Histogram,
    }
}

/// How often a worker with registered shared queues checks them for new messages
/// (milliseconds): the longest delay before `proxy_on_queue_ready` in another worker.
pub const QUEUE_POLL_MS: usize = 10;

/// Most `on_queue_ready` calls for one queue in one poll (the rest wait for the next poll).
pub const QUEUE_READY_BURST: u64 = 1024;

/// A shared queue registered in this worker: its id and the sequence number already seen.
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    /// The queue id (1-based index into the worker's queues).
    pub id: u32,
    /// `QueueZone::sequence` when this worker last looked.
    pub seen: u64,
}

fn queue_index(id: u32) -> Option<usize> {
    usize::try_from(id).ok()?.checked_sub(1)
}

/// Why a filter cannot register the queue `name`, with the directive that would declare it.
fn undeclared_queue(name: &str) -> String {
    format!("shared queue \"{name}\" is not declared: add `shm_queue {name} SIZE;` to wasm {{}}")
}

/// The id of the queue `name` among `names` (declaration order, from 1).
fn queue_id<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> Option<u32> {
    names
        .enumerate()
        .find(|(_, n)| *n == name)
        .and_then(|(i, _)| u32::try_from(i.checked_add(1)?).ok())
}

/// How this worker's `dispatch_http_call`s are made (ngx_wasm_module's socket, resolver and
/// log directives; `kong_directives/call_defaults.rs`).
#[derive(Debug, Clone, Default)]
pub struct CallConf {
    /// The defaults of calls made by root contexts (the `wasm{}` directives).
    pub root: CallDefaults,
    /// `resolver_add IP HOST` of every level: host names a call's `host:port` maps to
    /// addresses before any DNS.
    pub hosts: Vec<(String, std::net::IpAddr)>,
}

/// Shared data of the configuration-time instances: value and CAS token by key.
type LocalStore = HashMap<Vec<u8>, (Vec<u8>, u32)>;

/// Per-worker services: `shm_kv` zones (shared data), the metrics zone (this worker's slice),
/// and the HTTP call runner (background threads, completions polled by the worker's timer).
pub struct WorkerHost {
    /// The error log to write to (the cycle's).
    pub log: Cell<usize>,
    zones: Option<ZoneSet>,
    metrics: Option<MetricsZone>,
    /// `shm_queue` zones: queue id `i + 1` is `queues[i]`.
    queues: Vec<QueueZone>,
    /// Queues a root context of this worker registered (polled for `on_queue_ready`).
    pub registered: RefCell<Vec<Registered>>,
    /// HTTP calls in flight.
    pub runner: RefCell<CallRunner<CallTag>>,
    /// Unary gRPC calls in flight.
    pub grpc: RefCell<GrpcRunner<CallTag>>,
    /// The runner's id of each pending gRPC call, by (`Vm` slot, generation, token): for
    /// `proxy_grpc_cancel`.
    pub grpc_ids: RefCell<rustc_hash::FxHashMap<(usize, u32, u32), CallId>>,
    /// How calls are made.
    calls: CallConf,
    /// The `shm_kv` zones' eviction policies (`tollgate.shared_data.eviction.<KEY>`).
    evictions: ZoneEvictions,
    /// `tollgate.http.plain_header_names` (`header_names.rs`).
    plain_header_names: bool,
    /// The request whose filter callback is running (null: a root context's), whose
    /// location's directives a call made now takes (`enter_request`).
    current: Cell<*mut ngx_http_request_t>,
    // Configuration-time stores (validation instances in the master have no zones).
    local: RefCell<LocalStore>,
    local_metrics: RefCell<Vec<Metric>>,
    /// The metrics zone refused a definition for lack of space in this worker (logged once;
    /// every refusal is counted in the zone's overflow counter).
    metrics_full_logged: Cell<bool>,
}

impl WorkerHost {
    /// A host logging to `log`, with the cycle's zones (none at configuration time).
    pub fn new(
        log: *mut ngx_log_t,
        zones: Option<ZoneSet>,
        metrics: Option<MetricsZone>,
        queues: Vec<QueueZone>,
    ) -> WorkerHost {
        WorkerHost {
            log: Cell::new(log as usize),
            zones,
            metrics,
            queues,
            registered: RefCell::new(Vec::new()),
            runner: RefCell::new(CallRunner::new(RunnerConfig::default())),
            grpc: RefCell::new(GrpcRunner::new(GrpcConfig::default())),
            grpc_ids: RefCell::new(rustc_hash::FxHashMap::default()),
            calls: CallConf::default(),
            evictions: ZoneEvictions::default(),
            plain_header_names: false,
            current: Cell::new(std::ptr::null_mut()),
            local: RefCell::new(HashMap::new()),
            local_metrics: RefCell::new(Vec::new()),
            metrics_full_logged: Cell::new(false),
        }
    }

    /// This host with `calls` as the configuration of its HTTP calls.
    pub fn with_calls(self, calls: CallConf) -> WorkerHost {
        WorkerHost { calls, ..self }
    }

    /// This host with `evictions` as the `shm_kv` zones' eviction policies.
    pub fn with_evictions(self, evictions: ZoneEvictions) -> WorkerHost {
        WorkerHost { evictions, ..self }
    }

    /// This host answering `plain` to `tollgate.http.plain_header_names`.
    pub fn with_plain_header_names(self, plain: bool) -> WorkerHost {
        WorkerHost {
            plain_header_names: plain,
            ..self
        }
    }

    /// The host's own read-only properties (`tollgate_host::Host::property`):
    /// `tollgate.shared_data.eviction.<KEY>` (`zone_props.rs`) and
    /// `tollgate.http.plain_header_names` (`header_names.rs`).
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        // Both start with `tollgate`: most paths asked (the filters' `wasmx.*` signals,
        // `request.*`, `response.*`) differ in their first byte.
        if path.first() != Some(&b't') {
            return None;
        }
        if let Some(p) = self.evictions.property(path) {
            return Some(p.as_bytes().to_vec());
        }
        crate::header_names::property(path, self.plain_header_names).map(<[u8]>::to_vec)
    }

    /// Marks `r` as the request whose callbacks run until the returned guard drops: calls
    /// dispatched meanwhile take the directives of its location.
    pub fn enter_request(&self, r: *mut ngx_http_request_t) -> CurrentRequest<'_> {
        let previous = self.current.replace(r);
        CurrentRequest {
            host: self,
            previous,
        }
    }

    /// The defaults of a call dispatched now: the running request's location's, else the
    /// root contexts'.
    fn call_defaults(&self) -> CallDefaults {
        let r = self.current.get();
        if r.is_null() {
            return self.calls.root;
        }
        // SAFETY: `current` is set only while a callback of that live request runs.
        let lcf = unsafe { crate::base::loc_conf(r) };
        // SAFETY: the worker's cycle is live.
        let kong = unsafe { crate::kong_directives::kong_core::kong_conf(nginx_sys::ngx_cycle) };
        match (lcf, kong) {
            (Some(lcf), Some(kong)) => kong.request_calls(lcf),
            _ => self.calls.root,
        }
    }

    /// The queue with id `id`.
    pub fn queue(&self, id: u32) -> Option<&QueueZone> {
        self.queues.get(queue_index(id)?)
    }

    fn register_queue(&self, vm_id: &str, plugin: &str, name: &str) -> Result<u32, Status> {
        let id = queue_id(name, self.queues.iter().map(QueueZone::name))
            .ok_or_else(|| self.no_queue(plugin, name))?;
        let q = self.queue(id).ok_or(Status::NotFound)?;
        q.register(vm_id).map_err(|_| Status::BadArgument)?;
        let mut reg = self
            .registered
            .try_borrow_mut()
            .map_err(|_| Status::InternalFailure)?;
        if !reg.iter().any(|r| r.id == id) {
            reg.push(Registered {
                id,
                seen: q.sequence(),
            });
        }
        Ok(id)
    }

    fn no_queue(&self, plugin: &str, name: &str) -> Status {
        self.log_line(LogLevel::Error, plugin, &undeclared_queue(name));
        Status::NotFound
    }

    fn resolve_queue(&self, vm_id: &str, name: &str) -> Result<u32, Status> {
        let id = queue_id(name, self.queues.iter().map(QueueZone::name)).ok_or(Status::NotFound)?;
        match self.queue(id).and_then(QueueZone::registered_by) {
            Some(owner) if owner == vm_id => Ok(id),
            _ => Err(Status::NotFound),
        }
    }

    fn enqueue(&self, plugin: &str, id: u32, value: &[u8]) -> Result<(), Status> {
        let q = self.queue(id).ok_or(Status::NotFound)?;
        match q.enqueue(value) {
            Ok(0) => Ok(()),
            Ok(dropped) => {
                self.log_line(
                    LogLevel::Warn,
                    plugin,
                    &format!(
                        "shared queue \"{}\" is full: dropped its {dropped} oldest message(s)",
                        q.name()
                    ),
                );
                Ok(())
            }
            Err(e) => {
                self.log_line(
                    LogLevel::Error,
                    plugin,
                    &format!("shared queue \"{}\": enqueue: {e}", q.name()),
                );
                Err(match e {
                    QueueError::TooLarge { .. } => Status::BadArgument,
                    QueueError::Empty | QueueError::Corrupt => Status::InternalFailure,
                })
            }
        }
    }

    fn dequeue(&self, id: u32) -> Result<Vec<u8>, Status> {
        let q = self.queue(id).ok_or(Status::NotFound)?;
        q.dequeue().map_err(|e| match e {
            QueueError::Empty => Status::Empty,
            QueueError::TooLarge { .. } | QueueError::Corrupt => Status::InternalFailure,
        })
    }

    fn log_ptr(&self) -> *mut ngx_log_t {
        self.log.get() as *mut ngx_log_t
    }

    fn log_line(&self, l: LogLevel, plugin: &str, message: &str) {
        log(
            ngx_level(l),
            self.log_ptr(),
            &format!("[tollgate] {plugin}: {message}"),
        );
    }

    fn get_shared(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status> {
        if let Some(z) = &self.zones {
            return z.get_into(key, value).map_err(|e| kv_status(e, false));
        }
        let m = self
            .local
            .try_borrow()
            .map_err(|_| Status::InternalFailure)?;
        let (v, cas) = m.get(key).ok_or(Status::NotFound)?;
        value.clear();
        value.extend_from_slice(v);
        Ok(*cas)
    }

    /// CAS semantics: ngx_wasm_module's, as this host speaks its directives: the write succeeds
    /// only when `cas` equals the key's current token, 0 standing for "no such key" (so `cas` 0
    /// on an existing key is a mismatch, where Envoy's proxy-wasm-cpp-host overwrites). The
    /// filters in plugins/ are correct under both (their e2e suites run on both hosts).
    fn set_shared(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        if let Some(z) = &self.zones {
            return z.set(key, value, cas).map_err(|e| kv_status(e, true));
        }
        let mut m = self
            .local
            .try_borrow_mut()
            .map_err(|_| Status::InternalFailure)?;
        let next = match m.get(key) {
            Some((_, token)) if cas != *token => return Err(Status::CasMismatch),
            Some((_, token)) => token.wrapping_add(1).max(1),
            None if cas != 0 => return Err(Status::CasMismatch),
            None => 1,
        };
        m.insert(key.to_vec(), (value.to_vec(), next));
        Ok(())
    }

    fn define(&self, kind: MetricKind, name: &str, plugin: &str) -> Result<u32, Status> {
        if let Some(z) = &self.metrics {
            let r = z.define(services_kind(kind), name);
            if r == Err(MetricsError::NoSpace) && !self.metrics_full_logged.replace(true) {
                let (defined, _) = z.usage();
                self.log_line(
                    LogLevel::Warn,
                    plugin,
                    &format!(
                        "the metrics zone is full ({defined} metrics): the definition of \"{name}\" \
                         is refused (InternalFailure) and the filter carries on without it; later \
                         refusals are not logged, they are counted in tollgate_metrics_overflow_total"
                    ),
                );
            }
            return r.map_err(metrics_status);
        }
        let mut m = self
            .local_metrics
            .try_borrow_mut()
            .map_err(|_| Status::InternalFailure)?;
        if let Some(i) = m.iter().position(|x| x.name == name) {
            return u32::try_from(i).map_err(|_| Status::InternalFailure);
        }
        m.push(Metric {
            name: name.to_owned(),
            kind,
        });
        u32::try_from(m.len().saturating_sub(1)).map_err(|_| Status::InternalFailure)
    }

    fn increment(&self, id: u32, delta: i64) -> Result<(), Status> {
        match &self.metrics {
            Some(z) => z.increment(id, delta).map_err(metrics_status),
            None => Ok(()),
        }
    }

    fn record(&self, id: u32, value: u64) -> Result<(), Status> {
        match &self.metrics {
            Some(z) => z.record(id, value).map_err(metrics_status),
            None => Ok(()),
        }
    }

    fn get(&self, id: u32) -> Result<u64, Status> {
        match &self.metrics {
            Some(z) => z.get(id).map_err(metrics_status),
            None => Ok(0),
        }
    }

    fn dispatch(&self, mut tag: CallTag, call: HttpCall) -> Result<(), Status> {
        let addr = crate::upstreams::resolve_upstream(&call.upstream).ok_or(Status::BadArgument)?;
        let addr = crate::upstreams::static_host(&addr, &self.calls.hosts);
        let defaults = self.call_defaults();
        let (timeout, steps) = defaults.timeouts(call.timeout_ms);
        tag.log_errors = defaults.log_errors;
        tag.upstream = call.upstream;
        let req = HttpRequest {
            headers: call.headers,
            body: call.body,
            timeout,
            steps: Some(steps),
        };
        let mut runner = self
            .runner
            .try_borrow_mut()
            .map_err(|_| Status::InternalFailure)?;
        runner.dispatch(tag, &addr, &req).map_err(|e| match e {
            DispatchError::MissingPseudoHeader(_) | DispatchError::InvalidHeader => {
                Status::BadArgument
            }
            DispatchError::TooManyPending | DispatchError::Spawn(_) => Status::InternalFailure,
        })
    }
}

impl WorkerHost {
    /// Starts a unary gRPC call to `call.upstream` (an `upstream {}` block, its first server,
    /// or `host:port`, as HTTP calls; `resolver_add` hosts apply): `ParseFailure` for an
    /// unknown upstream (Envoy's status for an unknown cluster), `InternalFailure` when the
    /// call cannot start, `BadArgument` for names or metadata HTTP/2 cannot carry.
    fn dispatch_grpc(&self, mut tag: CallTag, call: GrpcCall) -> Result<(), Status> {
        let addr =
            crate::upstreams::resolve_upstream(&call.upstream).ok_or(Status::ParseFailure)?;
        let addr = crate::upstreams::static_host(&addr, &self.calls.hosts);
        tag.log_errors = self.call_defaults().log_errors;
        let key = (tag.vm_slot, tag.generation, call.token);
        let request = GrpcRequest {
            authority: call.upstream.clone(),
            service: call.service,
            method: call.method,
            metadata: call.initial_metadata,
            message: call.message,
            timeout: std::time::Duration::from_millis(u64::from(call.timeout_ms)),
        };
        tag.upstream = call.upstream;
        let mut grpc = self
            .grpc
            .try_borrow_mut()
            .map_err(|_| Status::InternalFailure)?;
        let id = grpc.dispatch(tag, &addr, &request).map_err(|e| match e {
            GrpcDispatchError::InvalidName | GrpcDispatchError::InvalidMetadata => {
                Status::BadArgument
            }
            GrpcDispatchError::TooManyPending | GrpcDispatchError::Spawn(_) => {
                Status::InternalFailure
            }
        })?;
        if let Ok(mut ids) = self.grpc_ids.try_borrow_mut() {
            ids.insert(key, id);
        }
        Ok(())
    }

    /// Drops the pending gRPC call `token` of `Vm` slot `vm_slot` (generation `generation`).
    fn cancel_grpc(&self, vm_slot: usize, generation: u32, token: u32) {
        let id = self
            .grpc_ids
            .try_borrow_mut()
            .ok()
            .and_then(|mut ids| ids.remove(&(vm_slot, generation, token)));
        if let (Some(id), Ok(mut grpc)) = (id, self.grpc.try_borrow_mut()) {
            grpc.cancel(id);
        }
    }
}

/// The `Host` a `Vm` of a worker sees.
pub struct VmHost {
    /// The worker's services.
    pub worker: Rc<WorkerHost>,
    /// The `Vm` slot this host belongs to.
    pub vm_slot: usize,
    /// Its generation.
    pub generation: u32,
    /// The VM id: the name of the module in `wasm {}` (for shared queues).
    pub vm_id: String,
}

impl tollgate_host::Host for VmHost {
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str) {
        self.worker.log_line(level, plugin_name, message);
    }
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.worker.property(path)
    }
    fn log_level(&self) -> LogLevel {
        wasm_level(self.worker.log_ptr())
    }
    fn get_shared_data(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status> {
        self.worker.get_shared(key, value)
    }
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        self.worker.set_shared(key, value, cas)
    }
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        self.worker.define(kind, name, &self.vm_id)
    }
    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status> {
        self.worker.increment(id, delta)
    }
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status> {
        self.worker.record(id, value)
    }
    fn get_metric(&self, id: u32) -> Result<u64, Status> {
        self.worker.get(id)
    }
    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> {
        self.worker.register_queue(&self.vm_id, &self.vm_id, name)
    }
    fn resolve_shared_queue(&self, vm_id: &str, name: &str) -> Result<u32, Status> {
        self.worker.resolve_queue(vm_id, name)
    }
    fn enqueue_shared_queue(&self, id: u32, value: &[u8]) -> Result<(), Status> {
        self.worker.enqueue(&self.vm_id, id, value)
    }
    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> {
        self.worker.dequeue(id)
    }
    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status> {
        if self.vm_slot == usize::MAX {
            // Per-request instances (isolation stream/filter) cannot receive answers.
            return Err(Status::Unimplemented);
        }
        let tag = CallTag {
            vm_slot: self.vm_slot,
            generation: self.generation,
            token: call.token,
            ..CallTag::default()
        };
        self.worker.dispatch(tag, call)
    }
    fn dispatch_grpc_call(&self, call: GrpcCall) -> Result<(), Status> {
        if self.vm_slot == usize::MAX {
            // Per-request instances (isolation stream/filter) cannot receive answers.
            return Err(Status::InternalFailure);
        }
        let tag = CallTag {
            vm_slot: self.vm_slot,
            generation: self.generation,
            token: call.token,
            ..CallTag::default()
        };
        self.worker.dispatch_grpc(tag, call)
    }
    fn cancel_grpc_call(&self, token: u32) {
        self.worker
            .cancel_grpc(self.vm_slot, self.generation, token);
    }
}

/// The host of the validation instances created in the master at configuration time.
pub struct ConfHost {
    /// The configuration's log (`cf->log`): messages show in `nginx -t`.
    pub log: *mut ngx_log_t,
    inner: WorkerHost,
    /// The declared `shm_queue` names (their zones do not exist yet).
    queues: Vec<String>,
}

impl ConfHost {
    /// A host logging to `log`; `queues`: the names of the declared `shm_queue` zones (a
    /// filter registering another queue fails its configuration, as it would in a worker);
    /// `evictions`: the declared `shm_kv` zones' eviction policies (their zones do not exist
    /// yet; `tollgate.shared_data.eviction.<KEY>` answers from the declarations, as in a worker).
    /// `plain_header_names`: `tollgate.http.plain_header_names`, as in a worker.
    pub fn new(
        log: *mut ngx_log_t,
        queues: Vec<String>,
        evictions: ZoneEvictions,
        plain_header_names: bool,
    ) -> ConfHost {
        ConfHost {
            log,
            inner: WorkerHost::new(log, None, None, Vec::new())
                .with_evictions(evictions)
                .with_plain_header_names(plain_header_names),
            queues,
        }
    }

    fn declared(&self, id: u32) -> Result<(), Status> {
        queue_index(id)
            .filter(|i| *i < self.queues.len())
            .map(|_| ())
            .ok_or(Status::NotFound)
    }
}

impl tollgate_host::Host for ConfHost {
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str) {
        // Errors at configuration time are the reason `nginx -t` fails: log them as such.
        let lvl = if matches!(level, LogLevel::Error | LogLevel::Critical) {
            crate::util::level::EMERG
        } else {
            ngx_level(level)
        };
        log(
            lvl,
            self.log,
            &format!("[tollgate] {plugin_name}: {message}"),
        );
    }
    fn log_level(&self) -> LogLevel {
        wasm_level(self.log)
    }
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.inner.property(path)
    }
    fn get_shared_data(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status> {
        self.inner.get_shared(key, value)
    }
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        self.inner.set_shared(key, value, cas)
    }
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        self.inner.define(kind, name, "")
    }
    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status> {
        self.inner.increment(id, delta)
    }
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status> {
        self.inner.record(id, value)
    }
    fn get_metric(&self, id: u32) -> Result<u64, Status> {
        self.inner.get(id)
    }
    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> {
        queue_id(name, self.queues.iter().map(String::as_str)).ok_or_else(|| {
            log(
                crate::util::level::EMERG,
                self.log,
                &format!("[tollgate] {}", undeclared_queue(name)),
            );
            Status::NotFound
        })
    }
    /// At configuration time nothing is registered yet: any declared queue resolves.
    fn resolve_shared_queue(&self, _vm_id: &str, name: &str) -> Result<u32, Status> {
        queue_id(name, self.queues.iter().map(String::as_str)).ok_or(Status::NotFound)
    }
    /// Accepted and discarded (validation instances are dropped right after `on_configure`).
    fn enqueue_shared_queue(&self, id: u32, _value: &[u8]) -> Result<(), Status> {
        self.declared(id)
    }
    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> {
        self.declared(id).and(Err(Status::Empty))
    }
    fn dispatch_http_call(&self, _call: HttpCall) -> Result<(), Status> {
        // No calls from validation instances (they are dropped right away).
        Ok(())
    }
    fn dispatch_grpc_call(&self, _call: GrpcCall) -> Result<(), Status> {
        // Likewise.
        Ok(())
    }
}
