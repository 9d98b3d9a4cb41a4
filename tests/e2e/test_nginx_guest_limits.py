"""The nginx host bounds every guest: a call into a filter that does not return within its
deadline is interrupted (wasmtime epochs), and an instance cannot grow its linear memory past
its cap. Either way the request that hit it gets 500, the error log names the module, the
filter and the callback, the instance is replaced (its memory given back) and the worker goes on
serving. On both nginx builds (glibc and musl), with the test-only probe filter
(tests/filters/probe) playing the hostile guest."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import requests

from lab import PROBE_WASM, nginx_quote, selected_nginx_hosts

# The guests' CPU deadlines (fuel, epochs): run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")]

PROBE = f"    module probe {PROBE_WASM};"


def probe(**config) -> str:
    return nginx_quote(json.dumps(config))


@pytest.fixture
def nginx(raw_nginx):
    """conftest's `raw_nginx`: `start(wasm, http, workers=1, **kw)` on each nginx build."""
    return raw_nginx


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def test_a_looping_on_request_headers_is_interrupted_and_both_workers_keep_serving(nginx):
    n = nginx(PROBE, f"""
        location /loop {{ proxy_wasm probe {probe(request_headers="loop")}; return 200 never; }}
        location /ok {{ return 200 ok; }}""", workers=2)
    workers = n.workers()
    for _ in range(6):
        start = time.monotonic()
        r = n.get("/loop", timeout=5)
        assert r.status_code == 500
        assert time.monotonic() - start < 2, "interrupted near its deadline (100 ms by default)"
    for _ in range(20):
        assert n.get("/ok").status_code == 200
    assert n.workers() == workers, "no worker died"
    log = n.log.read_text()
    assert 'filter "probe" (module "probe") failed in proxy_on_request_headers: proxy_on_request_headers: deadline of 100 ms exceeded' in log
    assert 'module "probe" trapped: replacing its instance' in log


def test_nginx_quit_works_while_a_guest_loops(nginx):
    n = nginx(PROBE, f"""
        location /loop {{ proxy_wasm probe {probe(request_headers="loop")}; return 200 never; }}""", workers=2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(n.get("/loop", timeout=10).status_code)) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert n.signal("quit").returncode == 0
    n.process.proc.wait(timeout=10)
    for t in threads:
        t.join(timeout=10)
    assert results == [500] * 4


@pytest.mark.parametrize("callback,location,config", [
    ("proxy_on_request_body", "location /l { proxy_wasm probe %s; return 200 never; }", {"request_body": "loop"}),
    ("proxy_on_response_headers", "location /l { proxy_wasm probe %s; return 200 never; }", {"response_headers": "loop"}),
])
def test_looping_body_and_response_callbacks_are_interrupted(nginx, callback, location, config):
    n = nginx(PROBE, "        " + location % probe(**config) + "\n        location /ok { return 200 ok; }")
    for _ in range(3):
        r = requests.post(f"http://127.0.0.1:{n.port}/l", data=b"x" * 100, timeout=5)
        assert r.status_code == 500
        assert n.get("/ok").status_code == 200
    assert f"failed in {callback}: {callback}: deadline of 100 ms exceeded" in n.log.read_text()


def test_a_looping_on_tick_is_interrupted_and_the_worker_keeps_serving(nginx):
    n = nginx(PROBE, f"""
        location /t {{ proxy_wasm probe {probe(tick="loop")}; return 200 t; }}
        location /ok {{ return 200 ok; }}""")
    time.sleep(0.5)
    for _ in range(10):
        assert n.get("/ok", timeout=5).status_code == 200
    log = n.log.read_text()
    assert "on_tick: proxy_on_tick: deadline of 100 ms exceeded" in log


def test_a_looping_on_http_call_response_fails_its_paused_request(nginx, answer_server):
    n = nginx(PROBE, """
        location /c { proxy_wasm probe %s; return 200 resumed; }
        location /ok { return 200 ok; }""" % probe(request_headers="pause_call", call_response="loop",
                                                   call_upstream=f"127.0.0.1:{answer_server}"))
    for _ in range(3):
        r = n.get("/c", timeout=5)
        assert r.status_code == 500
        assert n.get("/ok").status_code == 200
    assert "proxy_on_http_call_response: deadline of 100 ms exceeded" in n.log.read_text()


def test_a_looping_on_configure_fails_nginx_t_within_its_startup_deadline(nginx, tmp_path):
    n = nginx(PROBE, "        location /ok { return 200 ok; }")
    n.conf.write_text(n.conf.read_text()
                      .replace(PROBE, PROBE + "\n    tollgate_guest_deadline 50ms 300ms;")
                      .replace("location /ok { return 200 ok; }", "location /ok { proxy_wasm probe %s; return 200 ok; }" % probe(configure="loop")))
    start = time.monotonic()
    t = n.test_config()
    assert t.returncode != 0
    assert time.monotonic() - start < 15
    assert "proxy_on_configure: deadline of 300 ms exceeded" in t.stderr
    # A reload with it is refused (the master validates it): the old configuration keeps serving.
    os.kill(n.process.proc.pid, signal.SIGHUP)
    time.sleep(2)
    assert n.get("/ok").status_code == 200


def test_the_deadline_is_configurable(nginx):
    n = nginx(PROBE + "\n    tollgate_guest_deadline 20ms;", f"""
        location /spin {{ proxy_wasm probe {probe(request_headers="spin:60")}; return 200 spun; }}""")
    assert n.get("/spin").status_code == 500
    n2 = nginx(PROBE, f"""
        location /spin {{ proxy_wasm probe {probe(request_headers="spin:60")}; return 200 spun; }}""")
    assert n2.get("/spin").text == "spun", "60 ms is within the default deadline (100 ms)"


@pytest.mark.parametrize("directive", ["tollgate_guest_deadline 0;", "tollgate_guest_deadline 1x;",
                                       "tollgate_guest_memory 10k;", "tollgate_guest_memory lots;"])
def test_bad_limit_directives_fail_nginx_t(nginx, directive):
    n = nginx(PROBE, "        location /ok { return 200 ok; }")
    n.conf.write_text(n.conf.read_text().replace(PROBE, PROBE + "\n    " + directive))
    t = n.test_config()
    assert t.returncode != 0 and directive.split()[0] in t.stderr, t.stderr


def test_a_guest_cannot_grow_past_its_memory_cap_and_its_memory_is_given_back(nginx):
    n = nginx(PROBE, f"""
        location /grow {{ proxy_wasm probe {probe(request_headers="grow:48")}; return 200 grown; }}
        location /ok {{ proxy_wasm probe {probe()}; return 200 ok; }}""")
    [worker] = n.workers()
    for _ in range(5):
        assert n.get("/ok").status_code == 200
    start = rss_kib(worker)
    codes, peak = [], start
    for _ in range(9):
        codes.append(n.get("/grow").status_code)
        peak = max(peak, rss_kib(worker))
        if codes[-1] == 500:
            after = rss_kib(worker)
            assert after < start + 8 * 1024, f"the replaced instance's memory was given back: {start} -> {after} KiB"
    # 48 MiB kept per request: the third passes the default cap (128 MiB) and fails; the new
    # instance starts over.
    assert codes == [200, 200, 500] * 3, codes
    assert peak < start + 128 * 1024 + 8 * 1024, (start, peak)
    assert n.get("/ok").status_code == 200
    log = n.log.read_text()
    assert "memory limit of 128 MiB reached" in log and 'module "probe" trapped: replacing its instance' in log


def test_the_memory_cap_is_configurable(nginx):
    n = nginx(PROBE + "\n    tollgate_guest_memory 24m;", f"""
        location /grow {{ proxy_wasm probe {probe(request_headers="grow:16")}; return 200 grown; }}""")
    assert [n.get("/grow").status_code for _ in range(4)] == [200, 500, 200, 500]
    assert "memory limit of 24 MiB reached" in n.log.read_text()
