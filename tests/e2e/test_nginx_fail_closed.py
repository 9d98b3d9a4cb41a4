"""A gate fails closed in the nginx host: whenever a filter of a location's chain cannot run on a
request (its HTTP context could not be created, its instance trapped and could not be
rebuilt with its root context, the module has no root context in the worker), that request is
refused with 500 and an error log line naming the filter, never passed on without it (Envoy's
`fail_open: false`). On both nginx builds, with the test-only probe filter as the guard."""
from __future__ import annotations

import concurrent.futures
import http.server
import json
import threading
import time

import pytest

from lab import PROBE_WASM, nginx_quote, selected_nginx_hosts
from test_nginx_module import compile_wat

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

PROBE = f"    module probe {PROBE_WASM};"


def probe(**config) -> str:
    return nginx_quote(json.dumps(config))


@pytest.fixture
def nginx(raw_nginx):
    """conftest's `raw_nginx`: `start(wasm, http, workers=1, **kw)` on each nginx build."""
    return raw_nginx


def test_a_guard_whose_http_context_cannot_be_created_refuses_instead_of_passing(nginx):
    """The guard answers 418 to everything; its instance traps while creating its second HTTP
    context. That request gets 500 (not the upstream's 200), and the replaced instance guards
    the next ones again."""
    n = nginx(PROBE, f"""
        location / {{ proxy_wasm probe {probe(request_headers="local", trap_on_context=2)}; return 200 passed; }}""")
    codes = [n.get("/").status_code for _ in range(6)]
    assert 200 not in codes, codes
    assert codes[:3] == [418, 500, 418], codes
    log = n.log.read_text()
    assert 'tollgate: filter "probe" (module "probe") failed in proxy_on_request_headers: proxy_on_context_create: wasm trap' in log
    assert 'module "probe" trapped: replacing its instance' in log


def test_a_filter_without_a_root_context_after_its_instance_was_replaced_refuses(nginx):
    """`on_configure` succeeds once (the master's check and the worker's first instance), then
    refuses: after a trap replaces the instance, the filter has no root context in the worker.
    Its requests are refused with 500 from then on, not passed."""
    n = nginx(PROBE, f"""
        location /guarded {{ proxy_wasm probe {probe(configure="once:guard")}; return 200 passed; }}
        location /trap {{ proxy_wasm probe {probe(request_headers="trap")}; return 200 never; }}""")
    assert n.get("/guarded").status_code == 200
    assert n.get("/trap").status_code == 500
    assert [n.get("/guarded").status_code for _ in range(3)] == [500] * 3
    log = n.log.read_text()
    assert "probe-configured-guard configured before: refusing" in log
    assert 'filter "probe" cannot run on this request: it has no root context in this worker' in log


def test_a_module_with_only_a_root_context_used_as_an_http_filter_refuses(nginx):
    """The SDK cannot create an HTTP context for a root context without a context type (it
    traps): every request through it is refused, as Envoy answers 5xx."""
    n = nginx(PROBE, f"""
        location / {{ proxy_wasm probe {probe(root_only=True)}; return 200 passed; }}""")
    assert [n.get("/").status_code for _ in range(3)] == [500] * 3


def test_a_failed_response_callback_replaces_the_response(nginx):
    n = nginx(PROBE, f"""
        location / {{ proxy_wasm probe {probe(response_headers="trap")}; return 200 passed; }}""")
    r = n.get("/")
    assert r.status_code == 500 and "passed" not in r.text
    assert "on_response_headers failed: answering 500 instead of the response" in n.log.read_text()


class _SlowUpstream(http.server.BaseHTTPRequestHandler):
    """Answers 200 `upstream` after 1 s (`?s=SECONDS`: after that long): a request still in
    flight while another traps."""

    def do_GET(self):
        _, _, query = self.path.partition("?s=")
        time.sleep(float(query or 1.0))
        body = b"upstream"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def guarded_slow(nginx, tmp_path):
    """nginx with the trapping guard (testdata/trap.wat) on `/slow` (proxied to `_SlowUpstream`)
    and on `/trap` (which traps it)."""
    wasm = compile_wat("trap.wat", tmp_path / "trap.wasm")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        yield nginx(f"    module trap {wasm};", f"""
        location /slow {{ proxy_wasm trap; proxy_pass http://127.0.0.1:{upstream.server_address[1]}; }}
        location /trap {{ proxy_wasm trap; return 200 never; }}""")
    finally:
        upstream.shutdown()


def test_a_response_whose_filter_instance_was_replaced_meanwhile_is_refused(guarded_slow):
    """The guard exports no response callback (testdata/trap.wat: on_request_headers only), so
    the header filter skips the chain for the response unless a filter of it failed. Request A
    passes the guard and waits on a slow upstream; request B makes the guard trap, which replaces
    the instance that holds A's HTTP context (the worker marks A's filter failed, an orphan). A's
    response is refused (500), never passed on without its filter."""
    n = guarded_slow
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        a = pool.submit(n.get, "/slow")
        time.sleep(0.4)
        assert n.get("/trap").status_code == 500
        r = a.result(timeout=10)
    assert r.status_code == 500 and "upstream" not in r.text, (r.status_code, r.text)
    assert n.get("/slow").status_code == 200, "the replaced instance guards the next requests"
    assert "on_response_headers failed: answering 500 instead of the response" in n.log.read_text()


def test_requests_in_flight_are_refused_after_others_finished_out_of_order(guarded_slow):
    """The worker lists the requests in flight so that a replaced instance's requests are refused
    (above); each leaves the list when it ends, the last one taking its place. Requests end out
    of order here (B before A and C), then D is in flight when the guard traps: D is refused, the
    requests that ended were answered, and the next request passes (a context left in the list
    would be taken for a live request: `request/in_flight.rs` is unit-tested for its places)."""
    n = guarded_slow
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        early = []
        for seconds in (1.0, 0.1, 1.0):
            early.append(pool.submit(n.get, f"/slow?s={seconds}"))
            time.sleep(0.15)
        assert [f.result(timeout=10).status_code for f in early] == [200, 200, 200]
        d = pool.submit(n.get, "/slow?s=1.0")
        time.sleep(0.4)
        assert n.get("/trap").status_code == 500
        r = d.result(timeout=10)
    assert r.status_code == 500 and "upstream" not in r.text, (r.status_code, r.text)
    assert n.get("/slow?s=0.1").status_code == 200
