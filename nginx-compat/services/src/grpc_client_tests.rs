//! grpc_client against in-process servers: h2's server side for real HTTP/2 replies (well formed
//! and hostile), plain TCP for servers that break the connection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(clippy::arithmetic_side_effects)]

use super::*;
use std::io::Read as _;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One step of a scripted reply.
#[derive(Clone)]
enum Step {
    /// Response headers: HTTP status, extra fields, END_STREAM.
    Headers(u16, Vec<(&'static str, String)>, bool),
    /// A DATA frame (raw bytes: the test writes prefixes itself), END_STREAM.
    Data(Vec<u8>, bool),
    /// Trailers (END_STREAM).
    Trailers(Vec<(&'static str, String)>),
    /// Waits that long before the next step.
    Sleep(u64),
}

/// What the server saw of a request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

type Script = Arc<dyn Fn(&Seen) -> Vec<Step> + Send + Sync>;

/// An h2 server on 127.0.0.1 running `script` for every request; its address, the count of
/// connections it accepted and the requests it saw.
fn serve(script: Script) -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<Seen>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (accepted2, seen2) = (Arc::clone(&accepted), Arc::clone(&seen));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                accepted2.fetch_add(1, Ordering::SeqCst);
                let (script, seen) = (Arc::clone(&script), Arc::clone(&seen2));
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        let (script, seen) = (Arc::clone(&script), Arc::clone(&seen));
                        tokio::spawn(answer(request, respond, script, seen));
                    }
                });
            }
        });
    });
    (addr, accepted, seen)
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let (parts, mut body) = request.into_parts();
    let mut got = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    let s = Seen {
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        body: got,
    };
    seen.lock().unwrap().push(s.clone());
    let mut stream = None;
    for step in script(&s) {
        match step {
            Step::Headers(status, fields, end) => {
                let mut r = http::Response::builder().status(status);
                for (k, v) in fields {
                    r = r.header(k, v);
                }
                stream = respond.send_response(r.body(()).unwrap(), end).ok();
            }
            Step::Data(bytes, end) => {
                if let Some(s) = stream.as_mut() {
                    let _ = s.send_data(Bytes::from(bytes), end);
                }
            }
            Step::Trailers(fields) => {
                let mut map = http::HeaderMap::new();
                for (k, v) in fields {
                    map.append(
                        HeaderName::from_static(k),
                        HeaderValue::from_str(&v).unwrap(),
                    );
                }
                if let Some(s) = stream.as_mut() {
                    let _ = s.send_trailers(map);
                }
            }
            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }
    // Keep the stream open while a script sleeps past the client's deadline.
    drop(stream);
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    v.extend_from_slice(message);
    v
}

fn grpc_headers() -> Vec<(&'static str, String)> {
    vec![("content-type", "application/grpc".into())]
}

/// The script of a well-behaved unary server: echoes the request message reversed.
fn echo() -> Script {
    Arc::new(|seen: &Seen| {
        let mut reply = seen.body.get(5..).unwrap_or_default().to_vec();
        reply.reverse();
        vec![
            Step::Headers(200, grpc_headers(), false),
            Step::Data(framed(&reply), false),
            Step::Trailers(vec![("grpc-status", "0".into()), ("x-t", "t".into())]),
        ]
    })
}

fn request(message: &[u8], timeout_ms: u64) -> GrpcRequest {
    GrpcRequest {
        authority: "ratelimit".into(),
        service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        method: "ShouldRateLimit".into(),
        metadata: vec![(b"x-tenant".to_vec(), b"acme".to_vec())],
        message: message.to_vec(),
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn wait_all<T>(runner: &mut GrpcRunner<T>, n: usize) -> Vec<(T, CallId, GrpcReply)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "calls did not complete");
        out.extend(runner.poll());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(runner.pending(), 0);
    out
}

#[test]
fn unary_call_shape_and_reply() {
    let (addr, _, seen) = serve(echo());
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    runner
        .dispatch(7u32, &addr, &request(b"abc", 2000))
        .unwrap();
    let done = wait_all(&mut runner, 1);
    let (tag, _, reply) = &done[0];
    assert_eq!(*tag, 7);
    assert_eq!(reply.status, status::OK, "{reply:?}");
    assert_eq!(reply.body.as_deref(), Some(&b"cba"[..]));
    assert!(reply
        .trailing_metadata
        .contains(&(b"x-t".to_vec(), b"t".to_vec())));
    assert!(reply
        .initial_metadata
        .contains(&(b"content-type".to_vec(), b"application/grpc".to_vec())));
    let seen = seen.lock().unwrap();
    let s = &seen[0];
    assert_eq!(
        s.path,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(s.body, framed(b"abc"));
    assert_eq!(s.headers["content-type"], "application/grpc");
    assert_eq!(s.headers["te"], "trailers");
    assert_eq!(s.headers["x-tenant"], "acme");
    let t = s.headers["grpc-timeout"].to_str().unwrap();
    assert!(t.ends_with('m') && t.len() <= 9, "{t}");
    let ms: u64 = t.trim_end_matches('m').parse().unwrap();
    assert!((1..=2000).contains(&ms), "{t}");
}

#[test]
fn one_connection_carries_many_concurrent_calls() {
    let (addr, accepted, _) = serve(echo());
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    for i in 0..50u32 {
        runner
            .dispatch(i, &addr, &request(&i.to_be_bytes(), 5000))
            .unwrap();
    }
    let done = wait_all(&mut runner, 50);
    for (i, _, reply) in &done {
        let mut want = i.to_be_bytes().to_vec();
        want.reverse();
        assert_eq!(reply.body.as_deref(), Some(&want[..]), "{reply:?}");
    }
    // A second wave after the first completed: still the same connection.
    for i in 0..10u32 {
        runner.dispatch(i, &addr, &request(b"x", 5000)).unwrap();
    }
    wait_all(&mut runner, 10);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(runner.connections_opened(), 1);
}

#[test]
fn statuses_from_trailers_headers_and_http() {
    let script: Script = Arc::new(|seen: &Seen| {
        let which = seen.body.get(5..).unwrap_or_default().to_vec();
        match which.as_slice() {
            // Non-OK grpc-status with a percent-encoded message in the trailers.
            b"denied" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Trailers(vec![
                    ("grpc-status", "7".into()),
                    ("grpc-message", "no%20way %E2%9C%93".into()),
                ]),
            ],
            // Trailers-only reply.
            b"trailers-only" => {
                let mut h = grpc_headers();
                h.push(("grpc-status", "5".into()));
                vec![Step::Headers(200, h, true)]
            }
            // HTTP error without grpc-status: httpToGrpcStatus.
            b"http-503" => vec![Step::Headers(503, vec![], true)],
            b"http-404" => vec![
                Step::Headers(404, vec![], false),
                Step::Data(b"not found".to_vec(), true),
            ],
            b"http-500" => vec![Step::Headers(500, vec![], true)],
            // HTTP error in a trailers-only reply: its grpc-status wins.
            b"http-429-grpc" => vec![Step::Headers(429, vec![("grpc-status", "8".into())], true)],
            // Unknown / garbage statuses: Envoy's InvalidCode.
            b"status-99" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Data(framed(b"m"), false),
                Step::Trailers(vec![("grpc-status", "99".into())]),
            ],
            b"status-abc" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Trailers(vec![("grpc-status", "abc".into())]),
            ],
            // No grpc-status at all: Unknown.
            b"no-status" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Data(framed(b"m"), false),
                Step::Trailers(vec![("x", "y".into())]),
            ],
            // The body ends without trailers: Unknown.
            b"no-trailers" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Data(framed(b"m"), true),
            ],
            // OK without a message: Internal.
            b"ok-empty" => vec![
                Step::Headers(200, grpc_headers(), false),
                Step::Trailers(vec![("grpc-status", "0".into())]),
            ],
            _ => vec![Step::Headers(500, vec![], true)],
        }
    });
    let (addr, _, _) = serve(script);
    let cases: [(&str, u32); 11] = [
        ("denied", 7),
        ("trailers-only", 5),
        ("http-503", status::UNAVAILABLE),
        ("http-404", status::UNIMPLEMENTED),
        ("http-500", status::UNKNOWN),
        ("http-429-grpc", 8),
        ("status-99", INVALID_CODE),
        ("status-abc", INVALID_CODE),
        ("no-status", status::UNKNOWN),
        ("no-trailers", status::UNKNOWN),
        ("ok-empty", status::INTERNAL),
    ];
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    for (name, _) in cases {
        runner
            .dispatch(name, &addr, &request(name.as_bytes(), 3000))
            .unwrap();
    }
    let done = wait_all(&mut runner, cases.len());
    for (name, want) in cases {
        let (_, _, reply) = done.iter().find(|d| d.0 == name).unwrap();
        assert_eq!(reply.status, want, "{name}: {reply:?}");
        assert!(reply.body.is_none(), "{name}: {reply:?}");
    }
    let denied = &done.iter().find(|d| d.0 == "denied").unwrap().2;
    assert_eq!(denied.message, "no way \u{2713}");
}

#[test]
fn hostile_messages_fail_the_call() {
    let script: Script = Arc::new(|seen: &Seen| {
        let which = seen.body.get(5..).unwrap_or_default().to_vec();
        let ok = || Step::Trailers(vec![("grpc-status", "0".into())]);
        let data = match which.as_slice() {
            // Prefix announces 10 bytes, 3 come, then OK trailers.
            b"truncated" => vec![0, 0, 0, 0, 10, 1, 2, 3],
            // Only part of a prefix.
            b"short-prefix" => vec![0, 0, 0],
            // Compressed flag without a negotiated encoding.
            b"compressed" => {
                let mut f = framed(b"zz");
                f[0] = 1;
                f
            }
            // A flag byte that is no flag.
            b"bad-flag" => {
                let mut f = framed(b"zz");
                f[0] = 0x80;
                f
            }
            // 2 GiB announced: refused at the prefix, nothing buffered.
            b"huge" => vec![0, 0x80, 0, 0, 0],
            // Just over the cap of 1024.
            b"oversize" => framed(&[b'o'; 1025]),
            _ => framed(b"?"),
        };
        vec![
            Step::Headers(200, grpc_headers(), false),
            Step::Data(data, false),
            ok(),
        ]
    });
    let (addr, _, _) = serve(script);
    let cases: [(&str, u32); 6] = [
        ("truncated", status::INTERNAL),
        ("short-prefix", status::INTERNAL),
        ("compressed", status::INTERNAL),
        ("bad-flag", status::INTERNAL),
        ("huge", status::RESOURCE_EXHAUSTED),
        ("oversize", status::RESOURCE_EXHAUSTED),
    ];
    let mut runner = GrpcRunner::new(GrpcConfig {
        max_message_bytes: 1024,
        ..GrpcConfig::default()
    });
    for (name, _) in cases {
        runner
            .dispatch(name, &addr, &request(name.as_bytes(), 3000))
            .unwrap();
    }
    let done = wait_all(&mut runner, cases.len());
    for (name, want) in cases {
        let (_, _, reply) = done.iter().find(|d| d.0 == name).unwrap();
        assert_eq!(reply.status, want, "{name}: {reply:?}");
        assert!(reply.body.is_none());
    }
}

#[test]
fn deadline_bounds_a_silent_server_and_the_connection_survives() {
    let script: Script = Arc::new(|seen: &Seen| {
        if seen.body.get(5..) == Some(b"slow") {
            vec![Step::Sleep(3000)]
        } else {
            echo()(seen)
        }
    });
    let (addr, accepted, _) = serve(script);
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    let start = Instant::now();
    runner
        .dispatch("slow", &addr, &request(b"slow", 200))
        .unwrap();
    let done = wait_all(&mut runner, 1);
    let took = start.elapsed();
    assert_eq!(done[0].2.status, status::UNAVAILABLE, "{:?}", done[0].2);
    assert_eq!(done[0].2.message, "upstream request timeout");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // The stream was reset, not the connection: the next call reuses it.
    runner
        .dispatch("fast", &addr, &request(b"ok", 2000))
        .unwrap();
    let done = wait_all(&mut runner, 1);
    assert_eq!(done[0].2.status, status::OK);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn cancel_drops_the_call_and_keeps_the_connection() {
    let script: Script = Arc::new(|seen: &Seen| {
        if seen.body.get(5..) == Some(b"slow") {
            let mut s = vec![Step::Sleep(600)];
            s.extend(echo()(seen));
            s
        } else {
            echo()(seen)
        }
    });
    let (addr, accepted, _) = serve(script);
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    let id = runner
        .dispatch("slow", &addr, &request(b"slow", 5000))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(runner.cancel(id));
    assert!(!runner.cancel(id), "a call is cancelled once");
    assert_eq!(runner.pending(), 0);
    runner
        .dispatch("next", &addr, &request(b"ab", 5000))
        .unwrap();
    std::thread::sleep(Duration::from_millis(900));
    let done = runner.poll();
    assert_eq!(done.len(), 1, "the cancelled call never completes");
    assert_eq!(done[0].0, "next");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn unreachable_and_broken_connections() {
    // Nothing listens.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    // Accepts, reads the preface and the call, closes mid-call; counts connections.
    let rude = TcpListener::bind("127.0.0.1:0").unwrap();
    let rude_addr = rude.local_addr().unwrap().to_string();
    let rude_count = Arc::new(AtomicUsize::new(0));
    let rc = Arc::clone(&rude_count);
    std::thread::spawn(move || {
        for conn in rude.incoming() {
            rc.fetch_add(1, Ordering::SeqCst);
            let mut s = conn.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            std::thread::sleep(Duration::from_millis(50));
            drop(s);
        }
    });
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    runner
        .dispatch("refused", &closed_addr, &request(b"x", 2000))
        .unwrap();
    runner
        .dispatch("dns", "no-such-host.invalid:50051", &request(b"x", 2000))
        .unwrap();
    runner
        .dispatch("rude", &rude_addr, &request(b"x", 2000))
        .unwrap();
    let done = wait_all(&mut runner, 3);
    let get = |n: &str| &done.iter().find(|d| d.0 == n).unwrap().2;
    assert_eq!(get("refused").status, status::UNAVAILABLE);
    assert_eq!(get("dns").status, status::UNAVAILABLE);
    let rude = get("rude");
    assert!(
        [status::INTERNAL, status::UNAVAILABLE].contains(&rude.status),
        "{rude:?}"
    );
    // The broken connection is replaced on the next call (reconnect).
    runner
        .dispatch("again", &rude_addr, &request(b"x", 2000))
        .unwrap();
    wait_all(&mut runner, 1);
    assert_eq!(rude_count.load(Ordering::SeqCst), 2);
}

#[test]
fn dispatch_checks_the_call() {
    let mut runner: GrpcRunner<u32> = GrpcRunner::new(GrpcConfig {
        max_pending: 1,
        ..GrpcConfig::default()
    });
    let mut r = request(b"", 100);
    r.service = "a/b".into();
    assert_eq!(
        runner.dispatch(1, "127.0.0.1:1", &r),
        Err(GrpcDispatchError::InvalidName)
    );
    let mut r = request(b"", 100);
    r.method = String::new();
    assert_eq!(
        runner.dispatch(1, "127.0.0.1:1", &r),
        Err(GrpcDispatchError::InvalidName)
    );
    let mut r = request(b"", 100);
    r.metadata = vec![(b"x".to_vec(), b"a\r\nb".to_vec())];
    assert_eq!(
        runner.dispatch(1, "127.0.0.1:1", &r),
        Err(GrpcDispatchError::InvalidMetadata)
    );
    assert!(runner.thread.is_none(), "no thread for refused calls");
    runner
        .dispatch(1, "127.0.0.1:1", &request(b"", 100))
        .unwrap();
    assert_eq!(
        runner.dispatch(2, "127.0.0.1:1", &request(b"", 100)),
        Err(GrpcDispatchError::TooManyPending)
    );
    wait_all(&mut runner, 1);
}

#[test]
fn the_waker_runs_after_each_completion() {
    let (addr, _, _) = serve(echo());
    let woken = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&woken);
    let mut runner = GrpcRunner::new(GrpcConfig::default());
    runner.set_waker(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));
    for i in 0..3u32 {
        runner.dispatch(i, &addr, &request(b"w", 2000)).unwrap();
    }
    wait_all(&mut runner, 3);
    assert_eq!(woken.load(Ordering::SeqCst), 3);
}

#[test]
fn grpc_timeout_and_percent_decoding() {
    assert_eq!(grpc_timeout(Duration::from_millis(50)), "50m");
    assert_eq!(grpc_timeout(Duration::ZERO), "1m");
    assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200001S");
    let decode = crate::grpc_status::decode_grpc_message;
    assert_eq!(decode(b"a%20b%zz%4"), "a b%zz%4");
    assert_eq!(decode(b"%FF"), "\u{fffd}");
}
