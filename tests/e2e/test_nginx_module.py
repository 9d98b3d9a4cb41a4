"""The nginx module's own behaviour (nginx only): a trapping filter fails the request with 500
and the worker keeps serving; `nginx -s reload` repeatedly keeps serving without the master
growing; `proxy_wasm_isolation`, `proxy_wasm_request_headers_in_access`, the inheritance
of `proxy_wasm` chains between levels, HTTP trailers, and where a response's end of stream comes."""
from __future__ import annotations

import http.server
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

import tokens
from lab import WASM_DIR, RawNginx, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx module tests (TOLLGATE_HOSTS has no nginx build)")

SECRET = "module-e2e-secret-0123456789abcdef0123"
JWT = '{"providers": {"p": {"issuer": "%s", "hmac_secrets": [{"alg": "HS256", "secret": "%s"}], "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}]}}}' % (tokens.ISSUER, SECRET)


def token() -> str:
    import jwt as pyjwt
    now = int(time.time())
    return pyjwt.encode({"iss": tokens.ISSUER, "sub": "alice", "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")


@pytest.fixture(params=selected_nginx_hosts())
def nginx(request, tmp_path):
    started = []

    def start(wasm: str, http: str, workers: int = 1) -> RawNginx:
        d = tmp_path / f"n{len(started)}"
        d.mkdir()
        n = RawNginx(d, wasm, http, workers, host=request.param)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


JWT_MODULE = f"    module jwt_auth {WASM_DIR / 'tollgate_jwt_auth.wasm'};"


def test_a_trap_fails_the_request_with_500_and_the_worker_keeps_serving(nginx, tmp_path):
    wasm = compile_wat("trap.wat", tmp_path / "trap.wasm")
    n = nginx(f"    module trap {wasm};", "        location / { proxy_wasm trap; return 200 ok; }")
    workers = n.workers()
    assert n.get("/ok").status_code == 200
    assert n.get("/trap").status_code == 500
    assert n.get("/ok").status_code == 200, "the instance was replaced"
    assert n.get("/trap").status_code == 500
    assert n.workers() == workers, "the worker stayed up"
    log = n.log.read_text()
    assert 'tollgate: filter "trap" (module "trap") failed in proxy_on_request_headers: ' in log and "unreachable" in log
    assert 'module "trap" trapped: replacing its instance' in log


def compile_wat(name: str, out: pathlib.Path) -> pathlib.Path:
    wat2wasm = shutil.which("wat2wasm")
    if not wat2wasm:
        pytest.fail("wat2wasm missing: apt-get install wabt")
    subprocess.run([wat2wasm, str(pathlib.Path(__file__).parent / "testdata" / name), "-o", str(out)], check=True)
    return out


def test_a_paused_request_waits_until_the_filter_resumes_it(nginx, tmp_path):
    wasm = compile_wat("pause.wat", tmp_path / "pause.wasm")
    n = nginx(f"    module pause {wasm};", "        location / { proxy_wasm pause; return 200 ok; }")
    assert n.get("/ok").status_code == 200
    start = time.monotonic()
    r = n.get("/paused")
    waited = time.monotonic() - start
    assert r.status_code == 200 and r.text == "ok"
    assert 0.03 <= waited < 2, waited


def test_reloads_keep_serving_and_the_master_does_not_grow(nginx):
    n = nginx(JWT_MODULE, f"        location / {{ proxy_wasm jwt_auth '{JWT}'; return 200 ok; }}", workers=2)
    auth = {"authorization": "Bearer " + token()}

    master = n.process.proc.pid

    def rss() -> int:
        return int(next(l for l in open(f"/proc/{master}/status") if l.startswith("VmRSS")).split()[1])

    sizes = []
    for i in range(16):
        assert n.get("/", headers=auth).status_code == 200
        assert n.get("/").status_code == 401
        old = set(n.workers())
        os.kill(master, signal.SIGHUP)
        # Measured once the cycle is done (new workers only): during a reload the master holds
        # the compiler's transient memory, whose size depends on when it is sampled.
        deadline = time.monotonic() + 20
        now = set(n.workers())
        while time.monotonic() < deadline and (now & old or not now):
            time.sleep(0.05)
            now = set(n.workers())
        assert now and not now & old, "the reload finished within 20 s"
        sizes.append(rss())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and n.get("/", headers=auth).status_code != 200:
        time.sleep(0.2)
    assert n.get("/", headers=auth).status_code == 200
    # The compiled modules of each old cycle are dropped with it: no growth after warm-up.
    assert max(sizes[8:]) <= max(sizes[:8]) + 8 * 1024, sizes
    assert "[alert]" not in n.log.read_text()


@pytest.mark.parametrize("isolation", ["none", "stream", "filter"])
def test_isolation_modes_run_the_chain(nginx, isolation):
    n = nginx(JWT_MODULE, f"""        proxy_wasm_isolation {isolation};
        location / {{ proxy_wasm jwt_auth '{JWT}'; return 200 ok; }}""")
    assert n.get("/", headers={"authorization": "Bearer " + token()}).status_code == 200
    assert n.get("/").status_code == 401


def test_request_headers_in_access_phase(nginx):
    """`return` is a rewrite-phase directive. By default on_request_headers runs in the rewrite
    phase, before it (the module's handler runs first): no token, 401. With
    `proxy_wasm_request_headers_in_access on` the filter would run in the access phase, which
    `return` never reaches: 200."""
    n = nginx(JWT_MODULE, f"""        location /access {{ proxy_wasm_request_headers_in_access on; proxy_wasm jwt_auth '{JWT}'; return 200 ok; }}
        location /rewrite {{ proxy_wasm jwt_auth '{JWT}'; return 200 ok; }}""")
    assert n.get("/rewrite").status_code == 401
    assert n.get("/access").status_code == 200


BYPASS = JWT[:-1] + ', "rules": [{"match": {"prefix": "/"}, "bypass": true}]}'


def test_chains_are_inherited_whole_or_replaced(nginx):
    n = nginx(JWT_MODULE, f"""        proxy_wasm jwt_auth '{JWT}';
        location /inherit {{ proxy_pass http://127.0.0.1:{{port}}/; }}
        location /own {{ proxy_wasm jwt_auth '{BYPASS}'; return 200 own; }}
        location /none {{ return 200 none; }}""".replace("{port}", "1"))
    assert n.get("/inherit").status_code == 401, "the server's chain applies"
    assert n.get("/own").status_code == 200, "the location's own chain replaces the server's"
    assert n.get("/none").status_code == 401, "a location without proxy_wasm inherits the server's chain"


class _Http10Handler(http.server.BaseHTTPRequestHandler):
    """Answers HTTP/1.0 without a Content-Length (the body ends with the connection)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.end_headers()
        self.wfile.write(b"from upstream\n")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def lengthless_upstream():
    """An upstream whose responses nginx can only relay chunked to HTTP/1.1 clients."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http10Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def raw_get(port: int, path: str) -> tuple[str, bytes]:
    """An HTTP/1.1 GET on a raw socket: the response head (lower-case) and the raw body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().lower(), body


def dechunk(body: bytes) -> tuple[bytes, dict[str, str]]:
    """A chunked body's data and its trailer section (which must be complete)."""
    data = b""
    while True:
        line, _, body = body.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        data += body[:size]
        assert body[size:size + 2] == b"\r\n"
        body = body[size + 2:]
    assert body.endswith(b"\r\n"), body
    trailers = {}
    for line in body.split(b"\r\n")[:-1]:
        if line:
            name, _, value = line.partition(b":")
            trailers[name.decode().lower()] = value.strip().decode()
    return data, trailers


def test_response_trailers_of_a_filter_reach_http11_clients_when_nginx_can_send_them(nginx, tmp_path, lengthless_upstream):
    """nginx sends `headers_out.trailers` after the last chunk of a chunked HTTP/1.1 response.
    Trailers set at the end of the body reach the client when the response is chunked anyway
    (an upstream response without Content-Length); trailers set with the response headers make
    nginx chunk it (as `add_trailer` does), and on_response_trailers then runs with them at the
    end. A Content-Length response keeps its length and carries no trailers."""
    wasm = compile_wat("trailers.wat", tmp_path / "trailers.wasm")
    n = nginx(f"    module trailers {wasm};", f"""        location /up {{ proxy_wasm trailers; proxy_pass http://127.0.0.1:{lengthless_upstream}; }}
        location /headers {{ proxy_wasm trailers h; return 200 ok; }}
        location /length {{ proxy_wasm trailers; return 200 ok; }}""")

    head, body = raw_get(n.port, "/up")
    assert head.startswith("http/1.1 200") and "\r\ntransfer-encoding: chunked" in head, head
    data, trailers = dechunk(body)
    assert data == b"from upstream\n"
    assert trailers == {"x-trailer": "yes"}, "nginx had no trailers by the last buffer: no on_response_trailers"

    head, body = raw_get(n.port, "/headers")
    assert "\r\ntransfer-encoding: chunked" in head and "content-length" not in head, head
    data, trailers = dechunk(body)
    assert data == b"ok"
    assert trailers == {"x-trailer": "yes", "x-trailers-seen": "1"}

    head, body = raw_get(n.port, "/length")
    assert "\r\ncontent-length: 2" in head and "transfer-encoding" not in head, head
    assert body == b"ok"
    assert "[alert]" not in n.log.read_text() and "tollgate: response trailers" not in n.log.read_text()


def test_a_response_complete_by_its_length_ends_with_its_last_bytes(nginx, tmp_path, answer_server, lengthless_upstream):
    """A proxied response with a Content-Length ends for the filters with the callback that
    brings its last bytes (end_of_stream set with data, as Envoy's codec delivers it), not with
    the empty last buffer nginx sends after it: one guest entry fewer a response. The filter
    overwrites the bytes of a body callback that has both. An upstream without a length ends
    with the connection, so its end comes without bytes and the body passes as sent."""
    wasm = compile_wat("body_end.wat", tmp_path / "body_end.wasm")
    n = nginx(f"    module body_end {wasm};", f"""        location /length {{ proxy_wasm body_end; proxy_pass http://127.0.0.1:{answer_server}; }}
        location /lengthless {{ proxy_wasm body_end; proxy_pass http://127.0.0.1:{lengthless_upstream}; }}""")
    for _ in range(3):
        head, body = raw_get(n.port, "/length")
        assert head.startswith("http/1.1 200") and "\r\ncontent-length: 6" in head, head
        assert body == b"E" * 6, body
        head, body = raw_get(n.port, "/lengthless")
        assert "\r\ntransfer-encoding: chunked" in head, head
        assert dechunk(body)[0] == b"from upstream\n"
    assert "[alert]" not in n.log.read_text()


def test_writes_to_request_trailers_are_refused_with_bad_argument(nginx, tmp_path):
    """nginx 1.22 discards request trailers (chunked bodies' trailer section, HTTP/2): the map
    stays empty, on_request_trailers never runs, and a write returns BadArgument (2), as Envoy
    answers for a trailer map the stream does not have."""
    wasm = compile_wat("trailers.wat", tmp_path / "trailers.wasm")
    n = nginx(f"    module trailers {wasm};", "        location / { proxy_wasm trailers; return 200 ok; }")
    r = n.get("/")
    assert r.status_code == 200 and r.headers["x-request-trailer-write"] == "2"
    # A chunked request body with a trailer section: nginx drops the trailers, same answer.
    with socket.create_connection(("127.0.0.1", n.port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"2\r\nhi\r\n0\r\nx-req: 1\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode().lower()
    assert head.startswith("http/1.1 200") and "\r\nx-request-trailer-write: 2" in head, head


def test_a_request_paused_until_on_queue_ready_resumes(nginx):
    """The probe filter pauses the request, enqueues a message on its shared queue, and resumes
    the request from its root context's on_queue_ready (proxy_set_effective_context then
    proxy_continue_stream): the third way a filter resumes, beside a call's response and a tick."""
    import json
    from lab import PROBE_WASM, nginx_quote
    n = nginx(f"    module probe {PROBE_WASM};\n    shm_queue probe 64k;",
              "        location / { proxy_wasm probe %s; return 200 resumed; }" % nginx_quote(json.dumps({"request_headers": "pause_queue"})))
    for _ in range(3):
        r = n.get("/q", timeout=5)
        assert r.status_code == 200 and r.text == "resumed"
