"""Shared queues (`proxy_register/resolve/enqueue/dequeue_shared_queue`, `proxy_on_queue_ready`)
with the filter tests/e2e/testdata/queue.wat, on Envoy and on nginx with 2 workers: messages
enqueued in any worker are delivered through `on_queue_ready` and dequeued exactly once, whole.
nginx only: `shm_queue NAME SIZE;` declares the queue, `proxy_resolve_shared_queue` finds it
under the vm_id (the `module` name) that registered it, and a filter registering an undeclared
queue fails `nginx -t`."""
from __future__ import annotations

import concurrent.futures
import json
import struct
import time
import types

import pytest
import requests

from lab import EnvoyGateway, EnvoyHost, FilterSpec, GatewaySpec, selected_hosts
from test_nginx_conf import MINIMAL, nginx_t
from test_nginx_module import compile_wat, nginx  # noqa: F401  (the fixture)

NGINX = pytest.mark.skipif("nginx" not in selected_hosts(), reason="TOLLGATE_HOSTS has no nginx")
HOSTS = [h for h in ("envoy", "nginx") if h in selected_hosts()]


def counts(n) -> tuple[int, int]:
    r = n.get("/count")
    assert r.status_code == 200 and len(r.content) == 8, (r.status_code, r.content)
    return struct.unpack("<II", r.content)


def wait_for_count(n, want: int, timeout: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    got = counts(n)
    while got[0] < want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = counts(n)
    return got


def start_envoy(tmp_path, wasm, upstream_port: int) -> EnvoyGateway:
    """Envoy with queue.wat as its only filter, in the VM "queue" (2 workers)."""
    host = EnvoyHost(tmp_path)
    spec = GatewaySpec(filters=[FilterSpec("queue", {}, root_id="queue")], upstreams={"upstream": upstream_port}, workers=2)
    path, listen, admin = host.render(spec)
    config = json.loads(path.read_text())
    vm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]["typed_config"]["config"]
    vm["vm_config"]["vm_id"] = "queue"
    vm["vm_config"]["code"]["local"]["filename"] = str(wasm)
    path.write_text(json.dumps(config))
    return EnvoyGateway(path, listen, admin, spec.workers, 60)


@pytest.fixture
def gateway(request, nginx, tmp_path, upstream):  # noqa: F811
    wasm = compile_wat("queue.wat", tmp_path / "queue.wasm")
    if request.param == "nginx":
        n = nginx(f"    module queue {wasm};\n    shm_queue jobs 64k;",
                  "        location / { proxy_wasm queue; return 200 upstream; }", workers=2)
        yield types.SimpleNamespace(url=f"http://127.0.0.1:{n.port}", get=n.get)
        return
    g = start_envoy(tmp_path, wasm, upstream.port)
    try:
        yield types.SimpleNamespace(url=g.url, get=lambda path: requests.get(g.url + path, timeout=10))
    finally:
        g.stop()


@pytest.mark.parametrize("gateway", HOSTS, indirect=True)
def test_messages_from_every_worker_are_dequeued_exactly_once(gateway):
    n = gateway
    paths = [f"/enq/{i:04d}" for i in range(300)]

    def send(path: str) -> requests.Response:
        with requests.Session() as s:
            return s.get(n.url + path, timeout=10)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(send, paths))
    assert [r.status_code for r in replies] == [200] * len(paths)
    assert {r.headers.get("x-status") for r in replies} == {"0"}
    got = wait_for_count(n, len(paths))
    time.sleep(0.3)  # a second delivery of any message would show by now
    again = counts(n)
    print(f"enqueued {len(paths)}, dequeued {again[0]} messages, {again[1]} bytes")
    assert got[0] == len(paths) and again == got, "each message dequeued exactly once"
    assert again[1] == sum(len(p) for p in paths), "the messages arrived whole"
    assert n.get("/other").status_code == 200, "other requests pass through"


@NGINX
def test_resolve_needs_the_vm_id_of_the_registering_module(nginx, tmp_path):
    """The filter resolves "jobs" under vm_id "queue": loaded as module "other", it registered
    the queue under "other", so the resolve is NotFound (1) and nothing is enqueued."""
    wasm = compile_wat("queue.wat", tmp_path / "queue.wasm")
    n = nginx(f"    module other {wasm};\n    shm_queue jobs 64k;",
              "        location / { proxy_wasm other; return 200 upstream; }")
    r = n.get("/enq/1")
    assert r.status_code == 503 and r.headers.get("x-status") == "1"
    time.sleep(0.1)
    assert counts(n) == (0, 0)


@NGINX
def test_a_filter_registering_an_undeclared_queue_fails_nginx_t(tmp_path):
    wasm = compile_wat("queue.wat", tmp_path / "queue.wasm")
    text = MINIMAL.replace("module jwt_auth target/wasm32-wasip1/release/tollgate_jwt_auth.wasm;",
                           f"module queue {wasm};")
    r = nginx_t(text % {"wasm": "shm_queue other 64k;", "location": "proxy_wasm queue;"}, tmp_path)
    assert r.returncode != 0
    assert 'shared queue "jobs" is not declared: add `shm_queue jobs SIZE;`' in r.stderr, r.stderr[-2000:]
    r = nginx_t(text % {"wasm": "shm_queue jobs 64k;", "location": "proxy_wasm queue;"}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
