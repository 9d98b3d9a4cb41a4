"""Internal redirects and subrequests in the nginx host: the chain of the location that finally
serves a request always runs on it, and a filter never runs twice on one request.

A request that nginx sends from a location to another (`rewrite ... last`, `try_files ...
@named`, `error_page 404 = ...`, `index`, `X-Accel-Redirect`) runs the filters of the target
location's chain that have not run on it yet; an `auth_request` subrequest into a location with a
chain runs that chain as a request of its own. jwt-auth guards the target: no token 401, a valid
token 200, and a rate-limit that both locations share counts each request once. On both nginx
builds."""
from __future__ import annotations

import http.server
import json
import pathlib
import shutil
import tempfile
import threading
import time

import pytest

import tokens
from lab import WASM_DIR, RawNginx, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

SECRET = "redirect-e2e-secret-0123456789abcdef01"
JWT = nginx_quote(json.dumps({"providers": {"p": {"issuer": tokens.ISSUER, "hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}}))
RATE = nginx_quote(json.dumps({"namespace": "redir", "rules": [
    {"name": "all", "match": {"prefix": "/"}, "key": [], "limits": [{"algorithm": "fixed_window", "requests": 3, "per": "hour"}]}]}))
RATE_GENEROUS = nginx_quote(json.dumps({"namespace": "generous", "rules": [
    {"name": "all", "match": {"prefix": "/"}, "key": [], "limits": [{"algorithm": "fixed_window", "requests": 1000, "per": "hour"}]}]}))
# rate-limit refuses a zone that evicts (README, "What a filter reads"): its own, eviction=none.
MODULES = f"""    module jwt_auth {WASM_DIR / 'tollgate_jwt_auth.wasm'};
    module rate_limit {WASM_DIR / 'tollgate_rate_limit.wasm'};
    shm_kv ratelimit 1m eviction=none;"""


def token() -> str:
    import jwt as pyjwt
    now = int(time.time())
    return pyjwt.encode({"iss": tokens.ISSUER, "sub": "alice", "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")


class _Upstream(http.server.BaseHTTPRequestHandler):
    """The protected upstream: echoes the path; `/accel` answers with an X-Accel-Redirect into
    the protected location."""

    def do_GET(self) -> None:
        if self.path.startswith("/accel"):
            self.send_response(200)
            self.send_header("x-accel-redirect", "/protected/accel")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = f"upstream saw {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def upstream_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(params=selected_nginx_hosts())
def nginx(request, tmp_path, upstream_port):
    started = []
    # nginx's workers run as nobody: a document root they can read (pytest's tmp_path is not).
    docroot = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-www-"))
    docroot.chmod(0o755)
    (docroot / "dir").mkdir()
    (docroot / "dir").chmod(0o755)

    def start(http: str, workers: int = 1) -> RawNginx:
        d = tmp_path / f"n{len(started)}"
        d.mkdir()
        n = RawNginx(d, MODULES, http.replace("UPSTREAM", f"127.0.0.1:{upstream_port}").replace("DOCROOT", str(docroot)),
                     workers, host=request.param)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()
    shutil.rmtree(docroot, ignore_errors=True)


PROTECTED = f"""
        location /protected {{ proxy_wasm jwt_auth {JWT}; proxy_pass http://UPSTREAM; }}
        location @protected {{ proxy_wasm jwt_auth {JWT}; proxy_pass http://UPSTREAM; }}"""


@pytest.mark.parametrize("mechanism,path,location", [
    ("rewrite last", "/public/a", "location /public { rewrite ^ /protected/rewritten last; }"),
    ("try_files @named", "/missing", "location /missing { root DOCROOT; try_files $uri @protected; }"),
    ("error_page 404 =", "/nofile", "location /nofile { root DOCROOT; error_page 404 = /protected/error-page; }"),
    ("index", "/dir/", "location /dir/ { root DOCROOT; index /protected/index; }"),
    ("X-Accel-Redirect", "/accel", "location /accel { proxy_pass http://UPSTREAM; }"),
])
def test_an_internal_redirect_into_a_protected_location_runs_its_chain(nginx, mechanism, path, location):
    """The first location inherits the server's chain (a generous rate-limit), so the request
    already has a context when it reaches the protected location, whose own chain is jwt-auth."""
    n = nginx(f"        proxy_wasm rate_limit {RATE_GENEROUS};\n        " + location + PROTECTED)
    assert n.get(path).status_code == 401, f"{mechanism}: the target's jwt-auth ran"
    r = n.get(path, headers={"authorization": "Bearer " + token()})
    assert r.status_code == 200 and r.text.startswith("upstream saw /"), (mechanism, r.status_code, r.text)


def test_a_filter_the_request_already_passed_does_not_run_again_after_a_redirect(nginx):
    """rate-limit (3 an hour for everyone) guards both locations, the server's chain; /a rewrites
    to /b: each request is counted once, so 3 pass and the 4th is limited."""
    n = nginx(f"""        proxy_wasm rate_limit {RATE};
        location /a {{ rewrite ^ /b last; }}
        location /b {{ return 200 b; }}""")
    assert [n.get("/a").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_a_redirect_into_a_location_with_a_different_chain_adds_the_missing_filters(nginx):
    """/open has only rate-limit; it rewrites to /protected, which adds jwt-auth to the same
    rate-limit: jwt-auth runs, rate-limit is not counted twice."""
    n = nginx(f"""        location /open {{ proxy_wasm rate_limit {RATE}; rewrite ^ /protected/x last; }}
        location /protected {{ proxy_wasm rate_limit {RATE}; proxy_wasm jwt_auth {JWT}; proxy_pass http://UPSTREAM; }}""")
    auth = {"authorization": "Bearer " + token()}
    assert n.get("/open").status_code == 401
    assert n.get("/open", headers=auth).status_code == 200
    assert n.get("/open", headers=auth).status_code == 200
    assert n.get("/open", headers=auth).status_code == 429, "three requests counted, once each"


def test_an_auth_request_subrequest_runs_the_chain_of_its_location(nginx):
    """`auth_request /auth` where /auth is guarded by jwt-auth: the subrequest runs the chain
    (before: it was skipped, and every request was authorised)."""
    n = nginx(f"""        location /app {{ auth_request /auth; proxy_pass http://UPSTREAM; }}
        location = /auth {{ internal; proxy_wasm jwt_auth {JWT}; return 204; }}""")
    assert n.get("/app").status_code == 401
    r = n.get("/app", headers={"authorization": "Bearer " + token()})
    assert r.status_code == 200 and r.text == "upstream saw /app"
