"""`nginx -t` on every example configuration in nginx-compat/conf/ (the Tollgate module loads,
every filter compiles and accepts its configuration); ngx_wasm_module's directives in the forms
its source accepts, bad values and what this host cannot honour refused with a message naming
the directive; what the honoured ones do (resolver_add, socket timeouts, dispatch error logs)
on both nginx builds, and a configuration written for Kong's module."""
from __future__ import annotations

import http.server
import json
import pathlib
import socket
import subprocess
import threading
import time

import pytest

from lab import (NGINX_BINARY, NGINX_MODULE, PROBE_WASM, ROOT, WASM_DIR, RawNginx, nginx_quote,
                     selected_nginx_hosts)

CONFS = sorted((ROOT / "nginx-compat" / "conf").glob("*.conf"))


def nginx_t(text: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    """Renders repository-relative paths (`target/...`) absolute (the run-time files under
    `target/nginx/run/` into `tmp`) and runs `nginx -t` with `tmp` as prefix and error log
    (unprivileged)."""
    conf = tmp / "nginx.conf"
    text = text.replace(" target/nginx/run/", f" {tmp}/")  # pid, logs, temporary files
    conf.write_text(text.replace(" target/", f" {ROOT}/target/"))
    return subprocess.run([NGINX_BINARY, "-t", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def built():
    if not NGINX_MODULE.exists():
        pytest.fail(f"{NGINX_MODULE} missing: run scripts/build-nginx-module.sh")
    if not list(WASM_DIR.glob("tollgate_*.wasm")):
        pytest.fail("filters not built: run scripts/build.sh")


def test_there_are_example_configurations():
    assert CONFS


@pytest.mark.parametrize("conf", CONFS, ids=[c.name for c in CONFS])
def test_example_configuration_passes_nginx_t(conf, tmp_path):
    r = nginx_t(conf.read_text(), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test is successful" in r.stderr


MINIMAL = """load_module target/nginx/ngx_http_tollgate_wasm_module.so;
events {}
wasm {
    module jwt_auth target/wasm32-wasip1/release/tollgate_jwt_auth.wasm;
    %(wasm)s
}
http {
    server {
        listen 127.0.0.1:1;
        location / {
            %(location)s
            return 200;
        }
    }
}
"""

GOOD_JWT = '{"providers": {"p": {"issuer": "i", "hmac_secrets": [{"alg": "HS256", "secret": "0123456789abcdef0123456789abcdef"}]}}}'


# ngx_wasm_module's directives (docs/DIRECTIVES.md), in the argument forms its source accepts;
# nginx-compat/README.md says which are honoured and which are tuning without effect here.
KONG_ACCEPTED = [
    ("socket_connect_timeout 5s; socket_send_timeout 500ms; socket_read_timeout 1m;", ""),
    ("socket_read_timeout 0;", ""),
    ("resolver_timeout 5s;", ""),
    ("resolver_add 127.0.0.1 localhost; resolver_add ::1 ip6.kong.test;", ""),
    ("proxy_wasm_log_dispatch_errors off;", ""),
    ("proxy_wasm_log_dispatch_errors ON;", ""),
    ("socket_buffer_size 4k; socket_buffer_reuse off; socket_large_buffers 8 16k;", ""),
    ("tls_trusted_certificate /etc/ssl/certs/ca-certificates.crt; tls_verify_cert on; tls_verify_host on; tls_no_verify_warn on;", ""),
    ("wasmtime { flag static_memory_maximum_size 1m; flag debug_info on; flag max_wasm_stack 512k; "
     "flag cranelift_opt_level speed; flag strategy auto; }", ""),
    ("wasmer { flag wasm_reference_types on; } v8 { flag a_size 10000; }", ""),
    ("metrics { slab_size 12m; max_metric_name_length 512; }", ""),
    ("metrics { slab_size 12k; }", ""),
    ("shm_kv small 12k;", ""),
    ("", "wasm_socket_connect_timeout 5s; wasm_socket_send_timeout 5s; wasm_socket_read_timeout 500ms;"),
    ("", "wasm_socket_buffer_size 8k; wasm_socket_buffer_reuse off; wasm_socket_large_buffers 8 16k;"),
    ("", "wasm_response_body_buffers 2 16k;"),
    ("", "wasm_postpone_rewrite off; wasm_postpone_access off;"),
    ("", "proxy_wasm_log_dispatch_errors off;"),
    ("", "resolver_add 127.0.0.1 upstream.kong.test;"),
    ("", "proxy_wasm_request_headers_in_access on;"),
    ("", "proxy_wasm_isolation stream;"),
]


@pytest.mark.parametrize("wasm,location", KONG_ACCEPTED)
def test_kongs_directives_pass_in_their_forms(tmp_path, wasm, location):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": location}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


KONG_REFUSED = [
    ("socket_connect_timeout abc;", "", 'tollgate: invalid value "abc" in "socket_connect_timeout": a time such as 500ms or 5s'),
    ("socket_read_timeout 1s; socket_read_timeout 2s;", "", 'tollgate: "socket_read_timeout" directive is duplicate'),
    ("resolver_timeout soon;", "", 'tollgate: invalid value "soon" in "resolver_timeout"'),
    ("resolver_add 1.2.3 h.test;", "", 'tollgate: resolver_add: invalid address value "1.2.3"'),
    ("resolver_add 127.0.0.1 '';", "", 'tollgate: resolver_add: invalid host value ""'),
    ("resolver_add 127.0.0.1;", "", 'invalid number of arguments in "resolver_add" directive'),
    ("proxy_wasm_log_dispatch_errors maybe;", "", 'tollgate: invalid value "maybe" in "proxy_wasm_log_dispatch_errors": it must be "on" or "off"'),
    ("socket_buffer_size lots;", "", 'tollgate: invalid value "lots" in "socket_buffer_size": a size such as 1024 or 4k'),
    ("socket_buffer_reuse 1;", "", 'tollgate: invalid value "1" in "socket_buffer_reuse": it must be "on" or "off"'),
    ("socket_large_buffers 0 8k;", "", 'tollgate: invalid value "0 8k" in "socket_large_buffers": NUMBER SIZE, such as 4 8k'),
    ("tls_verify_cert yes;", "", 'tollgate: invalid value "yes" in "tls_verify_cert": it must be "on" or "off"'),
    ("tls_no_verify_warn on; tls_no_verify_warn off;", "", 'tollgate: "tls_no_verify_warn" directive is duplicate'),
    ("wasmtime { flag no_such_flag 1; }", "", 'tollgate: unknown "wasmtime" configuration flag: "no_such_flag"'),
    ("wasmtime { flag debug_info yes; }", "", 'tollgate: invalid value "yes" of wasmtime flag "debug_info": flag debug_info on|off;'),
    ("wasmtime { flag max_wasm_stack big; }", "", 'tollgate: invalid value "big" of wasmtime flag "max_wasm_stack": flag max_wasm_stack SIZE;'),
    ("wasmtime { flag debug_info; }", "", 'invalid number of arguments in "flag" directive'),
    ("flag debug_info on;", "", '"flag" directive is not allowed here'),
    ("wasmer { cache_config /x.toml; }", "", '"cache_config" directive is not allowed here'),
    ("metrics { slab_size 8k; }", "", "tollgate: slab_size: shm size of 8192 bytes is too small, minimum required is 12288 bytes"),
    ("metrics { slab_size 13k; }", "", "tollgate: slab_size: shm size of 13312 bytes is not page-aligned, must be a multiple of 4096"),
    ("metrics { slab_size much; }", "", 'tollgate: slab_size: invalid shm size "much"'),
    ("metrics { max_metric_name_length 5; }", "", 'tollgate: invalid value "5" in "max_metric_name_length": value too small (min: 6)'),
    ("metrics { max_metric_name_length long; }", "", 'tollgate: invalid value "long" in "max_metric_name_length"'),
    ("metrics { } metrics { }", "", 'tollgate: "metrics" directive is duplicate'),
    ("slab_size 1m;", "", '"slab_size" directive is not allowed here'),
    ("shm_kv small 12287;", "", 'tollgate: shm_kv "small" is too small (at least 12k)'),
    ("resolver 1.1.1.1 ipv6=off;", "", 'tollgate: "resolver" is not supported: this host resolves the names of dispatch_http_call with the system resolver'),
    ("proxy_wasm_lua_resolver on;", "", 'tollgate: "proxy_wasm_lua_resolver" is not supported: it requires Lua support'),
    ("", "proxy_wasm_lua_resolver off;", 'tollgate: "proxy_wasm_lua_resolver" is not supported: it requires Lua support'),
    ("", "wasm_call rewrite jwt_auth say_hello;", 'tollgate: "wasm_call" is not supported: this host runs proxy-wasm filters'),
    ("", "wasm_postpone_rewrite on;", 'tollgate: "wasm_postpone_rewrite on" is not supported: this host runs on_request_headers first'),
    ("", "wasm_postpone_access on;", 'tollgate: "wasm_postpone_access on" is not supported'),
    ("", "wasm_socket_read_timeout never;", 'tollgate: invalid value "never" in "wasm_socket_read_timeout"'),
    ("", "wasm_socket_connect_timeout 1s; wasm_socket_connect_timeout 1s;", 'tollgate: "wasm_socket_connect_timeout" directive is duplicate'),
    ("", "wasm_response_body_buffers 2 0;", 'tollgate: invalid value "2 0" in "wasm_response_body_buffers": NUMBER SIZE'),
    ("", "wasm_socket_buffer_size 1k; wasm_socket_buffer_size 2k;", 'tollgate: "wasm_socket_buffer_size" directive is duplicate'),
    ("", "proxy_wasm_log_dispatch_errors sometimes;", 'tollgate: invalid value "sometimes" in "proxy_wasm_log_dispatch_errors"'),
    ("", "resolver_add nowhere upstream.kong.test;", 'tollgate: resolver_add: invalid address value "nowhere"'),
]


@pytest.mark.parametrize("wasm,location,message", KONG_REFUSED)
def test_kongs_directives_refuse_bad_values_and_what_this_host_cannot_honour(tmp_path, wasm, location, message):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": location}, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("wasm", ["compiler auto;", "compiler cranelift;", "backtraces on;", "backtraces off;"])
def test_kongs_tuning_directives_that_this_host_honours_pass(tmp_path, wasm):
    """ngx_wasm_module's `compiler` and `backtraces` (docs/DIRECTIVES.md): Cranelift is what this
    host compiles with, and every trap is logged either way."""
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("wasm,message", [
    ("compiler singlepass;", 'tollgate: compiler "singlepass" is not available'),
    ("compiler llvm;", 'tollgate: compiler "llvm" is not available'),
    ("backtraces yes;", 'tollgate: invalid value "yes" in "backtraces"'),
    ("backtraces;", "invalid number of arguments"),
])
def test_kongs_tuning_directives_refuse_what_this_host_cannot_do(tmp_path, wasm, message):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_supported_directives_pass(tmp_path):
    location = f"proxy_wasm_isolation stream; proxy_wasm_request_headers_in_access on; proxy_wasm jwt_auth '{GOOD_JWT}';"
    r = nginx_t(MINIMAL % {"wasm": "shm_kv * 1m; shm_kv tenants 64k eviction=lru; shm_queue jobs 64k;",
                           "location": location}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("wasm,message", [
    ("shm_queue jobs 64k; shm_queue jobs 64k;", 'shm_queue "jobs" already defined'),
    ("shm_queue jobs 1k;", 'shm_queue "jobs" is too small'),
    ("shm_queue jobs lots;", 'invalid shm_queue size "lots"'),
    ("shm_queue a/b 64k;", 'invalid shm_queue name "a/b"'),
    ("shm_queue jobs;", "invalid number of arguments"),
])
def test_bad_shm_queue_directives_fail(tmp_path, wasm, message):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_a_bad_filter_configuration_fails_nginx_t_with_the_filters_message(tmp_path):
    bad = '{"providers": {"main": {"issuer": "i", "hmac_secrets": [{"alg": "HS256", "secret": "short"}]}}}'
    r = nginx_t(MINIMAL % {"wasm": "", "location": f"proxy_wasm jwt_auth '{bad}';"}, tmp_path)
    assert r.returncode != 0
    assert "providers.main.hmac_secrets[0].secret" in r.stderr, r.stderr[-2000:]


def test_an_unknown_module_and_a_missing_file_fail(tmp_path):
    r = nginx_t(MINIMAL % {"wasm": "", "location": "proxy_wasm nope;"}, tmp_path)
    assert r.returncode != 0 and 'unknown module "nope"' in r.stderr
    r = nginx_t(MINIMAL % {"wasm": "module other /nonexistent.wasm;", "location": ""}, tmp_path)
    assert r.returncode != 0 and 'module "other"' in r.stderr
# ----- What the honoured directives do (both nginx builds) -----


@pytest.fixture(params=selected_nginx_hosts() or ["nginx"])
def raw_nginx(request, tmp_path):
    started = []

    def start(wasm: str, http: str, extra_http: str = "") -> RawNginx:
        d = tmp_path / f"n{len(started)}"
        d.mkdir()
        n = RawNginx(d, wasm, http, host=request.param, extra_http=extra_http)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


def probe(**config) -> str:
    """A `proxy_wasm probe ...;` that dispatches a call and answers with its outcome."""
    return f"proxy_wasm probe {nginx_quote(json.dumps({'request_headers': 'pause_call', 'call_response': 'report', **config}))};"


class Answering:
    """An HTTP server on a thread answering 200 `called` to every request."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("content-length", "6")
                self.end_headers()
                self.wfile.write(b"called")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """A TCP server that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def stop(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PROBE_MODULE = f"    module probe {PROBE_WASM};"


def test_resolver_add_maps_a_call_host_name_to_its_address(raw_nginx):
    """`resolver_add IP HOST` (wasm{} and the http levels): dispatch_http_call to `HOST:port`
    reaches IP; without the directive the name does not resolve (.test is reserved)."""
    up = Answering()
    try:
        n = raw_nginx(PROBE_MODULE + "\n    resolver_add 127.0.0.1 wasm-level.kong.test;", f"""
        resolver_add 127.0.0.1 http-level.kong.test;
        location /wasm {{ {probe(call_upstream=f"wasm-level.kong.test:{up.port}")} }}
        location /http {{ {probe(call_upstream=f"HTTP-Level.kong.test:{up.port}")} }}
        location /unmapped {{ {probe(call_upstream=f"unmapped.kong.test:{up.port}")} }}""")
        assert n.get("/wasm").text == "200"
        assert n.get("/http").text == "200"
        assert n.get("/unmapped").text == "failed"
    finally:
        up.stop()


def test_socket_timeouts_are_the_defaults_of_a_call_without_a_timeout(raw_nginx):
    """A filter's dispatch_http_call with timeout 0 takes `wasm_socket_connect|send|read_timeout`
    (connect, then send + read for the exchange), as in ngx_wasm_module; a filter's own timeout
    wins. Before these directives, a timeout of 0 failed the call at once."""
    silent = Silent()
    try:
        n = raw_nginx(PROBE_MODULE, f"""
        wasm_socket_send_timeout 300ms;
        location /directive {{ wasm_socket_read_timeout 400ms; {probe(call_upstream=f"127.0.0.1:{silent.port}", call_timeout_ms=0)} }}
        location /own {{ wasm_socket_read_timeout 10s; {probe(call_upstream=f"127.0.0.1:{silent.port}", call_timeout_ms=250)} }}""")
        start = time.monotonic()
        assert n.get("/directive").text == "failed"
        took = time.monotonic() - start
        assert 0.65 <= took < 3, took
        start = time.monotonic()
        assert n.get("/own").text == "failed"
        took = time.monotonic() - start
        assert 0.2 <= took < 1.5, took
    finally:
        silent.stop()


@pytest.mark.parametrize("wasm_level", ["", "proxy_wasm_log_dispatch_errors off;"])
def test_proxy_wasm_log_dispatch_errors_governs_the_failed_call_log_line(raw_nginx, wasm_level):
    """A failed call is logged at `error` (ngx_wasm_module's default, `on`); `off` at a level,
    or in wasm{} for the levels that do not say, silences it."""
    quiet, loud = closed_port(), closed_port()
    n = raw_nginx(PROBE_MODULE + "\n    " + wasm_level, f"""
        location /quiet {{ {"" if wasm_level else "proxy_wasm_log_dispatch_errors off;"} {probe(call_upstream=f"127.0.0.1:{quiet}")} }}
        location /loud {{ proxy_wasm_log_dispatch_errors on; {probe(call_upstream=f"127.0.0.1:{loud}")} }}""")
    assert n.get("/quiet").text == "failed"
    assert n.get("/loud").text == "failed"
    log = n.log.read_text()
    assert f'[error]' in log and f'tollgate: dispatch_http_call to "127.0.0.1:{loud}" failed: connection refused or unreachable' in log, log[-2000:]
    assert f"127.0.0.1:{quiet}" not in log, log[-2000:]


def test_a_configuration_written_for_kongs_module_loads_and_answers(raw_nginx):
    """One configuration in ngx_wasm_module's own terms, many of its directives at once: it
    passes `nginx -t`, serves a filter chain and makes a call through `resolver_add`."""
    up = Answering()
    try:
        wasm = f"""
    module jwt_auth {WASM_DIR / 'tollgate_jwt_auth.wasm'};
    {PROBE_MODULE}
    compiler auto;
    backtraces on;
    shm_kv tenants 12k eviction=lru;
    shm_queue jobs 64k;
    socket_connect_timeout 5s;
    socket_send_timeout 5s;
    socket_read_timeout 5s;
    socket_buffer_size 4k;
    socket_buffer_reuse on;
    socket_large_buffers 4 8k;
    resolver_timeout 5s;
    tls_trusted_certificate /etc/ssl/certs/ca-certificates.crt;
    tls_verify_cert off;
    tls_verify_host off;
    tls_no_verify_warn on;
    proxy_wasm_log_dispatch_errors on;
    wasmtime {{
        flag static_memory_maximum_size 1m;
        flag debug_info off;
    }}
    metrics {{
        slab_size 5m;
        max_metric_name_length 256;
    }}"""
        extra_http = """
    resolver_add 127.0.0.1 upstream.kong.test;
    wasm_socket_connect_timeout 5s;
    wasm_socket_read_timeout 5s;
    wasm_socket_send_timeout 5s;
    wasm_socket_buffer_size 1k;
    wasm_socket_large_buffers 4 8k;
    wasm_response_body_buffers 4 4k;
    wasm_postpone_rewrite off;
    wasm_postpone_access off;
    proxy_wasm_isolation none;
    proxy_wasm_request_headers_in_access off;"""
        n = raw_nginx(wasm, f"""
        location /api {{ proxy_wasm jwt_auth '{GOOD_JWT}'; return 200 passed; }}
        location /call {{ proxy_wasm_log_dispatch_errors off; {probe(call_upstream=f"upstream.kong.test:{up.port}")} }}""",
                      extra_http=extra_http)
        assert n.test_config().returncode == 0
        assert n.get("/api").status_code == 401
        assert n.get("/call").text == "200"
    finally:
        up.stop()
