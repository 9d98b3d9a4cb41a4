#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)]

//! The real Tollgate filters (`scripts/build.sh` builds them for wasm32-wasip1) driven
//! in-process through `tollgate-host` and the in-memory host: one file per filter, one test
//! binary (the helpers are here).

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::Mac;
use tollgate_host::testing::MemoryHost;
use tollgate_host::{
    Action, Engine, HeaderMap, HttpCallResponse, HttpId, Module, PropertySource, RootId, Stream,
    StreamCallback, Vm,
};

fn wasm_path(filter: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(format!(
        "target/wasm32-wasip1/release/tollgate_{filter}.wasm"
    ));
    assert!(
        path.exists(),
        "{} is missing: run scripts/build.sh (in {}) first to build the filters",
        path.display(),
        root.display()
    );
    path
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::new().unwrap())
}

/// Each filter is compiled once per test binary (different filters concurrently).
fn module(filter: &str) -> Module {
    type Cells = Mutex<HashMap<String, Arc<OnceLock<Module>>>>;
    static MODULES: OnceLock<Cells> = OnceLock::new();
    let cell = MODULES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap()
        .entry(filter.to_owned())
        .or_default()
        .clone();
    cell.get_or_init(|| engine().compile_file(&wasm_path(filter)).unwrap())
        .clone()
}

fn vm(filter: &str, host: &Rc<MemoryHost>) -> Vm {
    Vm::new(&module(filter), host.clone(), &format!("vm_{filter}"), b"").unwrap()
}

fn h(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> Stream {
    let mut headers = h(&[
        (":method", method),
        (":path", path),
        (":authority", "api.example.com"),
        (":scheme", "http"),
    ]);
    headers.extend(h(extra));
    Stream {
        request_headers: headers,
        ..Default::default()
    }
}

/// Runs request `s` through context `id`: its request headers, a `:status 200` response's
/// headers (both must continue), then the log and the context's deletion.
fn pass_through(vm: &mut Vm, id: HttpId, s: &mut Stream) {
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, s, true)
            .unwrap(),
        Action::Continue
    );
    s.response_headers = h(&[(":status", "200")]);
    assert_eq!(
        vm.on_stream(StreamCallback::ResponseHeaders, id, s, true)
            .unwrap(),
        Action::Continue
    );
    vm.on_log_and_delete(id, s).unwrap();
}

fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| std::str::from_utf8(v).unwrap())
}

fn property<'a>(stream: &'a Stream, name: &str) -> Option<&'a str> {
    stream
        .properties
        .get(name.as_bytes())
        .map(|v| std::str::from_utf8(v).unwrap())
}

/// Envoy-style attributes: integers as 8 bytes little-endian.
struct Props(HashMap<Vec<u8>, Vec<u8>>);

impl PropertySource for Props {
    fn property(&self, path: &[u8], value: &mut Vec<u8>) -> bool {
        value.clear();
        match self.0.get(path) {
            Some(v) => {
                value.extend_from_slice(v);
                true
            }
            None => false,
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

mod cost;
mod jwt_auth;
mod measurements;
mod metrics_filter;
mod rate_limit;
mod sticky_and_floor;
