"""A gate fails closed in the nginx host: whenever a filter of a location's chain cannot run on a
request (its HTTP context could not be created, its instance trapped and could not be
rebuilt with its root context, the module has no root context in the worker), that request is
refused with 500 and an error log line naming the filter, never passed on without it (Envoy's
`fail_open: false`). On both nginx builds, with the test-only probe filter as the guard."""
from __future__ import annotations

import json

import pytest

from harness import PROBE_WASM, RawNginx, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

PROBE = f"    module probe {PROBE_WASM};"


def probe(**config) -> str:
    return nginx_quote(json.dumps(config))


@pytest.fixture(params=selected_nginx_hosts())
def nginx(request, tmp_path):
    started = []

    def start(wasm: str, http: str, workers: int = 1, **kw) -> RawNginx:
        d = tmp_path / f"n{len(started)}"
        d.mkdir()
        n = RawNginx(d, wasm, http, workers, host=request.param, **kw)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


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
    assert 'tollgate: filter "probe" cannot run on this request: proxy_on_context_create: wasm trap' in log
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
