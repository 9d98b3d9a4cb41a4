#!/usr/bin/env python3
"""gRPC calls through the nginx host, end to end: a real nginx with the module, the WAT guest
`grpc_guest.wat` (compiled with `cargo run -p tollgate-host --example wat2wasm`), and a Python gRPC
server (grpcio, generic handler: raw bytes) behind an nginx `upstream {}`; all on 127.0.0.1.

Checks: OK replies; a non-OK status with its message (proxy_get_status); the deadline
(1 s, server sleeping 3 s) as 14 within bounds; the server down as 14; one HTTP/2 connection
for many calls from one worker. Then measures the latency of a request whose filter makes one
gRPC call against a direct gRPC client's call to the same server (sequential, p50/p90).

Usage: .venv/bin/python nginx-compat/tests/calls/grpc_e2e.py   (after scripts/build-nginx-module.sh)
Exit status 1 on any failed check. Every process it starts is stopped before it returns.
"""
import concurrent.futures
import http.client
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
MODULE = ROOT / "target" / "nginx" / "ngx_http_tollgate_wasm_module.so"
NGINX = "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Echo:
    """test.Echo/Echo on raw bytes: `slow` sleeps 3 s, `deny` is PERMISSION_DENIED, else the
    message reversed. Counts the peers (connections) it saw."""

    def __init__(self):
        self.peers = set()
        self.lock = threading.Lock()

    def echo(self, request, context):
        with self.lock:
            self.peers.add(context.peer())
        if request == b"slow":
            time.sleep(3)
        if request == b"deny":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no way")
        return request[::-1]


def start_server(port):
    echo = Echo()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo.echo)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, echo


def start_nginx(tmp, wasm, port, grpc_port):
    conf = tmp / "nginx.conf"
    conf.write_text(f"""load_module {MODULE};
worker_processes 1;
master_process on;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 256; }}
wasm {{ module echo {wasm}; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;
    uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
    upstream grpc_backend {{ server 127.0.0.1:{grpc_port}; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_wasm echo; return 204; }}
    }}
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nginx did not start: " + (tmp / "error.log").read_text())


def get(conn, msg):
    conn.request("GET", "/", headers={"x-msg": msg})
    r = conn.getresponse()
    return r.status, r.read()


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main():
    failures = []

    def check(name, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
        if not ok:
            failures.append(name)

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-grpc-"))
    wasm = tmp / "guest.wasm"
    subprocess.run(["cargo", "run", "-q", "--release", "-p", "tollgate-host", "--example", "wat2wasm",
                    str(HERE / "grpc_guest.wat"), str(wasm)], cwd=ROOT / "nginx-compat", check=True)
    grpc_port, port = free_port(), free_port()
    server, echo = start_server(grpc_port)
    nginx = start_nginx(tmp, wasm, port, grpc_port)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        check("OK reply", get(conn, "ping") == (200, b"gnip"))
        check("non-OK status and message", get(conn, "deny") == (507, b"no way"), get(conn, "deny"))
        t0 = time.time()
        status, body = get(conn, "slow")
        took = time.time() - t0
        # Two timers race at the deadline: the client's own (UNAVAILABLE, 500 + 14, as Envoy's
        # "upstream request timeout") and the server's, which honours the `grpc-timeout` header
        # and answers DEADLINE_EXCEEDED (500 + 4) when it fires first on a loaded machine.
        check("deadline: Unavailable or DeadlineExceeded within the 1 s timeout",
              status in (514, 504) and 0.9 < took < 1.8, f"{status} {body!r} in {took:.2f}s")
        # Many calls from one worker share one HTTP/2 connection.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            def one(i):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                return get(c, f"m{i}")
            results = list(pool.map(one, range(64)))
        check("64 concurrent calls answered", all(r == (200, f"m{i}".encode()[::-1]) for i, r in enumerate(results)))
        check("one connection to the gRPC server", len(echo.peers) == 1, str(echo.peers))

        # Latency: through nginx (one request = one gRPC call) vs a direct client's call.
        n = 500
        through = []
        for _ in range(n):
            t = time.perf_counter()
            get(conn, "ping")
            through.append(time.perf_counter() - t)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        call = channel.unary_unary("/test.Echo/Echo")
        call(b"warm")
        direct = []
        for _ in range(n):
            t = time.perf_counter()
            call(b"ping")
            direct.append(time.perf_counter() - t)
        channel.close()
        print(f"latency over {n} sequential calls (ms): through nginx p50 {p(through, .5):.3f} "
              f"p90 {p(through, .9):.3f}; direct gRPC client p50 {p(direct, .5):.3f} p90 {p(direct, .9):.3f}; "
              f"added p50 {p(through, .5) - p(direct, .5):.3f}")

        server.stop(0)
        time.sleep(0.2)
        status, body = get(conn, "ping")
        check("server down: Unavailable", status == 514, f"{status} {body!r}")
        log = (tmp / "error.log").read_text()
        check("failures logged", 'grpc call to "grpc_backend" failed: status 14' in log)
        check("no eventfd fallback", "polled every 2 ms" not in log)
    finally:
        nginx.terminate()
        try:
            nginx.wait(10)
        except subprocess.TimeoutExpired:
            nginx.kill()
        server.stop(0)
    if failures:
        print("error log:", tmp / "error.log")
        sys.exit(1)


if __name__ == "__main__":
    main()
