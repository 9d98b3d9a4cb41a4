//! Test-only proxy-wasm filter (never shipped): its plugin configuration (JSON) says what each
//! callback does, so that one module plays the third-party filters the end-to-end suites need:
//! the external-authorization pattern (pause, `dispatch_http_call`, resume or deny from the call's
//! response), resumes from `on_tick` and `on_queue_ready`, local responses, header writes whose raw
//! ABI status is reported back, a root context without an HTTP context type, and guests that
//! misbehave (loop forever, grow their memory, trap).
//!
//! Configuration (every field optional):
//! - `request_headers`, `request_body`, `response_headers`: the action of that callback:
//!   `continue` (default), `loop`, `trap`, `grow:<MiB>` (allocate and touch that much, keep it),
//!   `spin:<ms>` (busy for that long, then continue), `define_metrics:<n>` (define n new counters,
//!   their statuses in the response header `x-probe-metrics`: `ok=N,err=M`),
//!   `pause_call` (dispatch a call to `call_upstream`, pause), `pause_tick` / `pause_queue` (pause;
//!   the root context resumes the request from `on_tick` / `on_queue_ready`), `local` (418 with a
//!   body, no content-type), `echo` (200 whose body lists the request header names the filter
//!   sees), `write_headers` (the writes of `writes` below), `grpc_abort` (the Rust SDK's
//!   `send_grpc_response(Aborted, Some(GRPC_ABORT_MESSAGE), [])`, as proxy-wasm-rust-sdk's
//!   `grpc_auth_random` example aborts a call: HTTP 200, the message as the body, gRPC status
//!   10), `copy_authority` (adds the request header `x-probe-authority` with the `:authority`
//!   the filter reads, `<none>` when the map has none, and continues), `authority_local` (200
//!   whose body is that `:authority`: a gRPC client reads it as the details), `eviction` (200 whose
//!   JSON body is `{"configure": {KEY: VALUE}, "request": {KEY: VALUE}}`: the property
//!   `tollgate.shared_data.eviction.<KEY>` of each `eviction_keys` key as read in the root
//!   context's `on_configure` and in this HTTP context, `null` when the host answers NotFound,
//!   `"error: STATUS"` for another status), `plain_header_names` (200 whose JSON body is the
//!   property `tollgate.http.plain_header_names` as read in this HTTP context, with the same
//!   encoding: its text, `null`, or `"error: STATUS"`).
//! - `call_response`: `resume` (default), `local` (403 `denied by call`), `loop`, `report`
//!   (200 whose body is the call's `:status`, or `failed` when the call failed).
//! - `call_upstream`: the cluster (Envoy) or upstream (nginx) of `dispatch_http_call`.
//! - `call_timeout_ms`: the call's timeout (default 5000; 0 asks for the host's default).
//! - `writes`: `[{"map": "request"|"response"|"local", "op": "add"|"replace"|"remove", "name":
//!   "..", "value": ".."}]`, done with the raw ABI (`remove` needs no value; not for `local`);
//!   the statuses go out as the response header
//!   `x-probe-status` (comma-separated, in order) of a local response or of the response.
//! - `configure`: `ok` (default), `loop`, `fail`, `once:<key>` (fails when the shared-data key
//!   `probe-configured-<key>` exists, else sets it: the first instance in the gateway configures,
//!   a replacement cannot); `tick`: `resume` (default), `loop`.
//! - `trap_on_context`: the ordinal (from 1) of the HTTP context whose creation traps (once).
//! - `root_only`: the root context declares no context type (an HTTP context cannot be made).
//! - `eviction_keys`: shared-data keys whose zone's eviction policy `on_configure` reads (the
//!   nginx host's `tollgate.shared_data.eviction.<KEY>`, see nginx-compat/README.md);
//!   `require_no_eviction`: `on_configure` then fails unless every answer is `none`, as a filter
//!   keeping limits in shared data refuses a zone that evicts (so `nginx -t` fails).
#![allow(unsafe_code)] // The raw ABI calls below: their status is what the tests look at.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::cell::RefCell;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Config {
    request_headers: String,
    request_body: String,
    response_headers: String,
    call_response: String,
    call_upstream: String,
    call_timeout_ms: Option<u64>,
    writes: Vec<Write>,
    configure: String,
    tick: String,
    trap_on_context: u32,
    root_only: bool,
    eviction_keys: Vec<String>,
    require_no_eviction: bool,
}

/// The message of `grpc_abort`: a `%` and a non-ASCII character, which gRPC's `grpc-message`
/// carries percent-encoded, so that a client reading it back shows the encoding is right.
const GRPC_ABORT_MESSAGE: &str = "probe aborted the call: 100% sûr";

/// The eviction policy the host gives for shared-data key `key`: its text, `null` for
/// NotFound, `"error: STATUS"` for another status (read with the SDK's hostcall, which returns
/// InternalFailure instead of panicking as the trait's `get_property` would).
fn eviction_of(key: &str) -> serde_json::Value {
    property_of(vec!["tollgate", "shared_data", "eviction", key])
}

/// A property's value as the probe reports it: its text, `null` for NotFound, `"error: STATUS"`
/// for another status.
fn property_of(path: Vec<&str>) -> serde_json::Value {
    match proxy_wasm::hostcalls::get_property(path) {
        Ok(Some(v)) => serde_json::Value::String(String::from_utf8_lossy(&v).into_owned()),
        Ok(None) => serde_json::Value::Null,
        Err(e) => serde_json::Value::String(format!("error: {e:?}")),
    }
}

/// `{KEY: eviction_of(KEY)}` for each of `keys`.
fn evictions(keys: &[String]) -> serde_json::Map<String, serde_json::Value> {
    keys.iter().map(|k| (k.clone(), eviction_of(k))).collect()
}

#[derive(Deserialize, Clone)]
struct Write {
    map: String,
    op: String,
    name: String,
    #[serde(default)]
    value: String,
}

thread_local! {
    /// HTTP contexts paused until `on_tick` or `on_queue_ready` resumes them.
    static WAITING: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Memory kept by `grow:<MiB>`.
    static KEPT: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static CONTEXTS: RefCell<u32> = const { RefCell::new(0) };
    static QUEUE: RefCell<u32> = const { RefCell::new(0) };
    /// Metrics defined so far by `define_metrics:<n>` (names are numbered on).
    static DEFINED: RefCell<u64> = const { RefCell::new(0) };
    /// `ok=N,err=M` of the last `define_metrics`.
    static METRICS_STATUS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The ABI's map serialization: count, (name length, value length) pairs, then each name and
/// value followed by a NUL.
fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[link(wasm_import_module = "env")]
extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, np: *const u8, nl: usize, ret: *mut u32) -> u32;
}

/// Defines `n` new counters with the raw ABI (the SDK panics on an error status).
fn define_metrics(n: u64) {
    let (mut ok, mut err) = (0u32, 0u32);
    for _ in 0..n {
        let i = DEFINED.with(|d| {
            let mut d = d.borrow_mut();
            *d += 1;
            *d
        });
        let name = format!("probe_metric_{i}");
        let mut id = 0u32;
        // SAFETY: a live string and a live u32.
        let s = unsafe { proxy_define_metric(0, name.as_ptr(), name.len(), &mut id) };
        if s == 0 {
            ok += 1;
        } else {
            err += 1;
        }
    }
    METRICS_STATUS.with(|m| *m.borrow_mut() = format!("ok={ok},err={err}"));
}

/// Busy for `ms` milliseconds of the host's clock.
fn spin_for(ms: u64) {
    let start = proxy_wasm::hostcalls::get_current_time().ok();
    loop {
        let now = proxy_wasm::hostcalls::get_current_time().ok();
        match (start, now) {
            (Some(s), Some(n))
                if n.duration_since(s).unwrap_or_default() >= Duration::from_millis(ms) =>
            {
                return
            }
            (None, _) | (_, None) => return,
            _ => {}
        }
    }
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_add_header_map_value(
        t: u32,
        kp: *const u8,
        kl: usize,
        vp: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        t: u32,
        kp: *const u8,
        kl: usize,
        vp: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(t: u32, kp: *const u8, kl: usize) -> u32;
}

/// Runs the raw writes of `map` ("request" = map type 0, "response" = 2); returns their statuses.
fn raw_writes(config: &Config, map: &str, t: u32) -> Vec<u32> {
    config
        .writes
        .iter()
        .filter(|w| w.map == map)
        .map(|w| {
            let (k, v) = (w.name.as_bytes(), w.value.as_bytes());
            // SAFETY: pointers and lengths of live byte slices.
            unsafe {
                match w.op.as_str() {
                    "add" => {
                        proxy_add_header_map_value(t, k.as_ptr(), k.len(), v.as_ptr(), v.len())
                    }
                    "remove" => proxy_remove_header_map_value(t, k.as_ptr(), k.len()),
                    _ => {
                        proxy_replace_header_map_value(t, k.as_ptr(), k.len(), v.as_ptr(), v.len())
                    }
                }
            }
        })
        .collect()
}

fn statuses(s: &[u32]) -> String {
    s.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

fn grow(mib: usize) {
    let mut v = vec![0u8; mib << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    KEPT.with(|k| k.borrow_mut().push(v));
}

/// One root context per plugin configuration (several may share the instance).
#[derive(Default)]
struct Root {
    config: Config,
    /// The eviction policies read in `on_configure` (`eviction_keys`).
    configured_evictions: serde_json::Map<String, serde_json::Value>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let cfg: Config = if bytes.is_empty() {
            Config::default()
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(c) => c,
                Err(e) => {
                    log::error!("probe: bad configuration: {e}");
                    return false;
                }
            }
        };
        let configure = cfg.configure.clone();
        let wants_tick = cfg.request_headers == "pause_tick" || cfg.tick == "loop";
        let wants_queue = cfg.request_headers == "pause_queue";
        self.configured_evictions = evictions(&cfg.eviction_keys);
        if cfg.require_no_eviction {
            for (key, policy) in &self.configured_evictions {
                if policy.as_str() != Some("none") {
                    log::error!(
                        "probe: shared-data key \"{key}\" is in a zone whose eviction is {policy}: \
                         refusing it (declare the zone with eviction=none)"
                    );
                    return false;
                }
            }
        }
        self.config = cfg;
        match configure.as_str() {
            "loop" => spin(),
            "fail" => return false,
            s if s.starts_with("once:") => {
                let key = format!("probe-configured-{}", s.trim_start_matches("once:"));
                if let Ok((Some(_), _)) = proxy_wasm::hostcalls::get_shared_data(&key) {
                    log::error!("probe: {key} configured before: refusing");
                    return false;
                }
                let _ = proxy_wasm::hostcalls::set_shared_data(&key, Some(b"1"), None);
            }
            _ => {}
        }
        if wants_tick {
            self.set_tick_period(Duration::from_millis(20));
        }
        if wants_queue {
            match proxy_wasm::hostcalls::register_shared_queue("probe") {
                Ok(id) => QUEUE.with(|q| *q.borrow_mut() = id),
                Err(e) => log::error!("probe: register_shared_queue: {e:?}"),
            }
        }
        true
    }

    fn on_tick(&mut self) {
        if self.config.tick == "loop" {
            spin();
        }
        resume_waiting();
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = proxy_wasm::hostcalls::dequeue_shared_queue(queue_id) {}
        resume_waiting();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let n = CONTEXTS.with(|c| {
            let mut c = c.borrow_mut();
            *c += 1;
            *c
        });
        if self.config.trap_on_context == n {
            panic!("probe: trapping while creating HTTP context #{n}");
        }
        Some(Box::new(Probe {
            id: context_id,
            config: self.config.clone(),
            configured_evictions: self.configured_evictions.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        if self.config.root_only {
            None
        } else {
            Some(ContextType::HttpContext)
        }
    }
}

fn resume_waiting() {
    let ids: Vec<u32> = WAITING.with(|w| std::mem::take(&mut *w.borrow_mut()));
    for id in ids {
        if proxy_wasm::hostcalls::set_effective_context(id).is_ok() {
            let _ = proxy_wasm::hostcalls::resume_http_request();
        }
    }
}

struct Probe {
    id: u32,
    config: Config,
    configured_evictions: serde_json::Map<String, serde_json::Value>,
}

impl Probe {
    /// The action named `what`.
    fn act(&mut self, what: &str) -> Action {
        match what {
            "loop" => spin(),
            "trap" => panic!("probe: trap requested"),
            "pause_call" => {
                let upstream = self.config.call_upstream.clone();
                match self.dispatch_http_call(
                    &upstream,
                    vec![
                        (":method", "GET"),
                        (":path", "/probe-call"),
                        (":authority", "probe"),
                    ],
                    None,
                    vec![],
                    Duration::from_millis(self.config.call_timeout_ms.unwrap_or(5000)),
                ) {
                    Ok(_) => Action::Pause,
                    Err(e) => {
                        self.send_http_response(
                            500,
                            vec![],
                            Some(format!("dispatch: {e:?}").as_bytes()),
                        );
                        Action::Pause
                    }
                }
            }
            "pause_tick" => {
                WAITING.with(|w| w.borrow_mut().push(self.id));
                Action::Pause
            }
            "pause_queue" => {
                WAITING.with(|w| w.borrow_mut().push(self.id));
                let id = QUEUE.with(|q| *q.borrow());
                if let Err(e) = proxy_wasm::hostcalls::enqueue_shared_queue(id, Some(b"wake")) {
                    log::error!("probe: enqueue: {e:?}");
                }
                Action::Pause
            }
            "local" => {
                self.send_http_response(418, vec![("x-probe", "local")], Some(b"teapot"));
                Action::Pause
            }
            "grpc_abort" => {
                self.send_grpc_response(
                    proxy_wasm::types::GrpcStatusCode::Aborted,
                    Some(GRPC_ABORT_MESSAGE),
                    vec![],
                );
                Action::Pause
            }
            "copy_authority" => {
                let authority = self
                    .get_http_request_header(":authority")
                    .unwrap_or_else(|| "<none>".to_owned());
                self.set_http_request_header("x-probe-authority", Some(&authority));
                Action::Continue
            }
            "authority_local" => {
                let authority = self
                    .get_http_request_header(":authority")
                    .unwrap_or_else(|| "<none>".to_owned());
                self.send_http_response(200, vec![], Some(authority.as_bytes()));
                Action::Pause
            }
            "eviction" => {
                let body = serde_json::json!({
                    "configure": self.configured_evictions,
                    "request": evictions(&self.config.eviction_keys),
                });
                self.send_http_response(
                    200,
                    vec![("content-type", "application/json")],
                    Some(body.to_string().as_bytes()),
                );
                Action::Pause
            }
            "plain_header_names" => {
                let body = property_of(vec!["tollgate", "http", "plain_header_names"]).to_string();
                self.send_http_response(
                    200,
                    vec![("content-type", "application/json")],
                    Some(body.as_bytes()),
                );
                Action::Pause
            }
            "echo" => {
                let names: Vec<String> = self
                    .get_http_request_headers()
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect();
                let body = serde_json::to_vec(&names).unwrap_or_default();
                self.send_http_response(
                    200,
                    vec![("content-type", "application/json")],
                    Some(&body),
                );
                Action::Pause
            }
            "write_headers" => {
                let s = raw_writes(&self.config, "request", 0);
                let local: Vec<Write> = self
                    .config
                    .writes
                    .iter()
                    .filter(|w| w.map == "local")
                    .cloned()
                    .collect();
                if !local.is_empty() {
                    let pairs: Vec<(&str, &str)> = local
                        .iter()
                        .map(|w| (w.name.as_str(), w.value.as_str()))
                        .collect();
                    // Raw proxy_send_local_response: a refused header fails the call (the SDK
                    // would panic on that status).
                    let headers = serialize_map(&pairs);
                    let body = b"local";
                    // SAFETY: pointers and lengths of live buffers.
                    let status = unsafe {
                        proxy_send_local_response(
                            200,
                            std::ptr::null(),
                            0,
                            body.as_ptr(),
                            body.len(),
                            headers.as_ptr(),
                            headers.len(),
                            -1,
                        )
                    };
                    if status != 0 {
                        let s = status.to_string();
                        self.send_http_response(
                            200,
                            vec![("x-probe-status", &s)],
                            Some(b"refused"),
                        );
                    }
                    return Action::Pause;
                }
                // Under `wasmx.*`: the only free namespace Kong's `proxy_set_property` accepts
                // (elsewhere NotFound, which the SDK turns into a panic), as the filters' signals.
                self.set_property(
                    vec!["wasmx", "probe", "request_status"],
                    Some(statuses(&s).as_bytes()),
                );
                Action::Continue
            }
            s if s.starts_with("spin:") => {
                spin_for(s.trim_start_matches("spin:").parse().unwrap_or(1));
                Action::Continue
            }
            s if s.starts_with("define_metrics:") => {
                define_metrics(s.trim_start_matches("define_metrics:").parse().unwrap_or(1));
                Action::Continue
            }
            s if s.starts_with("grow:") => {
                grow(s.trim_start_matches("grow:").parse().unwrap_or(1));
                Action::Continue
            }
            _ => Action::Continue,
        }
    }
}

impl Context for Probe {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        match self.config.call_response.as_str() {
            "loop" => spin(),
            "local" => self.send_http_response(403, vec![], Some(b"denied by call")),
            "report" => {
                let status = self
                    .get_http_call_response_header(":status")
                    .unwrap_or_else(|| "failed".to_owned());
                self.send_http_response(200, vec![], Some(status.as_bytes()));
            }
            _ => self.resume_http_request(),
        }
    }
}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let what = self.config.request_headers.clone();
        self.act(&what)
    }

    fn on_http_request_body(&mut self, _size: usize, _eos: bool) -> Action {
        let what = self.config.request_body.clone();
        self.act(&what)
    }

    fn on_http_request_trailers(&mut self, _n: usize) -> Action {
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let s = raw_writes(&self.config, "response", 2);
        if !s.is_empty() {
            let _ = proxy_wasm::hostcalls::set_map_value(
                proxy_wasm::types::MapType::HttpResponseHeaders,
                "x-probe-status",
                Some(&statuses(&s)),
            );
        }
        let m = METRICS_STATUS.with(|m| std::mem::take(&mut *m.borrow_mut()));
        if !m.is_empty() {
            self.set_http_response_header("x-probe-metrics", Some(&m));
        }
        if let Some(v) = self.get_property(vec!["wasmx", "probe", "request_status"]) {
            let v = String::from_utf8_lossy(&v).into_owned();
            self.set_http_response_header("x-probe-request-status", Some(&v));
        }
        let what = self.config.response_headers.clone();
        self.act(&what)
    }

    fn on_http_response_body(&mut self, _size: usize, _eos: bool) -> Action {
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _n: usize) -> Action {
        Action::Continue
    }

    fn on_log(&mut self) {}
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
