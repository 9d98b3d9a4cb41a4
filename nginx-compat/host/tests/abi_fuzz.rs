//! The hostile guest (tests/filters/abi-fuzz, built by scripts/build.sh) driven in-process
//! against the host core, as the nginx module drives it: under [`GuestLimits`] with an
//! [`tollgate_host::EpochTicker`], root and HTTP contexts, every callback (streams with random
//! maps and bodies, HTTP call responses with and without the dispatching stream, ticks, queue
//! ready), a trapped `Vm` replaced by a new one. Properties: no panic or abort (a host panic
//! fails the test and names the seed and the step), every trap comes back as an `Err`, no
//! single step hangs, what the guest can make the host hold per stream stays within the host's
//! caps, and resident memory and open file descriptors stay flat after warm-up.
//!
//! The short run (20,000 host calls) is part of `cargo test`; the long run:
//! `cd nginx-compat && cargo test --release -p tollgate-host --test abi_fuzz -- --ignored --nocapture`
//! (`ABI_FUZZ_CALLS`, default 1,000,000, and `ABI_FUZZ_SEED` change it; the figures are printed).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tollgate_host::testing::{MapSource, MemoryHost};
use tollgate_host::{
    DeferredMap, Engine, GuestLimits, HeaderMap, Host, HttpCall, HttpCallResponse, HttpId,
    LogLevel, MetricKind, Module, RootId, Status, Stream, StreamCallback, Vm,
};

/// The host's caps on what one stream's filters may make it hold (nginx-compat/host/src/valid.rs).
const MAX_MAP_BYTES: usize = 1 << 20;
/// Longest one step may take: a guest call is interrupted after 100 ms (the default deadline),
/// so anything near a second is a host call that does not return.
const STEP_LIMIT: Duration = Duration::from_secs(2);

fn guest(engine: &Engine) -> Module {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("target/wasm32-wasip1/release/test_abi_fuzz.wasm");
    assert!(
        path.exists(),
        "{} is missing: run scripts/build.sh (in {}) first",
        path.display(),
        root.display()
    );
    engine.compile_file(&path).unwrap()
}

/// SplitMix64, the driver's own sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

/// [`MemoryHost`] for shared data, metrics, queues and calls; logs are counted, not kept (a
/// guest can log gigabytes), and the guest's `abi-fuzz: N host calls in ...` lines totalled.
struct FuzzHost {
    inner: MemoryHost,
    host_calls: Cell<u64>,
    callbacks: Cell<u64>,
    log_bytes: Cell<u64>,
}

impl FuzzHost {
    /// Bounds the test host's own stores (nginx's zones have fixed sizes; `MemoryHost` none):
    /// shared data and queues past 8 MiB and metrics past 10,000 are dropped.
    fn trim(&self) {
        let bytes = |v: &[u8]| v.len();
        let shared: usize = self
            .inner
            .shared
            .borrow()
            .iter()
            .map(|(k, (v, _))| k.len() + v.len())
            .sum();
        if shared > 8 << 20 {
            self.inner.shared.borrow_mut().clear();
        }
        let queued: usize = self
            .inner
            .queues
            .borrow()
            .iter()
            .map(|(_, q)| q.iter().map(|v| bytes(v)).sum::<usize>())
            .sum();
        if queued > 8 << 20 {
            for (_, q) in self.inner.queues.borrow_mut().iter_mut() {
                q.clear();
            }
        }
        if self.inner.metrics.borrow().len() > 10_000 {
            self.inner.metrics.borrow_mut().clear();
        }
    }
}

impl Host for FuzzHost {
    fn log(&self, _level: LogLevel, _plugin: &str, message: &str) {
        self.log_bytes
            .set(self.log_bytes.get() + message.len() as u64);
        if let Some(rest) = message.strip_prefix("abi-fuzz: ") {
            if let Some(n) = rest.split(' ').next().and_then(|n| n.parse::<u64>().ok()) {
                self.host_calls.set(self.host_calls.get() + n);
                self.callbacks.set(self.callbacks.get() + 1);
            }
        }
    }
    fn log_level(&self) -> LogLevel {
        LogLevel::Trace
    }
    fn get_shared_data(&self, key: &[u8], value: &mut Vec<u8>) -> Result<u32, Status> {
        self.inner.get_shared_data(key, value)
    }
    fn set_shared_data(&self, key: &[u8], value: &[u8], cas: u32) -> Result<(), Status> {
        self.inner.set_shared_data(key, value, cas)
    }
    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, Status> {
        self.inner.define_metric(kind, name)
    }
    fn increment_metric(&self, id: u32, delta: i64) -> Result<(), Status> {
        self.inner.increment_metric(id, delta)
    }
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status> {
        self.inner.record_metric(id, value)
    }
    fn get_metric(&self, id: u32) -> Result<u64, Status> {
        self.inner.get_metric(id)
    }
    fn register_shared_queue(&self, name: &str) -> Result<u32, Status> {
        self.inner.register_shared_queue(name)
    }
    fn resolve_shared_queue(&self, vm_id: &str, name: &str) -> Result<u32, Status> {
        self.inner.resolve_shared_queue(vm_id, name)
    }
    fn enqueue_shared_queue(&self, id: u32, value: &[u8]) -> Result<(), Status> {
        self.inner.enqueue_shared_queue(id, value)
    }
    fn dequeue_shared_queue(&self, id: u32) -> Result<Vec<u8>, Status> {
        self.inner.dequeue_shared_queue(id)
    }
    fn dispatch_http_call(&self, call: HttpCall) -> Result<(), Status> {
        self.inner.dispatch_http_call(call)
    }
}

/// A stream of the running `Vm` and the next callback it gets.
struct Live {
    id: HttpId,
    stream: Stream,
    next: usize,
}

/// The callbacks of a stream in order; body callbacks may repeat (chunks).
const ORDER: [StreamCallback; 7] = [
    StreamCallback::RequestHeaders,
    StreamCallback::RequestBody,
    StreamCallback::RequestTrailers,
    StreamCallback::ResponseHeaders,
    StreamCallback::ResponseBody,
    StreamCallback::ResponseTrailers,
    StreamCallback::Log,
];

fn pairs(rng: &mut Rng, fixed: &[(&str, &str)]) -> HeaderMap {
    let mut map: HeaderMap = fixed
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    for _ in 0..rng.below(6) {
        let name = ["x-a", "cookie", "content-type", "x-fuzz", "host", "te"][rng.below(6)];
        let len = [0, 1, 10, 200, 5000][rng.below(5)];
        map.push((name.as_bytes().to_vec(), vec![b'v'; len]));
    }
    map
}

fn body(rng: &mut Rng) -> Vec<u8> {
    let len = [0, 1, 100, 4096, 65536][rng.below(5)];
    vec![b'b'; len]
}

/// Half the time a map the embedding serves in place (deferred: read and edited without being
/// built, as nginx's header lists are), else a built one.
fn headers(rng: &mut Rng, fixed: &[(&str, &str)]) -> (HeaderMap, Option<DeferredMap>) {
    let map = pairs(rng, fixed);
    if rng.percent(50) {
        (
            Vec::new(),
            Some(DeferredMap::new(Box::new(MapSource::new(map)))),
        )
    } else {
        (map, None)
    }
}

fn request(rng: &mut Rng) -> Stream {
    let path = ["/", "/fuzz?x=1", "/a/b", ""][rng.below(4)];
    let (request_headers, request_headers_deferred) = headers(
        rng,
        &[(":method", "POST"), (":path", path), (":authority", "fuzz")],
    );
    Stream {
        request_headers,
        request_headers_deferred,
        request_body: body(rng),
        request_trailers: if rng.percent(20) {
            pairs(rng, &[("x-trailer", "1")])
        } else {
            Vec::new()
        },
        request_trailers_unavailable: rng.percent(50),
        ..Stream::default()
    }
}

/// Bytes of names and values of a map.
fn map_bytes(m: &HeaderMap) -> usize {
    m.iter().map(|(k, v)| k.len() + v.len()).sum()
}

fn check_caps(stream: &Stream) -> Result<(), String> {
    let built =
        |d: &Option<DeferredMap>, m: &HeaderMap| d.as_ref().map_or(m.clone(), |d| d.build());
    for (name, m) in [
        (
            "request headers",
            &built(&stream.request_headers_deferred, &stream.request_headers),
        ),
        ("request trailers", &stream.request_trailers),
        (
            "response headers",
            &built(&stream.response_headers_deferred, &stream.response_headers),
        ),
        ("response trailers", &stream.response_trailers),
    ] {
        if map_bytes(m) > MAX_MAP_BYTES {
            return Err(format!("{name}: {} bytes", map_bytes(m)));
        }
    }
    for d in [
        &stream.request_headers_deferred,
        &stream.response_headers_deferred,
    ]
    .into_iter()
    .flatten()
    {
        if d.edits().len() > tollgate_host::MAX_EDITS {
            return Err(format!("{} edits kept on a deferred map", d.edits().len()));
        }
    }
    let props: usize = stream
        .properties
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if props > MAX_MAP_BYTES {
        return Err(format!("properties: {props} bytes"));
    }
    Ok(())
}

/// What a run measured.
#[derive(Debug, Default)]
struct Figures {
    host_calls: u64,
    callbacks: u64,
    errors: u64,
    instances: u64,
    steps: u64,
    log_bytes: u64,
    seconds: f64,
    rss_kib_warm: u64,
    rss_kib_end: u64,
    fds_warm: usize,
    fds_end: usize,
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

struct Driver {
    module: Module,
    host: Rc<FuzzHost>,
    rng: Rng,
    seed: u64,
    vm: Option<(Vm, Vec<RootId>)>,
    live: Vec<Live>,
    /// Calls dispatched and not answered yet.
    calls: Vec<HttpCall>,
    figures: Figures,
}

impl Driver {
    /// A new instance with two roots (different plugin names and configurations, so that a
    /// change of effective context changes the plugin name and configuration lengths).
    fn instantiate(&mut self) -> Result<(), String> {
        self.live.clear();
        self.calls.clear();
        self.vm = None;
        self.figures.instances += 1;
        let vm_config = format!("seed={}", self.seed);
        let mut vm = Vm::new_with_limits(
            &self.module,
            self.host.clone(),
            "abi_fuzz",
            vm_config.as_bytes(),
            &GuestLimits::DEFAULT,
        )
        .map_err(|e| e.0)?;
        let mut roots = Vec::new();
        let configs = [
            (
                "abi_fuzz",
                format!("seed={} calls=48 exit=3 pause=1", self.seed),
            ),
            (
                "abi_fuzz_second_plugin",
                format!(
                    "seed={} calls=16 depth=3 reenter=40 garbage=20",
                    self.seed + 1
                ),
            ),
        ];
        for (name, config) in configs {
            match vm.create_root(name, config.as_bytes()) {
                Ok(r) => roots.push(r),
                Err(_) => self.figures.errors += 1,
            }
        }
        self.vm = Some((vm, roots));
        Ok(())
    }

    /// One step of the driver: a stream callback, a new stream, a tick, a queue-ready, or
    /// answers to pending calls. `Err` for a broken property.
    fn step(&mut self) -> Result<(), String> {
        if self.vm.as_ref().is_none_or(|(vm, _)| vm.is_poisoned()) {
            self.instantiate()?;
        }
        let choice = self.rng.below(100);
        let (vm, roots) = self.vm.as_mut().unwrap();
        let result = match choice {
            0..=59 if !self.live.is_empty() => {
                let i = self.rng.below(self.live.len());
                let live = &mut self.live[i];
                let cb = ORDER[live.next.min(ORDER.len() - 1)];
                let repeat_body = matches!(
                    cb,
                    StreamCallback::RequestBody | StreamCallback::ResponseBody
                ) && self.rng.percent(30);
                if !repeat_body {
                    live.next += 1;
                }
                match cb {
                    StreamCallback::RequestBody => live.stream.request_body = body(&mut self.rng),
                    StreamCallback::ResponseHeaders => {
                        let (map, deferred) = headers(&mut self.rng, &[(":status", "200")]);
                        live.stream.response_headers = map;
                        live.stream.response_headers_deferred = deferred;
                    }
                    StreamCallback::ResponseBody => {
                        live.stream.response_body = body(&mut self.rng);
                    }
                    _ => {}
                }
                let eos = self.rng.percent(50);
                let r = vm.on_stream(cb, live.id, &mut live.stream, eos);
                check_caps(&live.stream)?;
                if cb == StreamCallback::Log {
                    self.live.swap_remove(i);
                }
                r.map(|_| ())
            }
            0..=69 if self.live.len() < 4 && !roots.is_empty() => {
                let root = roots[self.rng.below(roots.len())];
                vm.create_http(root).map(|id| {
                    let stream = request(&mut self.rng);
                    self.live.push(Live {
                        id,
                        stream,
                        next: 0,
                    });
                })
            }
            0..=79 if !roots.is_empty() => vm.on_tick(roots[self.rng.below(roots.len())]),
            0..=84 => {
                let n = self.host.inner.queues.borrow().len() as u32;
                let id = 1 + self.rng.below(n as usize + 1) as u32;
                vm.on_queue_ready(id)
            }
            _ => {
                self.calls.append(&mut self.host.inner.calls.borrow_mut());
                let mut r = Ok(());
                let n = self.rng.below(self.calls.len() + 1).min(8);
                for _ in 0..n {
                    let call = self.calls.swap_remove(self.rng.below(self.calls.len()));
                    let response = (!self.rng.percent(20)).then(|| HttpCallResponse {
                        headers: pairs(&mut self.rng, &[(":status", "200")]),
                        body: body(&mut self.rng),
                        trailers: Vec::new(),
                    });
                    let ctx = vm.http_call_context(call.token);
                    let live = ctx.and_then(|h| self.live.iter_mut().find(|l| l.id == h));
                    r = match live {
                        Some(l) => vm.on_http_call_response_with_stream(
                            call.token,
                            response,
                            &mut l.stream,
                        ),
                        None => vm.on_http_call_response(call.token, response),
                    };
                    if r.is_err() {
                        break;
                    }
                }
                // The host bounds pending calls per instance; older ones are forgotten here.
                let keep = self.calls.len().saturating_sub(256);
                self.calls.drain(..keep);
                r
            }
        };
        if result.is_err() {
            self.figures.errors += 1;
        }
        let _ = vm.take_resumed();
        self.host.trim();
        Ok(())
    }

    /// Runs until the guest reports `target` host calls; measures RSS and fds after `warmup`.
    fn run(&mut self, target: u64, warmup: u64) -> Figures {
        let start = Instant::now();
        let mut warm = false;
        while self.host.host_calls.get() < target {
            let t = Instant::now();
            let step = self.figures.steps;
            let r = catch_unwind(AssertUnwindSafe(|| self.step()));
            match r {
                Err(panic) => {
                    eprintln!(
                        "abi-fuzz: the host panicked at step {step} (ABI_FUZZ_SEED={})",
                        self.seed
                    );
                    resume_unwind(panic);
                }
                Ok(Err(broken)) => panic!(
                    "abi-fuzz: step {step} (ABI_FUZZ_SEED={}): {broken}",
                    self.seed
                ),
                Ok(Ok(())) => {}
            }
            let took = t.elapsed();
            assert!(
                took < STEP_LIMIT,
                "abi-fuzz: step {step} (ABI_FUZZ_SEED={}) took {took:?}: a host call does not return",
                self.seed
            );
            self.figures.steps += 1;
            if !warm && self.host.host_calls.get() >= warmup {
                warm = true;
                self.figures.rss_kib_warm = rss_kib();
                self.figures.fds_warm = open_fds();
            }
        }
        self.vm = None;
        self.live.clear();
        self.calls.clear();
        let mut f = std::mem::take(&mut self.figures);
        f.seconds = start.elapsed().as_secs_f64();
        f.host_calls = self.host.host_calls.get();
        f.callbacks = self.host.callbacks.get();
        f.log_bytes = self.host.log_bytes.get();
        f.rss_kib_end = rss_kib();
        f.fds_end = open_fds();
        f
    }
}

fn fuzz(target: u64, warmup: u64) -> Figures {
    let seed = std::env::var("ABI_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let engine = Engine::new().unwrap();
    let module = guest(&engine);
    let ticker = engine.start_epoch_ticker().unwrap();
    let mut d = Driver {
        module,
        host: Rc::new(FuzzHost {
            inner: MemoryHost::new(),
            host_calls: Cell::new(0),
            callbacks: Cell::new(0),
            log_bytes: Cell::new(0),
        }),
        rng: Rng(seed ^ 0x5eed),
        seed,
        vm: None,
        live: Vec::new(),
        calls: Vec::new(),
        figures: Figures::default(),
    };
    let f = d.run(target, warmup);
    drop(ticker);
    eprintln!("abi-fuzz (seed {seed}): {f:?}");
    f
}

/// What the short run (part of `cargo test`) asserts, after its warm-up: no growth of the open
/// file descriptors, and RSS within 64 MiB (one instance is ~3 MiB; the guest can make the host
/// hold up to a few MiB per stream, and glibc keeps freed arenas).
#[test]
fn hostile_guest_20k_host_calls() {
    let f = fuzz(20_000, 5_000);
    assert!(f.host_calls >= 20_000);
    assert!(
        f.errors > 0 && f.instances > 1,
        "traps happened and were survived: {f:?}"
    );
    assert!(f.fds_end <= f.fds_warm, "file descriptors: {f:?}");
    assert!(f.rss_kib_end <= f.rss_kib_warm + 64 * 1024, "RSS: {f:?}");
}

/// The long run (see the module docs for the command).
#[test]
#[ignore = "long: at least 1,000,000 host calls (minutes)"]
fn hostile_guest_long_run() {
    let target = std::env::var("ABI_FUZZ_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let f = fuzz(target, target / 10);
    assert!(f.fds_end <= f.fds_warm, "file descriptors: {f:?}");
    assert!(f.rss_kib_end <= f.rss_kib_warm + 64 * 1024, "RSS: {f:?}");
}
