//! `proxy_grpc_call` (unary gRPC) without blocking an nginx worker: a [`GrpcRunner`] hands each
//! call to one background thread of the worker process (started on the first dispatch, never in
//! the nginx master; restarted if the process finds itself forked), which runs every call of the
//! worker on one current-thread tokio runtime, and queues the completions; the worker collects
//! them with [`GrpcRunner::poll`] (non-blocking), woken by the [`Waker`] it installed.
//!
//! # Transport: gRPC over HTTP/2 cleartext, prior knowledge
//! hyper's HTTP/2 client (`hyper::client::conn::http2`, on the `h2` crate) over TCP, no TLS, no
//! upgrade. One connection per address (`host:port`), opened on the first call to it and shared
//! by every later call as HTTP/2 streams (multiplexed; concurrent first calls wait for the one
//! connect); a connection that closed or broke is replaced on the next call (reconnect). Each
//! call is `POST /{service}/{method}` with `:authority` the upstream name the filter gave (Envoy:
//! the cluster name, `AsyncStreamImpl::initialize` in source/common/grpc/async_client_impl.cc),
//! `content-type: application/grpc`, `te: trailers`, `grpc-timeout` from the call's deadline
//! (gRPC's PROTOCOL-HTTP2.md), the filter's initial metadata, and one length-prefixed message
//! (flag 0, 4-byte big-endian length, the bytes).
//!
//! # The reply, as Envoy's gRPC async client reads it
//! (source/common/grpc/async_client_impl.cc: `AsyncStreamImpl::onHeaders`, `onData`,
//! `onTrailers`, `onReset`, `AsyncRequestImpl::onRemoteClose`):
//! - HTTP status other than 200: the `grpc-status` of a trailers-only reply (headers with
//!   END_STREAM) when there is one, else the status mapped by `Grpc::Utility::httpToGrpcStatus`
//!   ([`http_to_grpc_status`]: 400 Internal, 401 Unauthenticated, 403 PermissionDenied, 404
//!   Unimplemented, 429/502/503/504 Unavailable, anything else Unknown);
//! - `grpc-status` and `grpc-message` (percent-decoded) from the trailers, or from the headers of
//!   a trailers-only reply; missing: Unknown; not a number or above 16: Envoy's `InvalidCode`
//!   (-1, which reaches the filter as `u32::MAX`, [`INVALID_CODE`]);
//! - the length-prefixed messages: a set compressed flag, a malformed prefix or a message cut
//!   short by the end of the stream is Internal (Envoy ignores a cut-short tail after a complete
//!   message; this host fails the call, closed rather than open); a message above
//!   [`GrpcConfig::max_message_bytes`] is ResourceExhausted (Envoy's decoder's
//!   `max_recv_message_length`); the last complete message is the reply (Envoy keeps the last);
//! - status OK without a message: Internal, empty message (`AsyncRequestImpl::onRemoteClose`);
//! - the stream reset or the connection closed before the end: Internal (`onReset`);
//! - no connection (DNS, refused) or the deadline passed: Unavailable (14), with a message, as
//!   the trailers-only local reply Envoy's router gives a gRPC request (503 "upstream connect
//!   error", 504 "upstream request timeout", `Utility::prepareLocalReply` in
//!   source/common/http/utility.cc maps them with `httpToGrpcStatus`).
//!
//! A call cancelled with [`GrpcRunner::cancel`] never completes; its HTTP/2 stream is reset
//! (the call's future is dropped, which makes hyper send RST_STREAM) and the connection stays.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::http_client::{pairs, Headers};

// The status codes and the HTTP mapping live in `grpc_status.rs` (shared with the nginx
// module's local replies to gRPC requests); re-exported here, where the client's API had them.
pub use crate::grpc_status::{http_to_grpc_status, status};

/// Envoy's `Grpc::Status::WellKnownGrpcStatus::InvalidCode` (-1) as the `u32` the filter's
/// `proxy_on_grpc_close` receives: a `grpc-status` that is not a number or is above 16
/// (`Common::getGrpcStatus`, source/common/grpc/common.cc).
pub const INVALID_CODE: u32 = u32::MAX;

/// One unary call as the filter dispatched it.
#[derive(Debug, Clone, Default)]
pub struct GrpcRequest {
    /// `:authority` (the upstream name the filter gave).
    pub authority: String,
    /// Fully qualified service, e.g. `envoy.service.ratelimit.v3.RateLimitService`.
    pub service: String,
    /// Method, e.g. `ShouldRateLimit`.
    pub method: String,
    /// Initial metadata (request headers), names as given (lower-cased here).
    pub metadata: Headers,
    /// The serialized request message (without the 5-byte prefix).
    pub message: Vec<u8>,
    /// Deadline from dispatch to the end of the reply; zero: [`GrpcConfig::default_timeout`].
    pub timeout: Duration,
}

/// How a call ended: what `proxy_on_grpc_receive` / `proxy_on_grpc_close` deliver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcReply {
    /// gRPC status (0 OK; [`INVALID_CODE`] for a status Envoy calls invalid).
    pub status: u32,
    /// `grpc-message` percent-decoded (UTF-8, lossy), or this client's reason for a status it
    /// made itself.
    pub message: String,
    /// The reply message on OK (`None` otherwise).
    pub body: Option<Vec<u8>>,
    /// Response headers (initial metadata), names lower-cased, `:status` left out.
    pub initial_metadata: Headers,
    /// Trailers (trailing metadata), names lower-cased.
    pub trailing_metadata: Headers,
}

impl GrpcReply {
    fn failed(status: u32, message: &str) -> GrpcReply {
        GrpcReply {
            status,
            message: message.to_owned(),
            ..GrpcReply::default()
        }
    }
}

/// Why a call was not dispatched (no completion will come for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcDispatchError {
    /// Service or method empty, or not usable in a path (`/`, space, control bytes).
    InvalidName,
    /// A metadata name or value is not a valid HTTP/2 header field.
    InvalidMetadata,
    /// [`GrpcConfig::max_pending`] calls are pending.
    TooManyPending,
    /// The background thread could not be started.
    Spawn(String),
}

impl std::fmt::Display for GrpcDispatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcDispatchError::InvalidName => {
                f.write_str("grpc call with an invalid service or method name")
            }
            GrpcDispatchError::InvalidMetadata => {
                f.write_str("grpc call with invalid initial metadata")
            }
            GrpcDispatchError::TooManyPending => f.write_str("too many pending grpc calls"),
            GrpcDispatchError::Spawn(e) => write!(f, "cannot start the grpc call thread: {e}"),
        }
    }
}

impl std::error::Error for GrpcDispatchError {}

/// Limits of a [`GrpcRunner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcConfig {
    /// Calls dispatched and not yet polled or cancelled, at most.
    pub max_pending: usize,
    /// Largest reply message accepted (bytes, without the prefix); larger: ResourceExhausted.
    pub max_message_bytes: usize,
    /// Deadline of a call dispatched with a zero timeout.
    pub default_timeout: Duration,
}

impl Default for GrpcConfig {
    /// 1024 pending calls, 4 MiB messages (gRPC's default receive limit), 10 s default deadline.
    fn default() -> Self {
        GrpcConfig {
            max_pending: 1024,
            max_message_bytes: 4 << 20,
            default_timeout: Duration::from_secs(10),
        }
    }
}

pub use crate::http_client::Waker;

/// A call's id in its runner (for [`GrpcRunner::cancel`]).
pub type CallId = u64;

struct Job {
    id: CallId,
    address: String,
    request: Request<Full<Bytes>>,
    deadline: Instant,
}

enum Msg {
    Call(Box<Job>),
    Cancel(CallId),
}

struct Thread {
    jobs: UnboundedSender<Msg>,
    done: Receiver<(CallId, GrpcReply)>,
    pid: u32,
    /// Connections opened so far (tests: proof of reuse).
    connects: Arc<std::sync::atomic::AtomicUsize>,
}

/// Per-worker unary gRPC runner (see the module documentation). `T` is whatever the caller
/// needs back with the completion (the call token, the `Vm` that made it...).
pub struct GrpcRunner<T> {
    config: GrpcConfig,
    thread: Option<Thread>,
    next_id: CallId,
    live: HashMap<CallId, T>,
    early: VecDeque<(CallId, GrpcReply)>,
    waker: Option<Waker>,
}

impl<T> std::fmt::Debug for GrpcRunner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcRunner")
            .field("config", &self.config)
            .field("pending", &self.live.len())
            .field("started", &self.thread.is_some())
            .finish()
    }
}

/// Names a gRPC path segment may hold: not empty, no `/`, space, `?`, `#` or control bytes.
fn path_segment(s: &str) -> bool {
    !s.is_empty()
        && !s
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || matches!(b, b'/' | b'?' | b'#'))
}

/// Request headers this client sets itself or HTTP/2 forbids; a filter's copy is dropped.
const RESERVED: [&str; 9] = [
    "content-type",
    "te",
    "grpc-timeout",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// `grpc-timeout` of a deadline (PROTOCOL-HTTP2.md: at most 8 digits and a unit), rounded up.
fn grpc_timeout(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        let s = d.as_secs().saturating_add(1).min(99_999_999);
        format!("{s}S")
    }
}

fn prepare(
    request: &GrpcRequest,
    timeout: Duration,
) -> Result<Request<Full<Bytes>>, GrpcDispatchError> {
    if !path_segment(&request.service) || !path_segment(&request.method) {
        return Err(GrpcDispatchError::InvalidName);
    }
    let uri = format!(
        "http://{}/{}/{}",
        request.authority, request.service, request.method
    );
    let uri = Uri::try_from(uri).map_err(|_| GrpcDispatchError::InvalidName)?;
    let len = u32::try_from(request.message.len()).map_err(|_| GrpcDispatchError::InvalidName)?;
    let mut body = BytesMut::with_capacity(request.message.len().saturating_add(5));
    body.extend_from_slice(&[0]);
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(&request.message);
    let mut call = Request::new(Full::new(body.freeze()));
    *call.method_mut() = Method::POST;
    *call.uri_mut() = uri;
    *call.version_mut() = http::Version::HTTP_2;
    let headers = call.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    let timeout = HeaderValue::from_str(&grpc_timeout(timeout))
        .map_err(|_| GrpcDispatchError::InvalidMetadata)?;
    headers.insert(HeaderName::from_static("grpc-timeout"), timeout);
    for (k, v) in &request.metadata {
        if k.first() == Some(&b':') {
            continue;
        }
        let name = HeaderName::from_bytes(&k.to_ascii_lowercase())
            .map_err(|_| GrpcDispatchError::InvalidMetadata)?;
        if RESERVED.contains(&name.as_str()) {
            continue;
        }
        let value = HeaderValue::from_bytes(v).map_err(|_| GrpcDispatchError::InvalidMetadata)?;
        headers.append(name, value);
    }
    Ok(call)
}

impl<T> GrpcRunner<T> {
    /// A runner; no thread starts until the first [`GrpcRunner::dispatch`].
    pub fn new(config: GrpcConfig) -> GrpcRunner<T> {
        GrpcRunner {
            config,
            thread: None,
            next_id: 1,
            live: HashMap::new(),
            early: VecDeque::new(),
            waker: None,
        }
    }

    /// Installs the function the background thread calls after each completion (see
    /// [`Waker`]); calls dispatched before keep the waker they started with.
    pub fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }

    /// Calls dispatched and neither polled nor cancelled.
    pub fn pending(&self) -> usize {
        self.live.len()
    }

    /// TCP connections the runner's thread opened so far (every address together).
    pub fn connections_opened(&self) -> usize {
        self.thread
            .as_ref()
            .map_or(0, |t| t.connects.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Starts a unary call to `address` (`host:port`, resolved on the background thread) and
    /// returns its id at once; its completion comes from a later [`GrpcRunner::poll`] with `tag`.
    ///
    /// # Errors
    /// [`GrpcDispatchError`]; nothing is queued then.
    pub fn dispatch(
        &mut self,
        tag: T,
        address: &str,
        request: &GrpcRequest,
    ) -> Result<CallId, GrpcDispatchError> {
        let timeout = if request.timeout.is_zero() {
            self.config.default_timeout
        } else {
            request.timeout
        };
        let prepared = prepare(request, timeout)?;
        if self.live.len() >= self.config.max_pending {
            return Err(GrpcDispatchError::TooManyPending);
        }
        let pid = std::process::id();
        if self.thread.as_ref().is_some_and(|t| t.pid != pid) {
            // Forked since the thread started: it does not exist in this process, and its
            // calls are lost with it.
            self.thread = None;
            self.live.clear();
        }
        if self.thread.is_none() {
            self.thread = Some(self.spawn(pid)?);
        }
        let Some(thread) = self.thread.as_ref() else {
            return Err(GrpcDispatchError::Spawn("no thread".into()));
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let now = Instant::now();
        let job = Job {
            id,
            address: address.to_owned(),
            request: prepared,
            deadline: now.checked_add(timeout).unwrap_or(now),
        };
        if thread.jobs.send(Msg::Call(Box::new(job))).is_err() {
            // The thread is gone (its runtime could not start): fail the call.
            self.early.push_back((
                id,
                GrpcReply::failed(status::UNAVAILABLE, "no grpc call thread"),
            ));
            if let Some(wake) = &self.waker {
                wake();
            }
        }
        self.live.insert(id, tag);
        Ok(id)
    }

    fn spawn(&self, pid: u32) -> Result<Thread, GrpcDispatchError> {
        let (jobs, job_rx) = unbounded_channel();
        let (done_tx, done) = channel();
        let connects = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ctx = Shared {
            done: done_tx,
            waker: self.waker.clone(),
            max_message: self.config.max_message_bytes,
            connects: Arc::clone(&connects),
        };
        std::thread::Builder::new()
            .name("tollgate-grpc".into())
            .spawn(move || thread_main(job_rx, ctx))
            .map_err(|e| GrpcDispatchError::Spawn(e.to_string()))?;
        Ok(Thread {
            jobs,
            done,
            pid,
            connects,
        })
    }

    /// Cancels a pending call: it will not complete, its stream is reset. `false` when `id` is
    /// not pending (completed and polled, cancelled, unknown).
    pub fn cancel(&mut self, id: CallId) -> bool {
        if self.live.remove(&id).is_none() {
            return false;
        }
        if let Some(thread) = self.thread.as_ref() {
            let _ = thread.jobs.send(Msg::Cancel(id));
        }
        true
    }

    /// The calls completed since the last poll, with their tags and ids. Never blocks.
    pub fn poll(&mut self) -> Vec<(T, CallId, GrpcReply)> {
        let mut done: Vec<(CallId, GrpcReply)> = self.early.drain(..).collect();
        if let Some(thread) = self.thread.as_ref() {
            while let Ok(d) = thread.done.try_recv() {
                done.push(d);
            }
        }
        done.into_iter()
            .filter_map(|(id, reply)| self.live.remove(&id).map(|tag| (tag, id, reply)))
            .collect()
    }
}

/// What every call task of the thread shares.
#[derive(Clone)]
struct Shared {
    done: Sender<(CallId, GrpcReply)>,
    waker: Option<Waker>,
    max_message: usize,
    connects: Arc<std::sync::atomic::AtomicUsize>,
}

impl Shared {
    fn complete(&self, id: CallId, reply: GrpcReply) {
        if self.done.send((id, reply)).is_ok() {
            if let Some(w) = &self.waker {
                w();
            }
        }
    }
}

/// One connection slot per address; the async lock makes concurrent first calls share one
/// connect.
type Slot = Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>;

fn thread_main(mut jobs: UnboundedReceiver<Msg>, ctx: Shared) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(1)
        .thread_name("tollgate-grpc-dns")
        .build();
    let Ok(runtime) = runtime else {
        // Out of file descriptors: every call fails (the receiver is dropped, dispatch sees it).
        return;
    };
    runtime.block_on(async move {
        let pool: Arc<Mutex<HashMap<String, Slot>>> = Arc::default();
        let running: Arc<Mutex<HashMap<CallId, tokio::task::AbortHandle>>> = Arc::default();
        while let Some(msg) = jobs.recv().await {
            match msg {
                Msg::Cancel(id) => {
                    let handle = running
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&id);
                    // None: the call already ended (a Cancel always follows its Call on this
                    // channel); the runner drops its completion.
                    if let Some(h) = handle {
                        h.abort();
                    }
                }
                Msg::Call(job) => {
                    let id = job.id;
                    let slot = {
                        let mut p = pool.lock().unwrap_or_else(PoisonError::into_inner);
                        Arc::clone(p.entry(job.address.clone()).or_default())
                    };
                    let ctx = ctx.clone();
                    let running_task = Arc::clone(&running);
                    // Registered before the task can finish: the task removes its own entry
                    // (a current-thread runtime runs it only after this loop yields).
                    let task = tokio::spawn(async move {
                        let reply = perform(&slot, *job, &ctx).await;
                        running_task
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&id);
                        ctx.complete(id, reply);
                    });
                    running
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(id, task.abort_handle());
                }
            }
        }
    });
}

/// One call within its deadline.
async fn perform(slot: &Slot, job: Job, ctx: &Shared) -> GrpcReply {
    let left = job.deadline.saturating_duration_since(Instant::now());
    let call = async {
        let mut sender = connection(slot, &job.address, ctx).await?;
        let response = sender
            .send_request(job.request)
            .await
            .map_err(|e| GrpcReply::failed(status::INTERNAL, &format!("stream reset: {e}")))?;
        Ok::<_, GrpcReply>(read_reply(response, ctx.max_message).await)
    };
    match tokio::time::timeout(left, call).await {
        Ok(Ok(reply)) | Ok(Err(reply)) => reply,
        Err(_) => GrpcReply::failed(status::UNAVAILABLE, "upstream request timeout"),
    }
}

/// The address's connection, opened (or reopened after it closed) if needed.
async fn connection(
    slot: &Slot,
    address: &str,
    ctx: &Shared,
) -> Result<SendRequest<Full<Bytes>>, GrpcReply> {
    let mut guard = slot.lock().await;
    if let Some(sender) = guard.as_ref() {
        if !sender.is_closed() {
            return Ok(sender.clone());
        }
    }
    *guard = None;
    let unreachable = |why: &str| {
        GrpcReply::failed(
            status::UNAVAILABLE,
            &format!("upstream connect error: {why}"),
        )
    };
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(address)
        .await
        .map_err(|_| unreachable("host name not resolved"))?
        .collect();
    let mut stream = None;
    for a in &addrs {
        if let Ok(s) = tokio::net::TcpStream::connect(a).await {
            stream = Some(s);
            break;
        }
    }
    let stream = stream.ok_or_else(|| unreachable("connection refused or unreachable"))?;
    let _ = stream.set_nodelay(true);
    ctx.connects
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_header_list_size(64 * 1024)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&format!("http/2 handshake: {e}")))?;
    // The connection's driver runs until the peer closes it or it breaks; then `is_closed`.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    *guard = Some(sender.clone());
    Ok(sender)
}

/// `grpc-status` as Envoy's `Common::getGrpcStatus` reads it: `None` when absent or empty.
fn grpc_status(map: &http::HeaderMap) -> Option<u32> {
    let v = map.get("grpc-status")?.as_bytes();
    if v.is_empty() {
        return None;
    }
    let code = std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    Some(match code {
        Some(c) if c <= 16 => u32::try_from(c).unwrap_or(INVALID_CODE),
        _ => INVALID_CODE,
    })
}

fn grpc_message(map: &http::HeaderMap) -> String {
    map.get("grpc-message")
        .map(|v| crate::grpc_status::decode_grpc_message(v.as_bytes()))
        .unwrap_or_default()
}

/// Splits complete length-prefixed messages off `buf`, keeping the last; `Err` with the status.
fn take_messages(
    buf: &mut BytesMut,
    last: &mut Option<Vec<u8>>,
    max: usize,
) -> Result<(), GrpcReply> {
    loop {
        let Some(prefix) = buf.get(..5) else {
            return Ok(());
        };
        let flag = prefix.first().copied().unwrap_or(0);
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(prefix.get(1..5).unwrap_or(&[0; 4]));
        let len = usize::try_from(u32::from_be_bytes(len_bytes)).unwrap_or(usize::MAX);
        if len > max {
            return Err(GrpcReply::failed(
                status::RESOURCE_EXHAUSTED,
                &format!("reply message of {len} bytes, more than {max}"),
            ));
        }
        if flag != 0 && (len > 0 || flag > 1) {
            return Err(GrpcReply::failed(
                status::INTERNAL,
                "compressed or malformed reply message",
            ));
        }
        if buf.len().saturating_sub(5) < len {
            return Ok(());
        }
        buf.advance(5);
        *last = Some(buf.split_to(len).to_vec());
    }
}

async fn read_reply(response: hyper::Response<hyper::body::Incoming>, max: usize) -> GrpcReply {
    let (parts, mut body) = response.into_parts();
    let initial_metadata: Headers = pairs(&parts.headers).collect();
    let with_headers = |mut r: GrpcReply| {
        r.initial_metadata = initial_metadata.clone();
        r
    };
    let trailers_only = hyper::body::Body::is_end_stream(&body);
    if parts.status != http::StatusCode::OK {
        let reply = match grpc_status(&parts.headers) {
            Some(code) if trailers_only => GrpcReply {
                status: code,
                message: grpc_message(&parts.headers),
                ..GrpcReply::default()
            },
            _ => GrpcReply::failed(
                http_to_grpc_status(parts.status.as_u16()),
                &format!("http status {}", parts.status.as_u16()),
            ),
        };
        return with_headers(reply);
    }
    if trailers_only {
        let code = grpc_status(&parts.headers).unwrap_or(status::UNKNOWN);
        let reply = GrpcReply {
            status: code,
            message: grpc_message(&parts.headers),
            ..GrpcReply::default()
        };
        return with_headers(finish(reply, None));
    }
    let mut buf = BytesMut::new();
    let mut last = None;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                return with_headers(GrpcReply::failed(
                    status::INTERNAL,
                    &format!("stream reset: {e}"),
                ))
            }
        };
        match frame.into_data() {
            Ok(data) => {
                buf.extend_from_slice(&data);
                if let Err(reply) = take_messages(&mut buf, &mut last, max) {
                    return with_headers(reply);
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    if !buf.is_empty() {
        return with_headers(GrpcReply::failed(
            status::INTERNAL,
            "reply message cut short",
        ));
    }
    let Some(trailers) = trailers else {
        // onData with end_stream and no trailers: Unknown.
        return with_headers(GrpcReply::failed(status::UNKNOWN, "no trailers"));
    };
    let reply = GrpcReply {
        status: grpc_status(&trailers).unwrap_or(status::UNKNOWN),
        message: grpc_message(&trailers),
        trailing_metadata: pairs(&trailers).collect(),
        ..GrpcReply::default()
    };
    with_headers(finish(reply, last))
}

/// OK with a message: the message; OK without: Internal (`AsyncRequestImpl::onRemoteClose`).
fn finish(mut reply: GrpcReply, message: Option<Vec<u8>>) -> GrpcReply {
    if reply.status == status::OK {
        match message {
            Some(m) => reply.body = Some(m),
            None => {
                reply.status = status::INTERNAL;
                reply.message = String::new();
            }
        }
    }
    reply
}

#[cfg(test)]
#[path = "grpc_client_tests.rs"]
mod tests;
