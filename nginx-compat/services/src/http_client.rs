//! `proxy_dispatch_http_call` without blocking an nginx worker: a [`CallRunner`] hands each call
//! to background threads of the worker process (started on the first dispatch, so never in the
//! nginx master before `fork`; restarted if the process finds itself forked) that perform it
//! with a deadline, and queues the completions; the worker collects them with
//! [`CallRunner::poll`] (non-blocking) when the [`Waker`] it installed with
//! [`CallRunner::set_waker`] tells it one is there.
//!
//! # HTTP/1.1 on hyper
//! The calls are plain HTTP/1.1 to `host:port` (the upstream nginx resolved; TLS would come from
//! nginx's upstream, not from here) under one overall deadline (the call's `timeout_ms`) across
//! DNS, connect, write and read, with the response size capped. The protocol is hyper's
//! (`hyper::client::conn::http1`), driven by a current-thread tokio runtime owned by each
//! background thread; this file only shapes the call and its limits:
//!
//! - connections are persistent (RFC 9112 section 9.3): after a complete response each thread
//!   keeps its connection to that address for the next call ([`crate::http_pool`]: one per
//!   address, 30 s idle at most), unless the server said `connection: close`. A kept connection
//!   the server closed meanwhile is noticed before the request goes out and a new one is opened;
//!   if it closes after the request went out and before any response, the request is sent again
//!   on a new connection only when its method is idempotent (RFC 9110 section 9.2.2: GET, HEAD,
//!   OPTIONS, TRACE, PUT, DELETE), and otherwise fails the call, as Envoy's connection pool does
//!   without a retry policy;
//! - request: `{:method} {:path} HTTP/1.1`, `host` from `:authority`, the other headers as given
//!   except `connection`, `content-length`, `transfer-encoding`, `host` and `keep-alive` (set
//!   here: `content-length` when there is a body or the method is not GET/HEAD/DELETE/OPTIONS),
//!   the body; request trailers are not sent (HTTP/1.1 servers rarely accept them; no filter of
//!   this project sends any);
//! - response: as hyper reads it (interim 1xx skipped; chunked, `content-length` or
//!   close-delimited bodies; none for `HEAD`, 204 and 304), headers with lower-cased names, in
//!   order with repeated names together, at most [`MAX_HEAD`] bytes of head; the trailers of a
//!   chunked body become the response trailers; bodies above [`RunnerConfig::max_body_bytes`]
//!   fail the call;
//! - any error (DNS, refused, reset, timeout, malformed response) completes the call with a
//!   [`CallFailure`] (the embedder logs it), a failed call to the filter (no headers, empty body),
//!   as Envoy does.
//!
//! Shape of a call (Envoy's `Context::httpCall` rules): `:method`, `:path` and `:authority` are
//! required pseudo-headers ([`DispatchError::MissingPseudoHeader`] otherwise, Envoy's
//! `BadArgument`); header names and values must not contain CR, LF or NUL
//! ([`DispatchError::InvalidHeader`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::runtime::Runtime;

use crate::http_pool::{AbortOnDrop, Connection, Pool};

/// Called by a call runner's background thread after it queued a completion (e.g. writes an
/// eventfd the worker's event loop watches). Must not block.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// Header list: (name, value) pairs in order, duplicates allowed.
pub type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// One call as the filter dispatched it.
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    /// Headers, with the pseudo-headers `:method`, `:path`, `:authority` (proxy-wasm SDKs send
    /// them this way).
    pub headers: Headers,
    /// Request body (bytes).
    pub body: Vec<u8>,
    /// Overall deadline of the call, from dispatch to the last byte of the response.
    pub timeout: Duration,
    /// Limits of the call's steps within that deadline (`None`: only the deadline).
    pub steps: Option<StepTimeouts>,
}

/// Limits of each step of a call, within its overall deadline: the embedder's defaults
/// (nginx-compat maps ngx_wasm_module's `resolver_timeout` and `socket_*_timeout` directives,
/// docs/DIRECTIVES.md, onto them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTimeouts {
    /// Resolving the host name of `host:port` (getaddrinfo).
    pub resolve: Duration,
    /// Establishing the TCP connection (all resolved addresses, in order).
    pub connect: Duration,
    /// Writing the request and reading the whole response, once connected.
    pub exchange: Duration,
}

/// Why a call completed without a response (the filter sees a failed call either way; the
/// embedder logs this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// The host name did not resolve.
    Resolve,
    /// Resolving the host name took longer than [`StepTimeouts::resolve`].
    ResolveTimeout,
    /// No resolved address accepted the connection.
    Connect,
    /// Connecting took longer than [`StepTimeouts::connect`].
    ConnectTimeout,
    /// The call's deadline (or [`StepTimeouts::exchange`]) passed before the response was read.
    Timeout,
    /// The connection broke or the response was malformed.
    Protocol,
    /// The response head, trailers or body exceeded their limits.
    TooLarge,
    /// The worker could not run the call (no runtime, thread gone).
    Unavailable,
}

impl std::fmt::Display for CallFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CallFailure::Resolve => "host name not resolved",
            CallFailure::ResolveTimeout => "resolver timed out",
            CallFailure::Connect => "connection refused or unreachable",
            CallFailure::ConnectTimeout => "connect timed out",
            CallFailure::Timeout => "timed out",
            CallFailure::Protocol => "connection broken or malformed response",
            CallFailure::TooLarge => "response too large",
            CallFailure::Unavailable => "no call thread",
        })
    }
}

/// A completed call: its response, or why there is none.
pub type CallResult = Result<HttpResponse, CallFailure>;

/// A completed call's response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// `:status` first (as Envoy gives it to `proxy_on_http_call_response`), then the response
    /// headers in order, names lower-cased.
    pub headers: Headers,
    /// Body (bytes), de-chunked.
    pub body: Vec<u8>,
    /// Trailers of a chunked body, names lower-cased.
    pub trailers: Headers,
}

/// Why a call was not dispatched (no completion will come for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// A required pseudo-header is missing (`:method`, `:path` or `:authority`).
    MissingPseudoHeader(&'static str),
    /// A header name or value (or the method/path) contains CR, LF or NUL, or a name is empty.
    InvalidHeader,
    /// [`RunnerConfig::max_pending`] calls are already pending.
    TooManyPending,
    /// The background thread could not be started.
    Spawn(String),
}

impl std::fmt::Display for DispatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DispatchError::MissingPseudoHeader(h) => write!(f, "http call without {h}"),
            DispatchError::InvalidHeader => write!(f, "http call with an invalid header"),
            DispatchError::TooManyPending => write!(f, "too many pending http calls"),
            DispatchError::Spawn(e) => write!(f, "cannot start the http call thread: {e}"),
        }
    }
}

impl std::error::Error for DispatchError {}

/// Limits of a [`CallRunner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Background threads at most (calls beyond wait in the queue; a slow upstream ties up
    /// one thread until its deadline).
    pub max_threads: usize,
    /// Calls dispatched and not yet polled, at most.
    pub max_pending: usize,
    /// Largest response body accepted (bytes).
    pub max_body_bytes: usize,
}

impl Default for RunnerConfig {
    /// 4 threads, 1024 pending calls, 16 MiB bodies.
    fn default() -> Self {
        RunnerConfig {
            max_threads: 4,
            max_pending: 1024,
            max_body_bytes: 16 << 20,
        }
    }
}

struct Job<T> {
    tag: T,
    address: String,
    request: Prepared,
}

/// A validated request, ready for hyper.
struct Prepared {
    request: Request<Full<Bytes>>,
    deadline: Instant,
    steps: Option<StepTimeouts>,
}

struct Threads<T> {
    jobs: Sender<Job<T>>,
    done: Receiver<(T, CallResult)>,
    done_tx: Sender<(T, CallResult)>,
    job_rx: Arc<Mutex<Receiver<Job<T>>>>,
    idle: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
    spawned: usize,
    pid: u32,
}

/// Per-worker HTTP call runner (see the module documentation). `T` is whatever the caller
/// needs back with the completion (the call token, the `Vm` that made it...).
pub struct CallRunner<T: Send + 'static> {
    config: RunnerConfig,
    threads: Option<Threads<T>>,
    pending: usize,
    early: VecDeque<(T, CallResult)>,
    waker: Option<Waker>,
}

impl<T: Send + 'static> std::fmt::Debug for CallRunner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallRunner")
            .field("config", &self.config)
            .field("pending", &self.pending)
            .field("started", &self.threads.is_some())
            .finish()
    }
}

fn find<'a>(headers: &'a Headers, name: &[u8]) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn clean(b: &[u8]) -> bool {
    !b.iter().any(|c| matches!(c, b'\r' | b'\n' | 0))
}

const SKIPPED: [&[u8]; 5] = [
    b"connection",
    b"content-length",
    b"transfer-encoding",
    b"host",
    b"keep-alive",
];

fn prepare(request: &HttpRequest, now: Instant) -> Result<Prepared, DispatchError> {
    let method =
        find(&request.headers, b":method").ok_or(DispatchError::MissingPseudoHeader(":method"))?;
    let path =
        find(&request.headers, b":path").ok_or(DispatchError::MissingPseudoHeader(":path"))?;
    let authority = find(&request.headers, b":authority")
        .ok_or(DispatchError::MissingPseudoHeader(":authority"))?;
    let token = |b: &[u8]| !b.is_empty() && clean(b) && !b.contains(&b' ');
    if !token(method) || !token(path) || !clean(authority) {
        return Err(DispatchError::InvalidHeader);
    }
    let bodiless = [b"GET".as_slice(), b"HEAD", b"DELETE", b"OPTIONS"]
        .iter()
        .any(|m| method.eq_ignore_ascii_case(m));
    let mut call = Request::new(Full::new(Bytes::copy_from_slice(&request.body)));
    *call.method_mut() = Method::from_bytes(method).map_err(invalid)?;
    *call.uri_mut() = Uri::try_from(path).map_err(invalid)?;
    let headers = call.headers_mut();
    headers.append(HOST, HeaderValue::from_bytes(authority).map_err(invalid)?);
    for (k, v) in &request.headers {
        if k.first() == Some(&b':') || SKIPPED.iter().any(|s| k.eq_ignore_ascii_case(s)) {
            continue;
        }
        if !clean(k) || !clean(v) {
            return Err(DispatchError::InvalidHeader);
        }
        headers.append(
            HeaderName::from_bytes(k).map_err(invalid)?,
            HeaderValue::from_bytes(v).map_err(invalid)?,
        );
    }
    if !request.body.is_empty() || !bodiless {
        headers.append(CONTENT_LENGTH, HeaderValue::from(request.body.len()));
    }
    Ok(Prepared {
        request: call,
        deadline: now.checked_add(request.timeout).unwrap_or(now),
        steps: request.steps,
    })
}

impl<T: Send + 'static> CallRunner<T> {
    /// A runner; no thread starts until the first [`CallRunner::dispatch`].
    pub fn new(config: RunnerConfig) -> CallRunner<T> {
        CallRunner {
            config,
            threads: None,
            pending: 0,
            early: VecDeque::new(),
            waker: None,
        }
    }

    /// Installs the function a background thread calls after each completion it queued (e.g.
    /// writes an eventfd the worker's event loop watches; must not block). Threads started
    /// before keep the waker they started with.
    pub fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }

    /// Calls dispatched and not yet returned by [`CallRunner::poll`].
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// TCP connections the runner's threads opened so far (tests: proof of reuse).
    pub fn connections_opened(&self) -> usize {
        self.threads
            .as_ref()
            .map_or(0, |t| t.opened.load(Ordering::Relaxed))
    }

    /// Starts a call to `address` (`host:port`, resolved on the background thread) and returns
    /// at once; its completion comes from a later [`CallRunner::poll`] with `tag`.
    ///
    /// # Errors
    /// [`DispatchError`]; nothing is queued then.
    pub fn dispatch(
        &mut self,
        tag: T,
        address: &str,
        request: &HttpRequest,
    ) -> Result<(), DispatchError> {
        let prepared = prepare(request, Instant::now())?;
        if self.pending >= self.config.max_pending {
            return Err(DispatchError::TooManyPending);
        }
        let pid = std::process::id();
        if self.threads.as_ref().is_some_and(|t| t.pid != pid) {
            // Forked since the threads started: they do not exist in this process, and the
            // calls they had are lost with them.
            self.threads = None;
            self.pending = self.early.len();
        }
        if self.threads.is_none() {
            let (jobs, job_rx) = channel();
            let (done_tx, done) = channel();
            self.threads = Some(Threads {
                jobs,
                done,
                done_tx,
                job_rx: Arc::new(Mutex::new(job_rx)),
                idle: Arc::new(AtomicUsize::new(0)),
                opened: Arc::new(AtomicUsize::new(0)),
                spawned: 0,
                pid,
            });
        }
        let max_threads = self.config.max_threads.max(1);
        let max_body = self.config.max_body_bytes;
        let Some(threads) = self.threads.as_mut() else {
            return Err(DispatchError::Spawn("no runner".into()));
        };
        if threads.idle.load(Ordering::Acquire) == 0 && threads.spawned < max_threads {
            let job_rx = Arc::clone(&threads.job_rx);
            let done_tx = threads.done_tx.clone();
            let idle = Arc::clone(&threads.idle);
            let opened = Arc::clone(&threads.opened);
            let waker = self.waker.clone();
            std::thread::Builder::new()
                .name("tollgate-http".into())
                .spawn(move || {
                    worker_loop(&job_rx, &done_tx, &idle, &opened, max_body, waker.as_ref())
                })
                .map_err(|e| DispatchError::Spawn(e.to_string()))?;
            threads.spawned = threads.spawned.saturating_add(1);
        }
        let job = Job {
            tag,
            address: address.to_string(),
            request: prepared,
        };
        if let Err(std::sync::mpsc::SendError(job)) = threads.jobs.send(job) {
            // Every thread is gone (cannot happen while we hold `job_rx`): fail the call.
            self.early
                .push_back((job.tag, Err(CallFailure::Unavailable)));
            if let Some(wake) = &self.waker {
                wake();
            }
        }
        self.pending = self.pending.saturating_add(1);
        Ok(())
    }

    /// The calls completed since the last poll (`Err`: failed or timed out). Never blocks.
    pub fn poll(&mut self) -> Vec<(T, CallResult)> {
        let mut out: Vec<_> = self.early.drain(..).collect();
        if let Some(threads) = self.threads.as_ref() {
            while let Ok(done) = threads.done.try_recv() {
                out.push(done);
            }
        }
        self.pending = self.pending.saturating_sub(out.len());
        out
    }
}

fn worker_loop<T>(
    jobs: &Mutex<Receiver<Job<T>>>,
    done: &Sender<(T, CallResult)>,
    idle: &AtomicUsize,
    opened: &AtomicUsize,
    max_body: usize,
    waker: Option<&Waker>,
) {
    // One runtime per thread, for its whole life: calls on this thread run one at a time, so
    // a current-thread runtime (DNS on one blocking thread) is all they need.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(1)
        .thread_name("tollgate-http-dns")
        .build()
        .ok();
    let mut pool = Pool::default();
    loop {
        idle.fetch_add(1, Ordering::AcqRel);
        let job = {
            let rx = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        idle.fetch_sub(1, Ordering::AcqRel);
        let Ok(job) = job else { return };
        // Without a runtime (the process is out of file descriptors), every call fails.
        let response = runtime
            .as_ref()
            .map_or(Err(CallFailure::Unavailable), |rt| {
                let call = Call {
                    address: &job.address,
                    steps: job.request.steps,
                    max_body,
                    opened,
                };
                perform(rt, &mut pool, &call, job.request)
            });
        if done.send((job.tag, response)).is_err() {
            return;
        }
        if let Some(wake) = waker {
            wake();
        }
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Most bytes of a response head (headers as `name: value` lines) or of a trailer block; also
/// the most hyper buffers while it reads a head (at least 8 KiB).
pub const MAX_HEAD: usize = 64 * 1024;

/// What one call needs besides its request.
struct Call<'a> {
    address: &'a str,
    steps: Option<StepTimeouts>,
    max_body: usize,
    /// The runner's count of connections opened.
    opened: &'a AtomicUsize,
}

/// One call, from DNS to the last byte, within its deadline (and its steps' limits).
fn perform(runtime: &Runtime, pool: &mut Pool, call: &Call<'_>, request: Prepared) -> CallResult {
    let left = remaining(request.deadline).ok_or(CallFailure::Timeout)?;
    runtime.block_on(async move {
        tokio::time::timeout(left, exchange(pool, call, request.request))
            .await
            .unwrap_or(Err(CallFailure::Timeout))
    })
}

/// A connected stream to `address` (`host:port`): resolved, then each address tried in order.
async fn connect(
    address: &str,
    steps: Option<StepTimeouts>,
) -> Result<tokio::net::TcpStream, CallFailure> {
    let resolve = async {
        let found: Vec<std::net::SocketAddr> = tokio::net::lookup_host(address)
            .await
            .map_err(|_| CallFailure::Resolve)?
            .collect();
        Ok(found)
    };
    let addrs = match steps {
        Some(s) => tokio::time::timeout(s.resolve, resolve)
            .await
            .unwrap_or(Err(CallFailure::ResolveTimeout))?,
        None => resolve.await?,
    };
    let dial = async {
        for a in &addrs {
            if let Ok(stream) = tokio::net::TcpStream::connect(a).await {
                return Ok(stream);
            }
        }
        Err(CallFailure::Connect)
    };
    match steps {
        Some(s) => tokio::time::timeout(s.connect, dial)
            .await
            .unwrap_or(Err(CallFailure::ConnectTimeout)),
        None => dial.await,
    }
}

/// The call on the kept connection to its address when there is one, else (or when that one
/// turns out closed, see the module documentation) on a new connection; the connection is kept
/// for the next call after a complete response.
async fn exchange(pool: &mut Pool, call: &Call<'_>, request: Request<Full<Bytes>>) -> CallResult {
    let exchange_limit = call.steps.map(|s| s.exchange);
    let mut request = request;
    if let Some(kept) = pool.take(call.address, Instant::now()) {
        let replay = idempotent(request.method()).then(|| copy(&request));
        let late = Sent::Answered(Err(CallFailure::Timeout), None);
        match within(exchange_limit, late, send(kept, request, call.max_body)).await {
            Sent::Answered(result, connection) => {
                return keep(pool, call.address, result, connection)
            }
            Sent::Unsent(unsent) => request = unsent,
            Sent::Lost => match replay {
                Some(again) => request = again,
                None => return Err(CallFailure::Protocol),
            },
        }
    }
    let stream = connect(call.address, call.steps).await?;
    call.opened.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    let fresh = async {
        let handshake = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD)
            .handshake(TokioIo::new(stream))
            .await;
        let Ok((sender, connection)) = handshake else {
            return Sent::Answered(Err(CallFailure::Protocol), None);
        };
        let driver = AbortOnDrop(tokio::spawn(async move {
            let _ = connection.await;
        }));
        let connection = Connection {
            sender,
            _driver: driver,
        };
        send(connection, request, call.max_body).await
    };
    let late = Sent::Answered(Err(CallFailure::Timeout), None);
    match within(exchange_limit, late, fresh).await {
        Sent::Answered(result, connection) => keep(pool, call.address, result, connection),
        // A new connection that fails under its first request: nothing to send it again on.
        Sent::Unsent(_) | Sent::Lost => Err(CallFailure::Protocol),
    }
}

/// `result`, once its connection (when it can carry another call) is back in `pool`.
fn keep(
    pool: &mut Pool,
    address: &str,
    result: CallResult,
    connection: Option<Connection>,
) -> CallResult {
    if let Some(connection) = connection {
        pool.put(address, connection, Instant::now());
    }
    result
}

/// How a request on one connection ended.
enum Sent {
    /// A response (or a failure reading it); the connection when it can carry another call.
    Answered(CallResult, Option<Connection>),
    /// The connection was closed before the request went out: the request, untouched.
    Unsent(Request<Full<Bytes>>),
    /// The connection closed after the request went out and before any response.
    Lost,
}

/// `request` on `connection`, and the response read whole.
async fn send(mut connection: Connection, request: Request<Full<Bytes>>, max_body: usize) -> Sent {
    // Lets the connection's driver see a close that arrived while the thread was idle.
    tokio::task::yield_now().await;
    if connection.sender.ready().await.is_err() {
        return Sent::Unsent(request);
    }
    match connection.sender.try_send_request(request).await {
        Ok(response) => {
            let result = read_response(response, max_body).await;
            let reusable = result.is_ok();
            Sent::Answered(result, reusable.then_some(connection))
        }
        Err(mut e) => match e.take_message() {
            Some(unsent) => Sent::Unsent(unsent),
            None => {
                // The connection failed under the request (closed, or reset because the
                // server had closed it with the request unread); a malformed answer is not that.
                let error = e.into_error();
                if error.is_parse() || error.is_parse_status() || error.is_user() {
                    Sent::Answered(Err(CallFailure::Protocol), None)
                } else {
                    Sent::Lost
                }
            }
        },
    }
}

/// `fut` within `limit` (none: as long as the call's deadline allows); `late` past it.
async fn within<R, F: std::future::Future<Output = R>>(
    limit: Option<Duration>,
    late: R,
    fut: F,
) -> R {
    match limit {
        Some(limit) => tokio::time::timeout(limit, fut).await.unwrap_or(late),
        None => fut.await,
    }
}

/// RFC 9110 section 9.2.2: a request whose method is idempotent may be sent again when its
/// connection closed before any response.
fn idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// A copy of `request` for a replay (its body is a reference-counted `Bytes`).
fn copy(request: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut again = Request::new(request.body().clone());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.headers_mut() = request.headers().clone();
    again
}

async fn read_response(response: hyper::Response<Incoming>, max_body: usize) -> CallResult {
    let (parts, mut body) = response.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| u64::try_from(max_body).is_ok_and(|max| n > max)) {
        return Err(CallFailure::TooLarge);
    }
    // hyper's read buffer limit is approximate; the head's size is checked here exactly.
    if block_bytes(&parts.headers) > MAX_HEAD {
        return Err(CallFailure::TooLarge);
    }
    let status = parts.status.as_u16();
    let mut out = HttpResponse {
        status,
        headers: Vec::with_capacity(parts.headers.len().saturating_add(1)),
        body: Vec::new(),
        trailers: Vec::new(),
    };
    out.headers
        .push((b":status".to_vec(), status.to_string().into_bytes()));
    out.headers.extend(pairs(&parts.headers));
    while let Some(frame) = body.frame().await {
        match frame.map_err(|_| CallFailure::Protocol)?.into_data() {
            Ok(data) => {
                if out.body.len().saturating_add(data.len()) > max_body {
                    return Err(CallFailure::TooLarge);
                }
                out.body.extend_from_slice(&data);
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    if block_bytes(&trailers) > MAX_HEAD {
                        return Err(CallFailure::TooLarge);
                    }
                    out.trailers.extend(pairs(&trailers));
                }
            }
        }
    }
    Ok(out)
}

/// Any malformed part of a call is [`DispatchError::InvalidHeader`].
fn invalid<E>(_: E) -> DispatchError {
    DispatchError::InvalidHeader
}

/// Bytes of a header block as `name: value\r\n` lines.
fn block_bytes(map: &http::HeaderMap) -> usize {
    map.iter().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.as_str().len())
            .saturating_add(v.len())
            .saturating_add(4)
    })
}

/// A header map as (name, value) pairs, names lower-cased (as `http` keeps them); also the
/// gRPC client's metadata.
pub(crate) fn pairs(map: &http::HeaderMap) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
    map.iter()
        .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn request(
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> HttpRequest {
        let mut headers: Headers = vec![
            (b":method".to_vec(), method.as_bytes().to_vec()),
            (b":path".to_vec(), path.as_bytes().to_vec()),
            (b":authority".to_vec(), b"jwks.example".to_vec()),
        ];
        headers.extend(
            extra
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
        );
        HttpRequest {
            headers,
            body: body.to_vec(),
            timeout: Duration::from_millis(timeout_ms),
            steps: None,
        }
    }

    /// A one-shot server on a thread: reads one request (head + content-length body), hands it
    /// to the test through the returned receiver, answers `response` and closes.
    fn serve_once(response: &'static [u8]) -> (String, Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = tx.send(read_request(&mut s).unwrap_or_default());
            s.write_all(response).unwrap();
        });
        (addr, rx)
    }

    fn wait_all<T: Send + 'static>(runner: &mut CallRunner<T>, n: usize) -> Vec<(T, CallResult)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            assert!(Instant::now() < deadline, "calls did not complete");
            out.extend(runner.poll());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(runner.pending(), 0);
        out
    }

    /// One request read from `s` (head and a `content-length` body); `None` when the client
    /// closed first.
    fn read_request(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if got.len() >= end + 4 + len {
                    return Some(got);
                }
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// A server whose `i`-th connection (from 0) is handed to `script(i, stream)` on a thread of
    /// its own; returns its address and the requests it read, in order.
    fn serve_script(
        script: impl Fn(usize, &mut std::net::TcpStream, &Sender<Vec<u8>>) + Send + Sync + 'static,
    ) -> (String, Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = channel();
        let script = Arc::new(script);
        std::thread::spawn(move || {
            for (i, conn) in listener.incoming().enumerate() {
                let Ok(mut s) = conn else { return };
                let (script, tx) = (Arc::clone(&script), tx.clone());
                std::thread::spawn(move || script(i, &mut s, &tx));
            }
        });
        (addr, rx)
    }

    /// Answers every request on the connection with `ok <n>` (n counts the connection's
    /// requests), keeping it open, as HTTP/1.1 servers do.
    fn keep_alive(_: usize, s: &mut std::net::TcpStream, seen: &Sender<Vec<u8>>) {
        let mut n = 0;
        while let Some(req) = read_request(s) {
            let _ = seen.send(req);
            n += 1;
            let body = format!("ok {n}");
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            if s.write_all(format!("{head}{body}").as_bytes()).is_err() {
                return;
            }
        }
    }

    fn call_one(runner: &mut CallRunner<u32>, addr: &str, req: &HttpRequest) -> CallResult {
        runner.dispatch(0, addr, req).unwrap();
        wait_all(runner, 1).remove(0).1
    }

    #[test]
    fn sequential_calls_to_one_address_share_one_connection() {
        let (addr, seen) = serve_script(keep_alive);
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 1,
            ..RunnerConfig::default()
        });
        for i in 1..=10 {
            let method = if i % 2 == 0 { "POST" } else { "GET" };
            let resp = call_one(&mut runner, &addr, &request(method, "/", &[], b"x", 2000));
            // The server's count of requests on this connection: the same connection each time.
            assert_eq!(resp.unwrap().body, format!("ok {i}").into_bytes());
        }
        assert_eq!(runner.connections_opened(), 1);
        assert_eq!(seen.try_iter().count(), 10);
    }

    #[test]
    fn a_kept_connection_closed_by_its_server_is_replaced_before_the_request_goes_out() {
        // One request a connection, then the server closes it (an idle timeout of 0).
        let (addr, seen) = serve_script(|_, s, seen| {
            if let Some(req) = read_request(s) {
                let _ = seen.send(req);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
            }
        });
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 1,
            ..RunnerConfig::default()
        });
        for method in ["GET", "POST", "GET", "POST"] {
            let resp = call_one(&mut runner, &addr, &request(method, "/", &[], b"x", 2000));
            assert_eq!(resp.unwrap().body, b"ok");
            // Time for the server's close to arrive before the next call.
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(runner.connections_opened(), 4);
        // Each request reached the server once: no POST sent twice.
        assert_eq!(seen.try_iter().count(), 4);
    }

    /// A server that answers the first request of its first connection, then reads the
    /// second and closes without an answer (the race of a keep-alive timeout, or a hostile
    /// server); every later connection is [`keep_alive`].
    fn drops_the_second_request() -> (String, Receiver<Vec<u8>>) {
        serve_script(|i, s, seen| {
            if i > 0 {
                return keep_alive(i, s, seen);
            }
            if let Some(req) = read_request(s) {
                let _ = seen.send(req);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst");
            }
            if let Some(req) = read_request(s) {
                let _ = seen.send(req);
            }
        })
    }

    #[test]
    fn a_request_lost_on_a_kept_connection_is_replayed_only_when_idempotent() {
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 1,
            ..RunnerConfig::default()
        });
        let (addr, seen) = drops_the_second_request();
        let get = request("GET", "/jwks", &[], b"", 2000);
        assert_eq!(call_one(&mut runner, &addr, &get).unwrap().body, b"first");
        assert_eq!(call_one(&mut runner, &addr, &get).unwrap().body, b"ok 1");
        assert_eq!(seen.try_iter().count(), 3, "the GET was sent again");

        let (addr, seen) = drops_the_second_request();
        let post = request("POST", "/book", &[], b"1 unit", 2000);
        assert_eq!(call_one(&mut runner, &addr, &post).unwrap().body, b"first");
        assert_eq!(
            call_one(&mut runner, &addr, &post),
            Err(CallFailure::Protocol)
        );
        assert_eq!(seen.try_iter().count(), 2, "the POST was not sent again");
        assert_eq!(runner.connections_opened(), 3);
    }

    #[test]
    fn an_unsolicited_response_on_a_kept_connection_never_answers_the_next_call() {
        // A hostile server sends a second, forged response right behind the first (in the same
        // write and later, while the connection is idle): the next call must get the answer to
        // its own request, on a connection whose stream is not out of step.
        let (addr, seen) = serve_script(|_, s, seen| {
            let mut n = 0;
            while let Some(req) = read_request(s) {
                let _ = seen.send(req);
                n += 1;
                let body = format!("ok {n}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let forged = "HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nforged";
                if s.write_all(format!("{answer}{forged}").as_bytes()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
                let _ = s.write_all(forged.as_bytes());
            }
        });
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 1,
            ..RunnerConfig::default()
        });
        for _ in 0..4 {
            let get = request("GET", "/", &[], b"", 2000);
            let resp = call_one(&mut runner, &addr, &get);
            assert_eq!(
                resp.unwrap().body,
                b"ok 1",
                "the forged response answered a call"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(seen.try_iter().count(), 4);
    }

    #[test]
    fn connection_close_and_failed_calls_do_not_keep_the_connection() {
        // `connection: close` from the server; then a body over the cap on a keep-alive server.
        let (addr, _) = serve_script(|_, s, _| {
            if read_request(s).is_some() {
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                );
                // Held open: only the header tells the client not to reuse it.
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 1,
            max_body_bytes: 4,
            ..RunnerConfig::default()
        });
        let get = request("GET", "/", &[], b"", 2000);
        for _ in 0..3 {
            assert_eq!(call_one(&mut runner, &addr, &get).unwrap().body, b"ok");
        }
        assert_eq!(runner.connections_opened(), 3);
        let (big, _) = serve_script(|_, s, _| {
            while read_request(s).is_some() {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ntoo large");
            }
        });
        for _ in 0..2 {
            assert_eq!(
                call_one(&mut runner, &big, &get),
                Err(CallFailure::TooLarge)
            );
        }
        assert_eq!(runner.connections_opened(), 5);
    }

    #[test]
    fn get_with_content_length() {
        let (addr, seen) = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Multi: a\r\nX-Multi: b\r\nContent-Length: 11\r\n\r\n{\"keys\":[]}",
        );
        let mut runner = CallRunner::new(RunnerConfig::default());
        let req = request(
            "GET",
            "/.well-known/jwks.json",
            &[("accept", "application/json"), ("host", "ignored")],
            b"",
            2000,
        );
        runner.dispatch(7u32, &addr, &req).unwrap();
        assert_eq!(runner.pending(), 1);
        let done = wait_all(&mut runner, 1);
        let (tag, Ok(resp)) = &done[0] else {
            panic!("{done:?}")
        };
        assert_eq!(*tag, 7);
        assert_eq!(resp.status, 200);
        assert_eq!(
            resp.headers,
            vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"content-type".to_vec(), b"application/json".to_vec()),
                (b"x-multi".to_vec(), b"a".to_vec()),
                (b"x-multi".to_vec(), b"b".to_vec()),
                (b"content-length".to_vec(), b"11".to_vec()),
            ]
        );
        assert_eq!(resp.body, b"{\"keys\":[]}");
        // Persistent by default (RFC 9112 section 9.3): no `connection` header.
        let sent = String::from_utf8(seen.recv().unwrap()).unwrap();
        assert_eq!(
            sent,
            "GET /.well-known/jwks.json HTTP/1.1\r\nhost: jwks.example\r\naccept: application/json\r\n\r\n"
        );
    }

    #[test]
    fn post_with_chunked_response_and_trailers() {
        let (addr, seen) = serve_once(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n",
        );
        let mut runner = CallRunner::new(RunnerConfig::default());
        runner
            .dispatch(
                "t",
                &addr,
                &request("POST", "/v1/x", &[], b"{\"a\":1}", 2000),
            )
            .unwrap();
        let done = wait_all(&mut runner, 1);
        let Ok(resp) = &done[0].1 else { panic!() };
        assert_eq!(resp.status, 201);
        assert_eq!(resp.body, b"hello world");
        assert_eq!(
            resp.trailers,
            vec![(b"x-checksum".to_vec(), b"abc".to_vec())]
        );
        let sent = String::from_utf8(seen.recv().unwrap()).unwrap();
        assert!(sent.starts_with("POST /v1/x HTTP/1.1\r\n"), "{sent}");
        assert!(sent.contains("content-length: 7\r\n"), "{sent}");
        assert!(sent.ends_with("\r\n\r\n{\"a\":1}"), "{sent}");
    }

    #[test]
    fn body_until_close_and_no_body_for_204() {
        let (addr, _) = serve_once(b"HTTP/1.0 200 OK\r\n\r\nstreamed until close");
        let (addr2, _) = serve_once(b"HTTP/1.1 204 No Content\r\n\r\n");
        let mut runner = CallRunner::new(RunnerConfig::default());
        runner
            .dispatch(1, &addr, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        runner
            .dispatch(2, &addr2, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        let mut done = wait_all(&mut runner, 2);
        done.sort_by_key(|d| d.0);
        assert_eq!(done[0].1.as_ref().unwrap().body, b"streamed until close");
        assert_eq!(done[1].1.as_ref().unwrap().status, 204);
        assert!(done[1].1.as_ref().unwrap().body.is_empty());
    }

    /// A server that accepts and stays silent for 1.5 s (its address, and the thread to join),
    /// and an address nothing listens on any more.
    fn silent_and_closed() -> (String, std::thread::JoinHandle<()>, String) {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let hold = std::thread::spawn(move || {
            let conn = silent.accept();
            std::thread::sleep(Duration::from_millis(1500));
            drop(conn);
        });
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        (silent_addr, hold, closed_addr)
    }

    #[test]
    fn timeout_and_refused_yield_none() {
        let (silent_addr, hold, closed_addr) = silent_and_closed();
        let mut runner = CallRunner::new(RunnerConfig::default());
        let start = Instant::now();
        runner
            .dispatch("timeout", &silent_addr, &request("GET", "/", &[], b"", 200))
            .unwrap();
        runner
            .dispatch(
                "refused",
                &closed_addr,
                &request("GET", "/", &[], b"", 2000),
            )
            .unwrap();
        runner
            .dispatch(
                "dns",
                "no-such-host.invalid:80",
                &request("GET", "/", &[], b"", 2000),
            )
            .unwrap();
        let done = wait_all(&mut runner, 3);
        assert!(done.iter().all(|(_, r)| r.is_err()), "{done:?}");
        // The timeout held: well under the server's 1.5 s silence.
        assert!(
            start.elapsed() < Duration::from_millis(1200),
            "{:?}",
            start.elapsed()
        );
        hold.join().unwrap();
    }

    #[test]
    fn step_timeouts_bound_each_step_and_name_the_failure() {
        // Accepts and never answers: the exchange step's limit ends the call, long before
        // the overall deadline.
        let (silent_addr, hold, closed_addr) = silent_and_closed();
        let steps = StepTimeouts {
            resolve: Duration::from_secs(2),
            connect: Duration::from_secs(2),
            exchange: Duration::from_millis(300),
        };
        let with_steps = |r: HttpRequest| HttpRequest {
            steps: Some(steps),
            ..r
        };
        let mut runner = CallRunner::new(RunnerConfig::default());
        let start = Instant::now();
        let slow = with_steps(request("GET", "/", &[], b"", 10_000));
        runner.dispatch("silent", &silent_addr, &slow).unwrap();
        let refused = with_steps(request("GET", "/", &[], b"", 10_000));
        runner.dispatch("refused", &closed_addr, &refused).unwrap();
        let dns = with_steps(request("GET", "/", &[], b"", 10_000));
        runner
            .dispatch("dns", "no-such-host.invalid:80", &dns)
            .unwrap();
        let mut done = wait_all(&mut runner, 3);
        done.sort_by_key(|(t, _)| *t);
        assert_eq!(done[0], ("dns", Err(CallFailure::Resolve)));
        assert_eq!(done[1], ("refused", Err(CallFailure::Connect)));
        assert_eq!(done[2], ("silent", Err(CallFailure::Timeout)));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(1400), "{took:?}");
        hold.join().unwrap();
    }

    #[test]
    fn oversized_and_malformed_responses_yield_none() {
        let (addr, _) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
        let (addr2, _) = serve_once(b"garbage\r\n\r\n");
        let mut runner = CallRunner::new(RunnerConfig {
            max_body_bytes: 10,
            ..RunnerConfig::default()
        });
        runner
            .dispatch(1, &addr, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        runner
            .dispatch(2, &addr2, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        let done = wait_all(&mut runner, 2);
        assert!(done.iter().all(|(_, r)| r.is_err()), "{done:?}");
    }

    /// Serves `head` then drips `body` one byte every `gap` (a hostile or broken upstream).
    fn serve_slowly(head: Vec<u8>, body: Vec<u8>, gap: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            if s.write_all(&head).is_err() {
                return;
            }
            for b in body {
                std::thread::sleep(gap);
                if s.write_all(&[b]).is_err() {
                    return;
                }
            }
        });
        addr
    }

    #[test]
    fn hostile_upstreams_cannot_stretch_or_bloat_a_call() {
        let mut runner = CallRunner::new(RunnerConfig {
            max_body_bytes: 1000,
            ..RunnerConfig::default()
        });
        // A byte every 50 ms keeps each read short: only the overall deadline ends the call.
        let drip = serve_slowly(
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n".to_vec(),
            vec![b'x'; 100],
            Duration::from_millis(50),
        );
        // A chunked body over the cap, with no content-length to refuse it early.
        let mut chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..3 {
            chunked.extend_from_slice(b"1f4\r\n");
            chunked.extend_from_slice(&[b'y'; 500]);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let big = serve_slowly(chunked, Vec::new(), Duration::ZERO);
        // A response head past MAX_HEAD.
        let mut head = b"HTTP/1.1 200 OK\r\nx-pad: ".to_vec();
        head.extend(std::iter::repeat_n(b'p', MAX_HEAD + 1024));
        head.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        let fat_head = serve_slowly(head, Vec::new(), Duration::ZERO);
        let start = Instant::now();
        runner
            .dispatch("drip", &drip, &request("GET", "/", &[], b"", 300))
            .unwrap();
        runner
            .dispatch("big", &big, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        runner
            .dispatch("head", &fat_head, &request("GET", "/", &[], b"", 2000))
            .unwrap();
        let done = wait_all(&mut runner, 3);
        let answered: Vec<_> = done
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|d| d.0)
            .collect();
        assert!(answered.is_empty(), "answered: {answered:?}");
        // The drip took 5 s to finish; the call ended at its 300 ms deadline.
        assert!(
            start.elapsed() < Duration::from_millis(2000),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn dispatch_checks_the_call_shape() {
        let mut runner: CallRunner<u32> = CallRunner::new(RunnerConfig {
            max_pending: 1,
            ..RunnerConfig::default()
        });
        let mut r = request("GET", "/", &[], b"", 100);
        r.headers.retain(|(k, _)| k != b":path");
        assert_eq!(
            runner.dispatch(1, "127.0.0.1:1", &r),
            Err(DispatchError::MissingPseudoHeader(":path"))
        );
        let r = request("GET", "/", &[("x", "a\r\nevil: 1")], b"", 100);
        assert_eq!(
            runner.dispatch(1, "127.0.0.1:1", &r),
            Err(DispatchError::InvalidHeader)
        );
        let r = request("GET /x", "/", &[], b"", 100);
        assert_eq!(
            runner.dispatch(1, "127.0.0.1:1", &r),
            Err(DispatchError::InvalidHeader)
        );
        // No thread was started for refused calls.
        assert!(runner.threads.is_none());
        let ok = request("GET", "/", &[], b"", 100);
        runner.dispatch(1, "127.0.0.1:1", &ok).unwrap();
        assert_eq!(
            runner.dispatch(2, "127.0.0.1:1", &ok),
            Err(DispatchError::TooManyPending)
        );
        wait_all(&mut runner, 1);
    }

    #[test]
    fn many_calls_complete_with_a_few_threads() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming().take(20) {
                let mut s = conn.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = s.read(&mut buf).unwrap();
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    let path = String::from_utf8_lossy(&got)
                        .split(' ')
                        .nth(1)
                        .unwrap()
                        .to_string();
                    let body = format!("you asked {path}");
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        let mut runner = CallRunner::new(RunnerConfig {
            max_threads: 3,
            ..RunnerConfig::default()
        });
        for i in 0..20u32 {
            runner
                .dispatch(i, &addr, &request("GET", &format!("/{i}"), &[], b"", 5000))
                .unwrap();
        }
        let done = wait_all(&mut runner, 20);
        assert!(runner.threads.as_ref().unwrap().spawned <= 3);
        for (i, resp) in done {
            assert_eq!(resp.unwrap().body, format!("you asked /{i}").into_bytes());
        }
    }
}
