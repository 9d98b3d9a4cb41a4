//! `proxy_dispatch_http_call` without blocking an nginx worker: a [`CallRunner`] hands each call
//! to background threads of the worker process (started on the first dispatch, so never in the
//! nginx master before `fork`; restarted if the process finds itself forked) that perform it
//! with a deadline, and queues the completions; the worker polls them with [`CallRunner::poll`]
//! (non-blocking) from a short timer while [`CallRunner::pending`] is not zero.
//!
//! # Why a small HTTP/1.1 client on `std::net` rather than a crate
//! The calls are plain HTTP/1.1 to `host:port` (the upstream nginx resolved; TLS would come from
//! nginx's upstream, not from here), one request per connection, and must honour one overall
//! deadline (the call's `timeout_ms`) across DNS, connect, write and read, and cap the
//! response size. `ureq` (the lightest well-kept client) brings `url`/`idna`/`http` and TLS
//! plumbing we would turn off, and its timeouts are per phase in 2.x; ~250 lines on
//! `TcpStream` do exactly this, with every limit visible:
//!
//! - request: `{:method} {:path} HTTP/1.1`, `host` from `:authority`, the other headers as given
//!   except `connection`, `content-length`, `transfer-encoding`, `host` and `keep-alive` (set
//!   here: `connection: close`, `content-length` when there is a body or the method is not
//!   GET/HEAD/DELETE/OPTIONS), the body; request trailers are not sent (HTTP/1.1 servers rarely
//!   accept them; no filter of this project sends any);
//! - response: status line, headers (names lower-cased, at most 64 KiB), body delimited by
//!   `transfer-encoding: chunked` (its trailers become the response trailers), `content-length`
//!   or the end of the connection; no body for `HEAD`, 1xx, 204 and 304; interim 1xx responses
//!   are skipped; bodies above [`RunnerConfig::max_body_bytes`] fail the call;
//! - any error (DNS, refused, reset, timeout, malformed response) completes the call with
//!   `None`, which the host reports to the filter as a failed call (no headers, empty body),
//!   as Envoy does.
//!
//! Shape of a call (Envoy's `Context::httpCall` rules): `:method`, `:path` and `:authority` are
//! required pseudo-headers ([`DispatchError::MissingPseudoHeader`] otherwise, Envoy's
//! `BadArgument`); header names and values must not contain CR, LF or NUL
//! ([`DispatchError::InvalidHeader`]).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
}

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

/// A validated request, serialised.
struct Prepared {
    bytes: Vec<u8>,
    head: bool,
    deadline: Instant,
}

struct Threads<T> {
    jobs: Sender<Job<T>>,
    done: Receiver<(T, Option<HttpResponse>)>,
    done_tx: Sender<(T, Option<HttpResponse>)>,
    job_rx: Arc<Mutex<Receiver<Job<T>>>>,
    idle: Arc<AtomicUsize>,
    spawned: usize,
    pid: u32,
}

/// Per-worker HTTP call runner (see the module documentation). `T` is whatever the caller
/// needs back with the completion (the call token, the `Vm` that made it...).
pub struct CallRunner<T: Send + 'static> {
    config: RunnerConfig,
    threads: Option<Threads<T>>,
    pending: usize,
    early: VecDeque<(T, Option<HttpResponse>)>,
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
    let mut out = Vec::with_capacity(256usize.saturating_add(request.body.len()));
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(path);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority);
    out.extend_from_slice(b"\r\n");
    for (k, v) in &request.headers {
        if k.first() == Some(&b':') || SKIPPED.iter().any(|s| k.eq_ignore_ascii_case(s)) {
            continue;
        }
        if k.is_empty() || !clean(k) || k.contains(&b':') || !clean(v) {
            return Err(DispatchError::InvalidHeader);
        }
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    let bodiless = [b"GET".as_slice(), b"HEAD", b"DELETE", b"OPTIONS"]
        .iter()
        .any(|m| method.eq_ignore_ascii_case(m));
    if !request.body.is_empty() || !bodiless {
        out.extend_from_slice(format!("content-length: {}\r\n", request.body.len()).as_bytes());
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&request.body);
    Ok(Prepared {
        bytes: out,
        head: method.eq_ignore_ascii_case(b"HEAD"),
        deadline: now.checked_add(request.timeout).unwrap_or(now),
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
        }
    }

    /// Calls dispatched and not yet returned by [`CallRunner::poll`].
    pub fn pending(&self) -> usize {
        self.pending
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
            std::thread::Builder::new()
                .name("tollgate-http".into())
                .spawn(move || worker_loop(&job_rx, &done_tx, &idle, max_body))
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
            self.early.push_back((job.tag, None));
        }
        self.pending = self.pending.saturating_add(1);
        Ok(())
    }

    /// The calls completed since the last poll (`None`: failed or timed out). Never blocks.
    pub fn poll(&mut self) -> Vec<(T, Option<HttpResponse>)> {
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
    done: &Sender<(T, Option<HttpResponse>)>,
    idle: &AtomicUsize,
    max_body: usize,
) {
    loop {
        idle.fetch_add(1, Ordering::AcqRel);
        let job = {
            let rx = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        idle.fetch_sub(1, Ordering::AcqRel);
        let Ok(job) = job else { return };
        let response = perform(&job.address, &job.request, max_body);
        if done.send((job.tag, response)).is_err() {
            return;
        }
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

fn connect(address: &str, deadline: Instant) -> Option<TcpStream> {
    let addrs: Vec<SocketAddr> = address.to_socket_addrs().ok()?.collect();
    for addr in addrs {
        let left = remaining(deadline)?;
        if let Ok(s) = TcpStream::connect_timeout(&addr, left) {
            return Some(s);
        }
    }
    None
}

fn perform(address: &str, request: &Prepared, max_body: usize) -> Option<HttpResponse> {
    let mut stream = connect(address, request.deadline)?;
    let _ = stream.set_nodelay(true);
    let mut written = 0usize;
    while written < request.bytes.len() {
        stream
            .set_write_timeout(Some(remaining(request.deadline)?))
            .ok()?;
        let chunk = request.bytes.get(written..)?;
        match stream.write(chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => written = written.saturating_add(n),
        }
    }
    let mut conn = Conn {
        stream,
        buf: Vec::with_capacity(4096),
        pos: 0,
        deadline: request.deadline,
    };
    read_response(&mut conn, request.head, max_body)
}

/// Most bytes of a response head (status line and headers) or of a trailer block.
const MAX_HEAD: usize = 64 * 1024;

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    deadline: Instant,
}

impl Conn {
    /// Reads more bytes into the buffer; false at end of stream, on error or timeout.
    fn fill(&mut self) -> Option<bool> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.stream
            .set_read_timeout(Some(remaining(self.deadline)?))
            .ok()?;
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk) {
            Ok(0) => Some(false),
            Ok(n) => {
                self.buf.extend_from_slice(chunk.get(..n)?);
                Some(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Some(true),
            Err(_) => None,
        }
    }

    fn available(&self) -> &[u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// One line without its CRLF (or LF), at most `max` bytes.
    fn line(&mut self, max: usize) -> Option<Vec<u8>> {
        loop {
            if let Some(i) = self.available().iter().position(|&b| b == b'\n') {
                let line = self.available().get(..i)?.to_vec();
                self.pos = self.pos.saturating_add(i).saturating_add(1);
                let line = line.strip_suffix(b"\r").map(<[u8]>::to_vec).unwrap_or(line);
                return Some(line);
            }
            if self.available().len() > max || !self.fill()? {
                return None;
            }
        }
    }

    /// Exactly `n` bytes.
    fn exact(&mut self, n: usize, out: &mut Vec<u8>) -> Option<()> {
        let mut left = n;
        while left > 0 {
            if self.available().is_empty() && !self.fill()? {
                return None;
            }
            let take = left.min(self.available().len());
            out.extend_from_slice(self.available().get(..take)?);
            self.pos = self.pos.saturating_add(take);
            left = left.saturating_sub(take);
        }
        Some(())
    }

    /// Everything until the peer closes, at most `max` bytes.
    fn until_close(&mut self, max: usize, out: &mut Vec<u8>) -> Option<()> {
        loop {
            out.extend_from_slice(self.available());
            self.pos = self.buf.len();
            if out.len() > max {
                return None;
            }
            if !self.fill()? {
                return Some(());
            }
        }
    }
}

/// Header lines until the empty line, names lower-cased; `None` past [`MAX_HEAD`] bytes.
fn header_block(conn: &mut Conn) -> Option<Headers> {
    let mut headers = Headers::new();
    let mut total = 0usize;
    loop {
        let line = conn.line(MAX_HEAD)?;
        total = total.saturating_add(line.len()).saturating_add(2);
        if total > MAX_HEAD {
            return None;
        }
        if line.is_empty() {
            return Some(headers);
        }
        let colon = line.iter().position(|&b| b == b':')?;
        let name = line.get(..colon)?.to_ascii_lowercase();
        let value = line.get(colon.saturating_add(1)..)?.trim_ascii().to_vec();
        if name.is_empty() {
            return None;
        }
        headers.push((name, value));
    }
}

fn parse_status(line: &[u8]) -> Option<u16> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let version = parts.next()?;
    if !version.starts_with(b"HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    std::str::from_utf8(code)
        .ok()?
        .parse::<u16>()
        .ok()
        .filter(|c| (100..=999).contains(c))
}

fn read_response(conn: &mut Conn, head: bool, max_body: usize) -> Option<HttpResponse> {
    let (status, headers) = loop {
        let status = parse_status(&conn.line(MAX_HEAD)?)?;
        let headers = header_block(conn)?;
        // Interim responses (100 Continue, 103 Early Hints) precede the real one.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        break (status, headers);
    };
    let mut response = HttpResponse {
        status,
        headers: Vec::with_capacity(headers.len().saturating_add(1)),
        body: Vec::new(),
        trailers: Vec::new(),
    };
    response
        .headers
        .push((b":status".to_vec(), status.to_string().into_bytes()));
    let chunked = find(&headers, b"transfer-encoding").is_some_and(|v| {
        v.split(|&b| b == b',')
            .next_back()
            .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
    });
    let length = find(&headers, b"content-length");
    response.headers.extend(headers.iter().cloned());
    if head || (100..200).contains(&status) || status == 204 || status == 304 {
        return Some(response);
    }
    if chunked {
        loop {
            let size_line = conn.line(1024)?;
            let size_text = size_line.split(|&b| b == b';').next()?.trim_ascii();
            let size = usize::from_str_radix(std::str::from_utf8(size_text).ok()?, 16).ok()?;
            if size == 0 {
                response.trailers = header_block(conn)?;
                return Some(response);
            }
            if response.body.len().saturating_add(size) > max_body {
                return None;
            }
            conn.exact(size, &mut response.body)?;
            if !conn.line(2)?.is_empty() {
                return None;
            }
        }
    }
    if let Some(length) = length {
        let n: usize = std::str::from_utf8(length).ok()?.trim().parse().ok()?;
        if n > max_body {
            return None;
        }
        conn.exact(n, &mut response.body)?;
        return Some(response);
    }
    conn.until_close(max_body, &mut response.body)?;
    Some(response)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
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
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    if got.len() >= end + 4 + len || n == 0 {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let _ = tx.send(got);
            s.write_all(response).unwrap();
        });
        (addr, rx)
    }

    fn wait_all<T: Send + 'static>(
        runner: &mut CallRunner<T>,
        n: usize,
    ) -> Vec<(T, Option<HttpResponse>)> {
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
        let (tag, Some(resp)) = &done[0] else {
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
        let sent = String::from_utf8(seen.recv().unwrap()).unwrap();
        assert_eq!(
            sent,
            "GET /.well-known/jwks.json HTTP/1.1\r\nhost: jwks.example\r\naccept: application/json\r\nconnection: close\r\n\r\n"
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
        let Some(resp) = &done[0].1 else { panic!() };
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

    #[test]
    fn timeout_and_refused_yield_none() {
        // Accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let hold = std::thread::spawn(move || {
            let conn = silent.accept();
            std::thread::sleep(Duration::from_millis(1500));
            drop(conn);
        });
        // Nothing listens there any more.
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap().to_string();
        drop(closed);
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
        assert!(done.iter().all(|(_, r)| r.is_none()), "{done:?}");
        // The timeout held: well under the server's 1.5 s silence.
        assert!(
            start.elapsed() < Duration::from_millis(1200),
            "{:?}",
            start.elapsed()
        );
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
        assert!(done.iter().all(|(_, r)| r.is_none()), "{done:?}");
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
