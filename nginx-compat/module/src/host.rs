//! `tollgate_host::Host` implementations: what a `Vm` gets from nginx.
//!
//! - [`WorkerHost`]: one per worker, shared by its `Vm`s: logging to the cycle's error log,
//!   shared data, metrics, and HTTP calls queued for the worker's poll timer.
//! - [`VmHost`]: the per-`Vm` view of it (it tags HTTP calls with the `Vm` that made them,
//!   since call tokens are per `Vm`).
//! - [`ConfHost`]: used at configuration time in the master (validation instances): logs to
//!   the configuration's log so a filter's refusal appears in `nginx -t`; no shared state.
//!
//! Shared data and metrics are `tollgate-services`' shared-memory zones (CAS, per-worker
//! metric slices); HTTP calls its `CallRunner`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use ngx::ffi::ngx_log_t;
use tollgate_host::{HttpCall, LogLevel, MetricKind, Status};
use tollgate_services::http::{CallRunner, DispatchError, HttpRequest, RunnerConfig};
use tollgate_services::kv::{KvError, ZoneSet};
use tollgate_services::metrics::{MetricsError, MetricsZone};

use crate::util::{level, log};

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

/// What an HTTP call's completion is delivered to: the `Vm` slot (and generation) that made
/// it, and its token there.
#[derive(Debug, Clone, Copy)]
pub struct CallTag {
    /// Index of the `Vm` slot in the worker (see `worker.rs`); `usize::MAX` for an instance
    /// owned by a request (isolation `stream`/`filter`).
    pub vm_slot: usize,
    /// Generation of that `Vm` (a replaced `Vm` does not get the answer).
    pub generation: u32,
    /// The call's token in that `Vm`.
    pub token: u32,
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

fn services_kind(k: MetricKind) -> tollgate_services::metrics::MetricKind {
    match k {
        MetricKind::Counter => tollgate_services::metrics::MetricKind::Counter,
        MetricKind::Gauge => tollgate_services::metrics::MetricKind::Gauge,
        MetricKind::Histogram => tollgate_services::metrics::MetricKind::Histogram,
    }
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
    /// HTTP calls in flight.
    pub runner: RefCell<CallRunner<CallTag>>,
    // Configuration-time stores (validation instances in the master have no zones).
    local: RefCell<LocalStore>,
    local_metrics: RefCell<Vec<Metric>>,
}

impl WorkerHost {
    /// A host logging to `log`, with the cycle's zones (none at configuration time).
    pub fn new(
        log: *mut ngx_log_t,
        zones: Option<ZoneSet>,
        metrics: Option<MetricsZone>,
    ) -> WorkerHost {
        WorkerHost {
            log: Cell::new(log as usize),
            zones,
            metrics,
            runner: RefCell::new(CallRunner::new(RunnerConfig::default())),
            local: RefCell::new(HashMap::new()),
            local_metrics: RefCell::new(Vec::new()),
        }
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

    fn get_shared(&self, key: &[u8]) -> Result<(Vec<u8>, u32), Status> {
        if let Some(z) = &self.zones {
            return z.get(key).map_err(|e| kv_status(e, false));
        }
        let m = self
            .local
            .try_borrow()
            .map_err(|_| Status::InternalFailure)?;
        m.get(key).cloned().ok_or(Status::NotFound)
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

    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        if let Some(z) = &self.metrics {
            return z.define(services_kind(kind), name).map_err(metrics_status);
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

    fn dispatch(&self, tag: CallTag, call: HttpCall) -> Result<(), Status> {
        let addr = crate::calls::resolve_upstream(&call.upstream).ok_or(Status::BadArgument)?;
        let req = HttpRequest {
            headers: call.headers,
            body: call.body,
            timeout: std::time::Duration::from_millis(u64::from(call.timeout_ms.max(1))),
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

/// The `Host` a `Vm` of a worker sees.
pub struct VmHost {
    /// The worker's services.
    pub worker: Rc<WorkerHost>,
    /// The `Vm` slot this host belongs to.
    pub vm_slot: usize,
    /// Its generation.
    pub generation: u32,
}

impl tollgate_host::Host for VmHost {
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str) {
        self.worker.log_line(level, plugin_name, message);
    }
    fn log_level(&self) -> LogLevel {
        wasm_level(self.worker.log_ptr())
    }
    fn get_shared_data(&self, key: &[u8]) -> Result<(Vec<u8>, u32), Status> {
        self.worker.get_shared(key)
    }
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        self.worker.set_shared(key, value, cas)
    }
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        self.worker.define(kind, name)
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
    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status> {
        if self.vm_slot == usize::MAX {
            // Per-request instances (isolation stream/filter) cannot receive answers.
            return Err(Status::Unimplemented);
        }
        let tag = CallTag {
            vm_slot: self.vm_slot,
            generation: self.generation,
            token: call.token,
        };
        self.worker.dispatch(tag, call)
    }
}

/// The host of the validation instances created in the master at configuration time.
pub struct ConfHost {
    /// The configuration's log (`cf->log`): messages show in `nginx -t`.
    pub log: *mut ngx_log_t,
    inner: WorkerHost,
}

impl ConfHost {
    /// A host logging to `log`.
    pub fn new(log: *mut ngx_log_t) -> ConfHost {
        ConfHost {
            log,
            inner: WorkerHost::new(log, None, None),
        }
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
    fn get_shared_data(&self, key: &[u8]) -> Result<(Vec<u8>, u32), Status> {
        self.inner.get_shared(key)
    }
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        self.inner.set_shared(key, value, cas)
    }
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        self.inner.define(kind, name)
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
    fn dispatch_http_call(&self, _call: HttpCall) -> Result<(), Status> {
        // No calls from validation instances (they are dropped right away).
        Ok(())
    }
}
