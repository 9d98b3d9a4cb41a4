#!/usr/bin/env python3
"""The latency a filter's `dispatch_http_call` adds to a request, for one or more builds of the
module: a real nginx (1 worker) with `http_guest.wat` (one HTTP call per request to an nginx
`upstream {}` served by the same nginx with `return 200`), N sequential keep-alive requests,
p50/p90 per build, interleaved in rounds so that machine noise falls on every build alike; and
how many TCP connections the calls opened (the backend logs `$connection` of each call).

Usage: .venv/bin/python nginx-compat/tests/calls/http_latency.py [MODULE.so ...]
(default: target/nginx/ngx_http_tollgate_wasm_module.so). Stops every nginx it starts.
       .venv/bin/python nginx-compat/tests/calls/http_latency.py --check
200 calls through the default build: exit status 1 unless they succeed on at most 4
connections (the call threads of the worker; persistent connections, not one per call).
"""
import http.client
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
NGINX = "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, wasm):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-http-latency-"))
    port, backend = free_port(), free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(f"""load_module {module};
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
wasm {{ module h {wasm}; }}
http {{
    access_log off;
    log_format conn '$connection';
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;
    uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
    upstream backend {{ server 127.0.0.1:{backend}; }}
    server {{
        listen 127.0.0.1:{backend};
        access_log {tmp}/backend.log conn;
        location / {{ return 200 ok; }}
    }}
    server {{ listen 127.0.0.1:{port}; location / {{ proxy_wasm h; return 204; }} }}
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port, tmp
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError((tmp / "error.log").read_text())


def run(port, n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/")
        r = conn.getresponse()
        r.read()
        out.append(time.perf_counter() - t)
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
    return out


def connections(tmp):
    """(calls the backend served, distinct connections they came on)."""
    log = (tmp / "backend.log").read_text().split()
    return len(log), len(set(log))


def main():
    check = sys.argv[1:] == ["--check"]
    default = [str(ROOT / "target" / "nginx" / "ngx_http_tollgate_wasm_module.so")]
    modules = default if check else (sys.argv[1:] or default)
    wasm = pathlib.Path(tempfile.mkdtemp()) / "http_guest.wasm"
    subprocess.run(["cargo", "run", "-q", "--release", "-p", "tollgate-host", "--example", "wat2wasm",
                    str(HERE / "http_guest.wat"), str(wasm)], cwd=ROOT / "nginx-compat", check=True)
    started = [start(m, wasm) for m in modules]
    samples = {m: [] for m in modules}
    try:
        for (_, port, _) in started:
            run(port, 50)  # warm-up
        for _ in range(1 if check else 5):
            for m, (_, port, _) in zip(modules, started):
                samples[m] += run(port, 150 if check else 400)
    finally:
        for proc, _, _ in started:
            proc.terminate()
            proc.wait(10)
    for m, (_, _, tmp) in zip(modules, started):
        s = sorted(samples[m])
        q = lambda f: s[int(f * (len(s) - 1))] * 1000
        calls, conns = connections(tmp)
        print(f"{m}: {len(s)} requests, p50 {q(.5):.3f} ms, p90 {q(.9):.3f} ms, p99 {q(.99):.3f} ms;"
              f" {calls} calls on {conns} connections")
        if check and (calls != len(s) + 50 or conns > 4):
            print("FAILED: HTTP calls should reuse at most 4 connections (one per call thread)")
            sys.exit(1)


if __name__ == "__main__":
    main()
