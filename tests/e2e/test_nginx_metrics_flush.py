"""The metrics filter's counters held in each worker's VM (nginx host): they reach the metrics
zone on the root context's tick (`flush_interval_ms`), and, when a worker exits (a reload here),
at its `proxy_on_done`, so that a reload loses no count. On both nginx builds."""
from __future__ import annotations

import json
import re
import time

import pytest

from lab import WASM_DIR, RawNginx, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

MODULES = f"    module metrics {WASM_DIR / 'tollgate_metrics.wasm'};"
REQUESTS = 12


@pytest.fixture
def nginx(raw_nginx):
    def start(config: dict, workers: int = 2) -> RawNginx:
        http = f"""        location /api {{ proxy_wasm metrics {nginx_quote(json.dumps(config))}; return 200 api; }}
        location /metrics {{ tollgate_metrics; }}"""
        return raw_nginx(MODULES, http, workers)

    return start


def requests_total(n: RawNginx) -> int:
    """tollgate_requests_total summed over its series, as the zone's exposition gives it now."""
    text = n.get("/metrics").text
    return sum(int(v) for v in re.findall(r'^tollgate_requests_total\{[^}]*\} (\d+)$', text, re.M))


def serve(n: RawNginx, count: int) -> None:
    for _ in range(count):
        # A new connection each: both workers serve some.
        assert n.get("/api", headers={"connection": "close"}).status_code == 200


def test_counters_reach_the_zone_within_the_flush_interval(nginx):
    n = nginx({"flush_interval_ms": 200})
    serve(n, REQUESTS)
    deadline = time.monotonic() + 10
    while requests_total(n) != REQUESTS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert requests_total(n) == REQUESTS
    time.sleep(0.5)
    assert requests_total(n) == REQUESTS, "each count reaches the zone once"


def test_a_reload_hands_over_the_counts_the_exiting_workers_hold(nginx):
    # A minute between flushes: before the reload, every count is still in the workers' VMs.
    n = nginx({"flush_interval_ms": 60_000})
    workers = n.workers()
    serve(n, REQUESTS)
    time.sleep(0.5)
    assert requests_total(n) == 0, "held in the VMs"
    assert n.signal("reload").returncode == 0
    deadline = time.monotonic() + 20
    while set(n.workers()) & set(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(n.workers()) & set(workers), "the old workers exited"
    # The new workers serve /metrics from the same zone: the old ones' counts are there.
    assert requests_total(n) == REQUESTS
    assert "on_done" not in n.log.read_text(), "no on_done failed"
