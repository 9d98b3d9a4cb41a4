"""Running out of metrics space never changes which filters run (nginx host).

A filter that defines metric after metric fills the metrics zone (4,096 definitions); from then
on the host answers `proxy_define_metric` with an error status, logs it once per worker and
counts it in `tollgate_metrics_overflow_total`. A reload that adds jwt-auth, which defines its
own counters in `on_configure`, comes up with jwt-auth running: requests without a token get
401, never 200 (before, the SDK turned the error into a trap in every new worker and the chain
ran without jwt-auth). On both nginx builds."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import requests

import tokens
from lab import PROBE_WASM, WASM_DIR, RawNginx, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

SECRET = "overflow-e2e-secret-0123456789abcdef0123"
JWT = nginx_quote(json.dumps({"providers": {"p": {"issuer": tokens.ISSUER, "hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}}}))
MODULES = f"""    module probe {PROBE_WASM};
    module jwt_auth {WASM_DIR / 'tollgate_jwt_auth.wasm'};"""
FILL = nginx_quote(json.dumps({"request_headers": "define_metrics:400"}))


@pytest.fixture
def nginx(raw_nginx):
    def start(http: str, workers: int = 2) -> RawNginx:
        return raw_nginx(MODULES, http, workers)

    return start


def token() -> str:
    import jwt as pyjwt
    now = int(time.time())
    return pyjwt.encode({"iss": tokens.ISSUER, "sub": "alice", "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")


def overflow(n: RawNginx) -> int:
    text = n.get("/metrics").text
    line = next(l for l in text.splitlines() if l.startswith("tollgate_metrics_overflow_total "))
    return int(line.split()[1])


def test_a_full_metrics_zone_never_disables_a_filter_added_by_a_reload(nginx):
    n = nginx(f"""        location /fill {{ proxy_wasm probe {FILL}; return 200 filled; }}
        location /metrics {{ tollgate_metrics; }}""")
    refused = 0
    for _ in range(40):
        r = n.get("/fill")
        assert r.status_code == 200, "the filling filter itself carries on"
        refused = int(r.headers["x-probe-metrics"].split("err=")[1])
        if refused:
            break
    assert refused > 0, "the zone filled up"
    # Reload with jwt-auth added on /api: its on_configure defines counters in a full zone.
    n.conf.write_text(n.conf.read_text().replace(
        "location /metrics", f"location /api {{ proxy_wasm jwt_auth {JWT}; return 200 api; }}\n        location /metrics"))
    os.kill(n.process.proc.pid, signal.SIGHUP)
    # Until the new workers answer (the old ones serve /api from the file system).
    deadline = time.monotonic() + 20
    while n.get("/api").status_code not in (200, 401) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    codes = [n.get("/api").status_code for _ in range(10)]
    assert codes == [401] * 10, codes
    assert n.get("/api", headers={"authorization": "Bearer " + token()}).status_code == 200
    assert n.get("/fill").status_code == 200
    log = n.log.read_text()
    assert "the metrics zone is full" in log
    assert "proxy_on_configure" not in log and "trap" not in log
    # Logged once per worker (two, then two after the reload), not once per refusal.
    assert log.count("the metrics zone is full") <= 4
    assert overflow(n) > refused, "every refusal is counted, the filling filter's and jwt-auth's"
