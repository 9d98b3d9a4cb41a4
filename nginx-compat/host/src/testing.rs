//! [`MemoryHost`]: an in-memory [`Host`] for tests (of this crate and of others): captured
//! logs, shared data with ngx_wasm_module's CAS semantics, metrics, shared queues, recorded
//! HTTP and gRPC calls. Single-threaded (`RefCell`), like a worker.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};

use crate::deferred_headers::HeaderSource;
use crate::embedder::{GrpcCall, Host, HttpCall, LogLevel, MetricKind, Status};
use crate::header_map::HeaderMap;

/// A captured log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub plugin: String,
    pub message: String,
}

/// A metric as [`MemoryHost`] keeps it: counters and gauges hold their value, histograms the
/// last recorded value and the number of samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub name: String,
    pub kind: MetricKind,
    pub value: i64,
    pub samples: u64,
}

/// Shared data: key to (value, CAS token).
pub type SharedData = HashMap<Vec<u8>, (Vec<u8>, u32)>;

/// An in-memory [`Host`].
///
/// Shared data follows ngx_wasm_module: a new key is written whatever `cas` is and gets the
/// token 1; an existing key is written only when `cas` equals its current token (so a write
/// with `cas` 0 to an existing key is `CasMismatch`), and the token then increases (never 0).
/// A missing key is `NotFound`. Metric ids are 1-based indexes; defining a name again returns
/// its id. Queues: `register` creates (or finds) a queue by name, `resolve` finds it whatever
/// the vm id, `dequeue` of an empty queue is `Empty`. HTTP calls are recorded in `calls`; an
/// upstream not in `upstreams` (when that list is not empty) is `BadArgument`.
pub struct MemoryHost {
    pub logs: RefCell<Vec<LogLine>>,
    pub level: Cell<LogLevel>,
    pub shared: RefCell<SharedData>,
    pub metrics: RefCell<Vec<Metric>>,
    pub queues: RefCell<Vec<(String, VecDeque<Vec<u8>>)>>,
    pub calls: RefCell<Vec<HttpCall>>,
    /// gRPC calls dispatched, and the tokens cancelled.
    pub grpc_calls: RefCell<Vec<GrpcCall>>,
    pub grpc_cancelled: RefCell<Vec<u32>>,
    /// Known upstreams; empty accepts any.
    pub upstreams: RefCell<Vec<String>>,
    /// The embedding's read-only properties (`Host::property`), by `\0`-joined path.
    pub properties: RefCell<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl Default for MemoryHost {
    fn default() -> Self {
        MemoryHost {
            logs: RefCell::new(Vec::new()),
            level: Cell::new(LogLevel::Trace),
            shared: RefCell::new(HashMap::new()),
            metrics: RefCell::new(Vec::new()),
            queues: RefCell::new(Vec::new()),
            calls: RefCell::new(Vec::new()),
            grpc_calls: RefCell::new(Vec::new()),
            grpc_cancelled: RefCell::new(Vec::new()),
            upstreams: RefCell::new(Vec::new()),
            properties: RefCell::new(Vec::new()),
        }
    }
}

impl MemoryHost {
    pub fn new() -> MemoryHost {
        MemoryHost::default()
    }

    /// The value of the metric `name` (counters, gauges; the last sample of a histogram).
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .borrow()
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Names of the defined metrics, in definition order.
    pub fn metric_names(&self) -> Vec<String> {
        self.metrics
            .borrow()
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }

    /// True if a captured log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.logs
            .borrow()
            .iter()
            .any(|l| l.message.contains(needle))
    }

    /// The captured log lines as text, one per line (for assertion messages).
    pub fn log_text(&self) -> String {
        let mut out = String::new();
        for l in self.logs.borrow().iter() {
            out.push_str(&format!("[{:?}] {}: {}\n", l.level, l.plugin, l.message));
        }
        out
    }

    fn metric_index(id: u32) -> Option<usize> {
        usize::try_from(id.checked_sub(1)?).ok()
    }
}

impl Host for MemoryHost {
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.properties
            .borrow()
            .iter()
            .find(|(k, _)| k == path)
            .map(|(_, v)| v.clone())
    }
    fn log(&self, level: LogLevel, plugin_name: &str, message: &str) {
        self.logs.borrow_mut().push(LogLine {
            level,
            plugin: plugin_name.to_owned(),
            message: message.to_owned(),
        });
    }

    fn log_level(&self) -> LogLevel {
        self.level.get()
    }

    fn get_shared_data(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status> {
        let shared = self.shared.borrow();
        let (v, cas) = shared.get(key).ok_or(Status::NotFound)?;
        value.clear();
        value.extend_from_slice(v);
        Ok(*cas)
    }

    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        let mut shared = self.shared.borrow_mut();
        match shared.get_mut(key) {
            None => {
                shared.insert(key.to_vec(), (value.to_vec(), 1));
                Ok(())
            }
            Some((v, token)) => {
                if cas != *token {
                    return Err(Status::CasMismatch);
                }
                *v = value.to_vec();
                *token = token.checked_add(1).unwrap_or(1);
                Ok(())
            }
        }
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        let mut metrics = self.metrics.borrow_mut();
        let index = match metrics.iter().position(|m| m.name == name) {
            Some(i) => i,
            None => {
                metrics.push(Metric {
                    name: name.to_owned(),
                    kind,
                    value: 0,
                    samples: 0,
                });
                metrics.len().saturating_sub(1)
            }
        };
        u32::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(1))
            .ok_or(Status::InternalFailure)
    }

    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status> {
        let mut metrics = self.metrics.borrow_mut();
        let m = Self::metric_index(id)
            .and_then(|i| metrics.get_mut(i))
            .ok_or(Status::NotFound)?;
        if m.kind == MetricKind::Histogram {
            return Err(Status::BadArgument);
        }
        m.value = m.value.saturating_add(delta);
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status> {
        let mut metrics = self.metrics.borrow_mut();
        let m = Self::metric_index(id)
            .and_then(|i| metrics.get_mut(i))
            .ok_or(Status::NotFound)?;
        m.value = i64::try_from(value).unwrap_or(i64::MAX);
        m.samples = m.samples.saturating_add(1);
        Ok(())
    }

    fn get_metric(&self, id: u32) -> Result<u64, Status> {
        let metrics = self.metrics.borrow();
        let m = Self::metric_index(id)
            .and_then(|i| metrics.get(i))
            .ok_or(Status::NotFound)?;
        if m.kind == MetricKind::Histogram {
            return Err(Status::BadArgument);
        }
        Ok(u64::try_from(m.value).unwrap_or(0))
    }

    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> {
        let mut queues = self.queues.borrow_mut();
        let index = match queues.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                queues.push((name.to_owned(), VecDeque::new()));
                queues.len().saturating_sub(1)
            }
        };
        u32::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(1))
            .ok_or(Status::InternalFailure)
    }

    fn resolve_shared_queue(&self, _vm_id: &str, name: &str) -> Result<u32, Status> {
        let queues = self.queues.borrow();
        let index = queues
            .iter()
            .position(|(n, _)| n == name)
            .ok_or(Status::NotFound)?;
        u32::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(1))
            .ok_or(Status::InternalFailure)
    }

    fn enqueue_shared_queue(&self, id: u32, value: &[u8]) -> Result<(), Status> {
        let mut queues = self.queues.borrow_mut();
        let q = Self::metric_index(id)
            .and_then(|i| queues.get_mut(i))
            .ok_or(Status::NotFound)?;
        q.1.push_back(value.to_vec());
        Ok(())
    }

    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> {
        let mut queues = self.queues.borrow_mut();
        let q = Self::metric_index(id)
            .and_then(|i| queues.get_mut(i))
            .ok_or(Status::NotFound)?;
        q.1.pop_front().ok_or(Status::Empty)
    }

    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status> {
        let upstreams = self.upstreams.borrow();
        if !upstreams.is_empty() && !upstreams.contains(&call.upstream) {
            return Err(Status::BadArgument);
        }
        self.calls.borrow_mut().push(call);
        Ok(())
    }

    /// An upstream not in `upstreams` (when not empty) is `ParseFailure`, Envoy's status for
    /// an unknown cluster.
    fn dispatch_grpc_call(&self, call: GrpcCall) -> Result<(), Status> {
        let upstreams = self.upstreams.borrow();
        if !upstreams.is_empty() && !upstreams.contains(&call.upstream) {
            return Err(Status::ParseFailure);
        }
        self.grpc_calls.borrow_mut().push(call);
        Ok(())
    }

    fn cancel_grpc_call(&self, token: u32) {
        self.grpc_cancelled.borrow_mut().push(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_semantics() {
        let h = MemoryHost::new();
        let mut v = b"stale".to_vec();
        assert_eq!(h.get_shared_data(b"k", &mut v), Err(Status::NotFound));
        h.set_shared_data(b"k", b"v1", 0).unwrap();
        let cas = h.get_shared_data(b"k", &mut v).unwrap();
        assert_eq!((v.as_slice(), cas), (&b"v1"[..], 1));
        assert_eq!(h.set_shared_data(b"k", b"x", 0), Err(Status::CasMismatch));
        assert_eq!(h.set_shared_data(b"k", b"x", 7), Err(Status::CasMismatch));
        h.set_shared_data(b"k", b"v2", 1).unwrap();
        // The buffer is replaced, not appended to.
        let cas = h.get_shared_data(b"k", &mut v).unwrap();
        assert_eq!((v.as_slice(), cas), (&b"v2"[..], 2));
    }
}

/// Hand-written modules (WAT) for the host's unit tests (each ABI area tests its edges).
/// A [`HeaderSource`] over a built map, as an embedding's own header list would serve it
/// (names lower-case), counting how often the whole map was built.
pub struct MapSource {
    pub map: HeaderMap,
    /// Builds so far (shared, so that a test keeps a handle after the source moved).
    pub builds: std::rc::Rc<Cell<usize>>,
}

impl MapSource {
    /// A source over `map` with a fresh build counter.
    pub fn new(map: HeaderMap) -> MapSource {
        MapSource {
            map,
            builds: std::rc::Rc::default(),
        }
    }

    /// A stream whose request headers are this source, deferred (read in place, not built).
    pub fn deferred_request(self) -> crate::stream::Stream {
        crate::stream::Stream {
            request_headers_deferred: Some(crate::deferred_headers::DeferredMap::new(Box::new(
                self,
            ))),
            ..Default::default()
        }
    }
}

impl HeaderSource for MapSource {
    fn len(&self) -> usize {
        self.map.len()
    }
    fn first(&self, name: &[u8]) -> Option<&[u8]> {
        self.map
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
    fn count(&self, name: &[u8]) -> usize {
        self.map.iter().filter(|(k, _)| k == name).count()
    }
    fn bytes(&self) -> usize {
        crate::valid::map_bytes(&self.map)
    }
    fn build(&self) -> HeaderMap {
        self.builds.set(self.builds.get().saturating_add(1));
        self.map.clone()
    }
    fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (k, v) in &self.map {
            f(k, v);
        }
    }
    fn edits_applied(&mut self) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod wat_fixtures {
    use crate::{Engine, Module};

    /// A module with a bump allocator, the 0.2.x version export and `body` (more functions).
    pub(crate) fn wat(version: &str, imports: &str, body: &str) -> Vec<u8> {
        let text = format!(
            r#"(module
              {imports}
              (memory (export "memory") 1)
              (global $heap (mut i32) (i32.const 4096))
              (func (export "proxy_abi_version_{version}"))
              (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
                (local $p i32)
                (local.set $p (global.get $heap))
                (global.set $heap (i32.add (global.get $heap) (local.get $n)))
                (local.get $p))
              {body})"#
        );
        wat::parse_str(text).unwrap()
    }

    pub(crate) fn compile(bytes: &[u8]) -> Result<Module, crate::Error> {
        Engine::new().unwrap().compile(bytes)
    }

    pub(crate) const LOG: &str =
        r#"(import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))"#;
}
