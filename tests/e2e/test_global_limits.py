"""Global limits across gateway instances (issue 19): one limit shared by three gateways, two
Envoy and one nginx (Tollgate's module), through Envoy's rate limit service protocol served by the
real engine (envoyproxy/ratelimit on Redis, tests/e2e/ratelimit_engine.py), all on loopback.

The gateways run rate-limit in global mode (plugins/rate-limit/README.md, "Global mode"), 2
workers each: the same .wasm in both hosts, `dispatch_grpc_call` to the `ratelimit` cluster
(Envoy: an HTTP/2 cluster; nginx: an `upstream {}` block, the host's own gRPC client).

Host-independent (no `host` fixture): the mix of hosts is the point, so it runs once, with Envoy
and Debian's nginx. Failure drills kill and freeze the engine's parts; each test that does starts
its own engine, so that no drill leaks into another test.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import itertools
import os
import pathlib
import re
import subprocess
import json
import threading
import time
import uuid

import pytest
import requests

from lab import HOSTS, ROOT, FilterSpec, GatewaySpec, wait_until
from ratelimit_engine import DOMAIN, RatelimitEngine

# Timeouts of 50 ms and recovery times under load: run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = pytest.mark.serial

KEY = "x-api-key"
WORKERS = 2


def global_rule(name: str, limit: int, per: str = "minute") -> dict:
    return {"name": name, "match": {"prefix": f"/{name}"}, "key": [{"unverified_header": KEY}],
            "limits": [{"algorithm": "fixed_window", "requests": limit, "per": per}]}


def rate_limit_config(rules: list[dict], timeout_ms: int, on_error: str, breaker: dict | None = None) -> dict:
    block = {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": timeout_ms, "on_error": on_error}
    if breaker is not None:
        block["breaker"] = breaker
    return {"namespace": "global-e2e", "global": block, "rules": rules, "headers_on_allowed": True}


class Fleet:
    """Gateways of several hosts with one configuration; `urls` in start order."""

    def __init__(self, workdir, upstream_port: int, engine: RatelimitEngine, config: dict,
                 hosts: tuple[str, ...] | None = None):
        self.gateways = []
        hosts = hosts or fleet_hosts()
        spec = GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream_port},
                           workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port})
        try:
            for name in hosts:
                self.gateways.append(HOSTS[name](workdir).start(spec))
        except BaseException:
            self.stop()
            raise
        self.urls = [g.url for g in self.gateways]

    def stop(self) -> None:
        for g in self.gateways:
            g.stop()

    def logs(self) -> str:
        return "\n".join(g.log.read_text(errors="replace") for g in self.gateways if g.log.exists())


def fleet_hosts() -> tuple[str, ...]:
    """Two Envoys and one nginx; TOLLGATE_GLOBAL_FLEET=envoy,envoy (say) for another mix."""
    return tuple(os.environ.get("TOLLGATE_GLOBAL_FLEET", "envoy,envoy,nginx").split(","))


@pytest.fixture
def engine(request):
    failed_before = request.session.testsfailed
    e = RatelimitEngine().start()
    yield e
    e.stop(failed=request.session.testsfailed > failed_before)


def wait_for_window(seconds_left: float, per: int = 60) -> None:
    """Sleeps into the next fixed window (aligned on the Unix epoch, as the engine's are) when the
    current one has fewer than `seconds_left` seconds left, so that a burst stays in one window."""
    into = time.time() % per
    if per - into < seconds_left:
        time.sleep(per - into + 0.2)


def get(url: str, path: str, key: str, timeout: float = 10) -> requests.Response:
    return requests.get(url + path, headers={KEY: key}, timeout=timeout)


def test_one_limit_exact_across_two_envoys_and_one_nginx(workdir, upstream, engine):
    """A limit of N per minute, hit through all three gateways by 64 concurrent connections with
    10 x N requests: exactly N admitted, every other request refused with 429 (the service's
    OVER_LIMIT), none failed. The deadline is generous and failures are denied, so that a slow
    call on this loaded machine shows as a 503, never as an admission."""
    n = 50
    config = rate_limit_config([global_rule("exact", n)], timeout_ms=3000, on_error="deny")
    fleet = Fleet(workdir, upstream.port, engine, config)
    try:
        key = uuid.uuid4().hex
        wait_for_window(30)
        targets = itertools.cycle(fleet.urls)
        lock = threading.Lock()
        plan = [next(targets) for _ in range(10 * n)]

        def one(url: str) -> tuple[str, int]:
            with requests.Session() as s:
                r = s.get(url + "/exact", headers={KEY: key}, timeout=15)
            return url, r.status_code

        with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
            results = list(pool.map(one, plan))
        by_status: dict[int, int] = {}
        per_gateway: dict[str, int] = {}
        with lock:
            for url, status in results:
                by_status[status] = by_status.get(status, 0) + 1
                if status == 200:
                    per_gateway[url] = per_gateway.get(url, 0) + 1
        admitted = by_status.get(200, 0)
        print(f"\nglobal limit {n}/min through {len(fleet.urls)} gateways, {len(plan)} requests at 64 connections: "
              f"statuses {by_status}, admitted per gateway {per_gateway}, over-admission {admitted - n}")
        assert admitted == n, f"admitted {admitted} for a limit of {n}: {by_status}"
        assert by_status.get(429, 0) == len(plan) - n, by_status
        # Every gateway took part in the count (the limit is not one gateway's).
        assert len(per_gateway) >= 2, per_gateway
        # The tenant is refused on every gateway afterwards.
        for url in fleet.urls:
            assert get(url, "/exact", key).status_code == 429
    finally:
        fleet.stop()


def test_refusal_carries_the_services_window(workdir, upstream, engine):
    """OVER_LIMIT gives local mode's 429: Retry-After and the RateLimit fields from the service's
    duration_until_reset; an allowed request's RateLimit remaining counts down across hosts."""
    hosts = fleet_hosts()
    config = rate_limit_config([global_rule("window", len(hosts))], timeout_ms=3000, on_error="deny")
    fleet = Fleet(workdir, upstream.port, engine, config, hosts)
    try:
        key = uuid.uuid4().hex
        wait_for_window(10)
        remaining = []
        for url in fleet.urls:
            r = get(url, "/window", key)
            assert r.status_code == 200, r.text
            remaining.append(r.headers.get("ratelimit", ""))
        expected = [f'"window";r={len(hosts) - 1 - i};' for i in range(len(hosts))]
        assert [h.startswith(e) for e, h in zip(expected, remaining)] == [True] * len(hosts), remaining
        for url in fleet.urls:
            r = get(url, "/window", key)
            assert r.status_code == 429, r.text
            retry = int(r.headers["retry-after"])
            left = 60 - time.time() % 60
            assert 0 < retry <= 60 and abs(retry - left) <= 2, (retry, left)
    finally:
        fleet.stop()


# -- failure drills ----------------------------------------------------------------------------

DRILL_TIMEOUT_MS = 200
# A request's answer may take the call's deadline plus this (the proxies' own work on a loaded
# 2-core machine); "no request hangs longer than the timeout".
SLACK_S = 0.5
BREAKER = {"failures": 3, "open_ms": 1000}
DRILL_LIMIT = 4


def drill_rules() -> list[dict]:
    """One global rule per failure policy, each with its own `global` block."""
    rules = []
    for policy in ("local", "allow", "deny"):
        rule = global_rule(f"drill-{policy}", DRILL_LIMIT)
        rule["global"] = {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": DRILL_TIMEOUT_MS,
                          "on_error": policy, "breaker": BREAKER}
        rules.append(rule)
    return rules


def burst(fleet: Fleet, policy: str, key: str, per_gateway: int) -> tuple[dict[int, int], float]:
    """`per_gateway` sequential requests to the policy's rule on each gateway (concurrently across
    gateways): the statuses counted and the slowest answer (seconds)."""
    def run(url: str) -> list[tuple[int, float]]:
        out = []
        with requests.Session() as s:
            for _ in range(per_gateway):
                t0 = time.monotonic()
                r = s.get(url + f"/drill-{policy}", headers={KEY: key}, timeout=10)
                out.append((r.status_code, time.monotonic() - t0))
        return out

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(fleet.urls)) as pool:
        results = [x for part in pool.map(run, fleet.urls) for x in part]
    statuses: dict[int, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return statuses, max(t for _, t in results)


def expect_policy(fleet: Fleet, label: str) -> None:
    """While the service gives no verdict: `deny` refuses every request with 503, `allow` admits
    every one, `local` holds each gateway to the limit (at most N times it for N gateways); no
    answer takes longer than the deadline plus slack."""
    n = len(fleet.urls)
    per_gateway = 2 * DRILL_LIMIT
    seen = {}
    for policy in ("deny", "allow", "local"):
        statuses, slowest = burst(fleet, policy, uuid.uuid4().hex, per_gateway)
        seen[policy] = (statuses, round(slowest, 3))
        assert slowest <= DRILL_TIMEOUT_MS / 1000 + SLACK_S, f"{label}: {policy}: slowest answer {slowest:.3f} s"
        if policy == "deny":
            assert statuses == {503: n * per_gateway}, f"{label}: {statuses}"
        elif policy == "allow":
            assert statuses == {200: n * per_gateway}, f"{label}: {statuses}"
        else:
            assert set(statuses) <= {200, 429} and DRILL_LIMIT <= statuses.get(200, 0) <= n * DRILL_LIMIT, f"{label}: {statuses}"
    print(f"\n{label}: {seen}")


def recovery_seconds(fleet: Fleet, started: float, timeout: float = 20) -> float:
    """Seconds from `started` until every gateway's `deny` rule gets a verdict again (a request
    answered 200 instead of 503)."""
    pending = set(fleet.urls)
    while pending and time.monotonic() - started < timeout:
        for url in list(pending):
            if get(url, "/drill-deny", uuid.uuid4().hex).status_code == 200:
                pending.discard(url)
        time.sleep(0.05)
    assert not pending, f"no verdict after {timeout} s from {sorted(pending)}"
    return time.monotonic() - started


def test_failure_drills_follow_each_policy_and_recover(workdir, upstream, engine):
    """Redis killed, Redis frozen (SIGSTOP), the service killed: each request gets its rule's
    policy within the call's deadline; once the engine is back every gateway asks it again within
    the breaker's open time plus a call (recovery measured and printed)."""
    config = rate_limit_config(drill_rules(), timeout_ms=DRILL_TIMEOUT_MS, on_error="deny")
    fleet = Fleet(workdir, upstream.port, engine, config)
    try:
        wait_for_window(20)
        statuses, _ = burst(fleet, "deny", uuid.uuid4().hex, DRILL_LIMIT)
        assert statuses.get(200, 0) == DRILL_LIMIT and statuses.get(429, 0) == (len(fleet.urls) - 1) * DRILL_LIMIT, statuses

        engine.kill_redis()
        expect_policy(fleet, "Redis killed")
        engine.restart_redis()
        t0 = time.monotonic()
        print(f"recovery after Redis restarted: {recovery_seconds(fleet, t0):.2f} s")

        engine.freeze_redis()
        try:
            expect_policy(fleet, "Redis frozen")
        finally:
            engine.thaw_redis()
        t0 = time.monotonic()
        print(f"recovery after Redis thawed: {recovery_seconds(fleet, t0):.2f} s")

        engine.kill_service()
        expect_policy(fleet, "service killed")
        t0 = time.monotonic()
        engine.start_service()
        took = recovery_seconds(fleet, t0)
        print(f"recovery after the service restarted: {took:.2f} s")
        assert took <= 10, took
        for g in fleet.gateways:
            assert g.alive()
    finally:
        fleet.stop()


# -- bad replies -------------------------------------------------------------------------------

class FakeService:
    """A gRPC server on 127.0.0.1 answering ShouldRateLimit with whatever `reply` holds: raw
    bytes sent as the message, or a grpc.StatusCode to abort with."""

    def __init__(self):
        import grpc

        self.grpc = grpc
        self.reply: bytes | object = b""
        self.calls = 0

        def handle(request: bytes, context):
            self.calls += 1
            reply = self.reply
            if isinstance(reply, grpc.StatusCode):
                context.abort(reply, "fake service refuses")
            return reply

        handler = grpc.method_handlers_generic_handler(
            "envoy.service.ratelimit.v3.RateLimitService",
            {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(handle)},
        )
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((handler,))
        self.grpc_port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def ok_reply(remaining: int = 3) -> bytes:
    from ratelimit_engine import Code, RateLimitResponse, Unit

    r = RateLimitResponse(overall_code=Code.OK)
    s = r.statuses.add(code=Code.OK, limit_remaining=remaining)
    s.current_limit.requests_per_unit = 5
    s.current_limit.unit = Unit.MINUTE
    s.duration_until_reset.seconds = 30
    return r.SerializeToString()


def test_bad_replies_follow_the_policy_and_never_trap(workdir, upstream):
    """Malformed, truncated, oversize replies, an unknown code, a reply without statuses, a
    non-OK gRPC status: each request is refused with `deny`'s 503 and a log line on every
    gateway; no gateway traps (a good reply afterwards is admitted)."""
    import grpc

    fake = FakeService()
    good = ok_reply()
    unknown_code = bytes([0x08, 0x07]) + good[2:]  # overall_code = 7 (no such Code)
    cases = {
        "garbage": b"\xff\xff\xff\xff\x0f",
        "truncated": good[: len(good) // 2],
        "oversize": good + bytes([0x2a]) + b"\x80\xa0\x01" + b"x" * 20480,  # raw_body (5), 20 KiB
        "unknown_code": unknown_code,
        "no_statuses": bytes([0x08, 0x01]),
        "grpc_status": grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    rule = global_rule("bad", 100)
    config = rate_limit_config([rule], timeout_ms=1000, on_error="deny", breaker={"failures": 1000, "open_ms": 1000})

    class _Engine:
        grpc_port = fake.grpc_port

    fleet = Fleet(workdir, upstream.port, _Engine(), config)
    try:
        fake.reply = good
        for url in fleet.urls:
            assert get(url, "/bad", "k").status_code == 200
        for name, reply in cases.items():
            fake.reply = reply
            for url in fleet.urls:
                r = get(url, "/bad", "k")
                assert r.status_code == 503, f"{name} through {url}: {r.status_code} {r.text}"
            fake.reply = good
            for url in fleet.urls:
                assert get(url, "/bad", "k").status_code == 200, f"after {name}: a good reply refused by {url}"
        for g in fleet.gateways:
            assert g.alive()
        logs = fleet.logs()
        assert "rate_limit" in logs or "rate-limit" in logs
        assert "panicked" not in logs and "wasm trap" not in logs.lower()
    finally:
        fleet.stop()
        fake.stop()


# -- a global budget ---------------------------------------------------------------------------

TENANT = "x-tenant"
# gpt-4o-mini at LiteLLM's prices: 2000 prompt tokens (1.5e-7 USD each) and 500 completion tokens
# (6e-7 USD each) cost 6e-4 USD: 6 booking units of 1e-4 USD exactly, so that every request's
# booking is known without rounding.
PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "mode": "chat"}}
REQUEST_UNITS = 6
UNIT_NANO = 100_000
BUDGET_UNITS = 100


def llm_call(url: str, tenant: str, stream: bool) -> int:
    body = {"model": "gpt-4o-mini"}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    headers = {"content-type": "application/json", TENANT: tenant,
               "x-mock-prompt-tokens": "2000", "x-mock-completion-tokens": "500"}
    r = requests.post(url + "/v1/chat/completions", data=json.dumps(body), headers=headers, timeout=20)
    _ = r.content  # the whole (streamed) answer: its usage is booked as it ends
    return r.status_code


def redis_counters(engine: RatelimitEngine, tenant: str) -> dict[str, int]:
    """The service's counters of the tenant (Redis keys `<domain>_cost_<len>:<ledger>/<counter>/<id>
    _tenant_<tenant>_<window start>`, src/limiter/cache_key.go) by counter: {"day": units, "month":
    units}, and in a month holding a YEAR boundary "month-bridge" (plugins/cost/src/month_windows.rs).
    The claims of carries (`…-carry`) are left out: how many gateways claimed is not spend."""
    out = {}
    for key in engine.redis_command("KEYS", f"*_tenant_{tenant}_*"):
        name = key.decode()
        counter = re.search(r"/([a-z-]+)/\d+_tenant_", name) or re.search(r"/tokens/([a-z]+)/[^/]+_tenant_", name)
        period = counter.group(1) if counter else name
        if not period.endswith("-carry"):
            out[period] = int(engine.redis_command("GET", name))
    return out


def global_errors(gateways) -> dict[str, int]:
    """The gateways' failed calls to the service, by reason (`tollgate_cost_global_errors_total`),
    summed: what a miscount is read against."""
    out: dict[str, int] = {}
    for g in gateways:
        for name, value in g.stats("tollgate_cost_global_errors_total").items():
            reason = name.rsplit(".", 1)[-1]
            out[reason] = out.get(reason, 0) + value
    return out


def spend_counters(units: int) -> dict[str, int]:
    """What redis_counters holds after `units` of spend this month by a tenant with a day and a month
    budget: the day's and the month's counters, and the bridge in a month holding a YEAR boundary
    (epoch + k·365 days strictly inside the UTC month)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    start = datetime.datetime(now.year, now.month, 1, tzinfo=datetime.timezone.utc)
    end = datetime.datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=datetime.timezone.utc)
    year = 365 * 86_400
    boundary = -(-int(start.timestamp()) // year) * year
    out = {"day": units, "month": units}
    if start.timestamp() < boundary < end.timestamp():
        out["month-bridge"] = units
    return out


def test_one_budget_across_two_envoys_and_one_nginx(workdir, upstream, engine):
    """A tenant's day and month budget held by the service for three gateways, crossed by
    concurrent streaming and non-streaming requests: every admitted request booked exactly once
    (the service's counters equal the sum of the priced usages), the overspend within the stated
    bound (requests in flight when the budget was crossed, plus bookings not yet sent), and the
    tenant refused on every gateway afterwards."""
    tenant = "team-" + uuid.uuid4().hex[:8]
    budget_nano = BUDGET_UNITS * UNIT_NANO
    config = {
        "ledger": "global-e2e",
        "prices": PRICES,
        "tenant": {"unverified_header": TENANT},
        "budgets": {"tenants": {tenant: {"day_nano_usd": budget_nano, "month_nano_usd": budget_nano}}},
        "global": {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": 3000, "on_error": "deny",
                   "unit_nano_usd": UNIT_NANO},
    }
    hosts = fleet_hosts()
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                       workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port},
                       kv_zones={"global-e2e": "1m eviction=none"})
    gateways = []
    try:
        for name in hosts:
            gateways.append(HOSTS[name](workdir).start(spec))
        urls = [g.url for g in gateways]
        concurrency = 8
        plan = [(urls[i % len(urls)], i % 2 == 0) for i in range(120)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
            statuses = list(pool.map(lambda p: llm_call(p[0], tenant, p[1]), plan))
        admitted = statuses.count(200)
        refused = statuses.count(402)
        assert admitted + refused == len(plan), statuses
        # The last bookings leave each worker's outbox within a tick (1 ms in Envoy, 100 ms in nginx).
        wait_until(lambda: redis_counters(engine, tenant).get("day", 0) >= admitted * REQUEST_UNITS, timeout=10)
        time.sleep(0.5)
        counters = redis_counters(engine, tenant)
        spent = admitted * REQUEST_UNITS
        print(f"\nglobal budget {BUDGET_UNITS} units through {len(urls)} gateways, {len(plan)} requests at "
              f"{concurrency} connections: admitted {admitted} ({spent} units), refused {refused}, "
              f"service counters {counters}, overspend {spent - BUDGET_UNITS} units")
        assert counters == spend_counters(spent), counters
        # Admitted while under the budget: at least until it was reached.
        assert spent >= BUDGET_UNITS
        # The bound: what was admitted before the service had counted the spend that crossed it,
        # at most every connection's request in flight plus as many completed and not yet booked.
        assert spent - BUDGET_UNITS <= 2 * concurrency * REQUEST_UNITS, (spent, BUDGET_UNITS)
        for url in urls:
            assert llm_call(url, tenant, False) == 402
            assert llm_call(url, tenant, True) == 402
        for g in gateways:
            assert g.alive()
    finally:
        for g in gateways:
            g.stop()


# -- every host --------------------------------------------------------------------------------

def test_global_mode_on_each_host(host, workdir, upstream, engine):
    """rate-limit's global mode through one gateway of each host (Envoy, nginx, nginx on musl):
    the service's limit holds (3 admitted of 5, then 429). Kong's ngx_wasm_module has no gRPC
    calls ("no-grpc-calls"): the filter's probe traps when it loads, the worker does not start,
    and no request is admitted past the configuration."""
    from lab import kong_differs

    config = rate_limit_config([global_rule("each", 3)], timeout_ms=3000, on_error="deny")
    spec = GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream.port},
                       workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port})
    if kong_differs(host, "no-grpc-calls"):
        try:
            g = host.start(spec, timeout=15)
        except Exception as e:  # refused in the worker (Kong's `nginx -t` passes a refused configuration)
            print(f"\n{host.name}: the gateway did not start: {e}")
            return
        try:
            r = get(g.url, "/each", "k")
            assert r.status_code >= 500, f"{host.name} admitted a request under a refused global configuration: {r.status_code}"
        finally:
            g.stop()
        return
    g = host.start(spec)
    try:
        key = uuid.uuid4().hex
        wait_for_window(10)
        statuses = [get(g.url, "/each", key).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429], statuses
    finally:
        g.stop()


def test_budget_bookings_survive_a_service_outage(workdir, upstream, engine):
    """Bookings made while the service is down (killed: every call fails at once) are not lost:
    with `on_error: local` the requests are admitted on the local ledger, their bookings wait in
    the replay queue of each gateway's shared data, and once the service is back every one of
    them is counted, exactly once (the service's counters equal every admitted request's
    priced units). Exactly once holds for calls that fail without an answer; a call that times
    out may have been counted and is replayed all the same (the README's "What is lost"), so the
    calls' timeout is far above a loaded machine's round trip (a killed service fails them at
    once, so it costs no time), and the service is killed only once the last replies are in
    (Redis counts a booking before the service answers)."""
    tenant = "team-" + uuid.uuid4().hex[:8]
    budget_nano = 1_000_000 * UNIT_NANO
    config = {
        "ledger": "global-drill",
        "prices": PRICES,
        "tenant": {"unverified_header": TENANT},
        "budgets": {"tenants": {tenant: {"day_nano_usd": budget_nano, "month_nano_usd": budget_nano}}},
        "global": {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": 5000, "on_error": "local",
                   "breaker": {"failures": 3, "open_ms": 500}, "unit_nano_usd": UNIT_NANO},
    }
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                       workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port},
                       kv_zones={"global-drill": "1m eviction=none"})
    gateways = []
    try:
        for name in fleet_hosts():
            gateways.append(HOSTS[name](workdir).start(spec))
        urls = [g.url for g in gateways]
        per_phase = 4 * len(urls)

        def phase() -> int:
            statuses = [llm_call(urls[i % len(urls)], tenant, i % 2 == 0) for i in range(per_phase)]
            assert statuses == [200] * per_phase, statuses
            return per_phase

        admitted = phase()
        wait_until(lambda: redis_counters(engine, tenant).get("day", 0) >= admitted * REQUEST_UNITS, timeout=10)
        time.sleep(0.5)  # the last calls' replies arrive
        errors_before_kill = global_errors(gateways)
        engine.kill_service()
        admitted += phase()
        time.sleep(1)  # the ticks try, fail and queue
        t0 = time.monotonic()
        engine.start_service()
        wait_until(lambda: redis_counters(engine, tenant).get("day", 0) >= admitted * REQUEST_UNITS, timeout=20)
        replayed_in = time.monotonic() - t0
        time.sleep(1)  # nothing more may arrive: no booking counted twice
        counters = redis_counters(engine, tenant)
        print(f"\n{admitted} requests, half of them while the service was down: service counters {counters} "
              f"(expected {admitted * REQUEST_UNITS} units each), all counted {replayed_in:.2f} s after the service's restart began; "
              f"failed calls before the kill {errors_before_kill}, in all {global_errors(gateways)}")
        assert counters == spend_counters(admitted * REQUEST_UNITS), (counters, errors_before_kill, global_errors(gateways))
        for g in gateways:
            assert g.alive()
    finally:
        for g in gateways:
            g.stop()


# -- global token limits -------------------------------------------------------------------------

REQUEST_TOKENS = 2500  # 2000 prompt + 500 completion tokens per llm_call


def token_limit_spec(tenant: str, tokens: int, upstream, engine, on_error: str = "deny") -> GatewaySpec:
    """A cost filter whose tenant has one global token limit of `tokens` per minute (total tokens)."""
    config = {
        "ledger": "tokens-e2e", "prices": PRICES, "tenant": {"unverified_header": TENANT},
        "token_limits": {"global": True, "tenants": {tenant: [{"name": "tpm", "tokens": tokens, "per": "minute"}]}},
        "global": {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": 3000, "on_error": on_error,
                   "breaker": {"failures": 1000, "open_ms": 1000}},
    }
    return GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                       workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port},
                       kv_zones={"tokens-e2e": "1m eviction=none"})


def llm_response(url: str, tenant: str) -> requests.Response:
    headers = {"content-type": "application/json", TENANT: tenant,
               "x-mock-prompt-tokens": "2000", "x-mock-completion-tokens": "500"}
    return requests.post(url + "/v1/chat/completions", data=json.dumps({"model": "gpt-4o-mini"}),
                         headers=headers, timeout=20)


def test_one_token_limit_across_two_envoys_and_one_nginx(workdir, upstream, engine):
    """A tenant's limit of 10,000 tokens a minute counted by the service for three gateways: taken
    in turns, with the bookings' round trip between requests, 4 requests of 2,500 tokens are
    admitted in all (local mode admits 4 per gateway), the 5th is refused on every gateway with 429,
    Retry-After and the RateLimit fields of the service's count, before the upstream; the service's
    counter holds the tokens exactly. Then with the service killed, `on_error: deny` refuses with
    503 `token_limit_unavailable`."""
    tenant = "tok-" + uuid.uuid4().hex[:8]
    limit = 4 * REQUEST_TOKENS
    spec = token_limit_spec(tenant, limit, upstream, engine)
    gateways = []
    try:
        for name in fleet_hosts():
            gateways.append(HOSTS[name](workdir).start(spec))
        urls = [g.url for g in gateways]
        wait_for_window(25)
        statuses = []
        for i in range(4):
            r = llm_response(urls[i % len(urls)], tenant)
            statuses.append(r.status_code)
            assert r.headers.get("ratelimit-policy") == f'"tpm";q={limit};w=60', dict(r.headers)
            # The booking leaves within a tick (1 ms in Envoy, 100 ms in nginx), then one call.
            wait_until(lambda: redis_counters(engine, tenant).get("minute", 0) >= (i + 1) * REQUEST_TOKENS, timeout=5)
        assert statuses == [200] * 4, statuses
        for url in urls:
            r = llm_response(url, tenant)
            assert r.status_code == 429, (r.status_code, r.text)
            assert r.json()["error"]["code"] == "token_limit_exceeded", r.text
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert r.headers["ratelimit"].startswith('"tpm";r=0;t='), r.headers["ratelimit"]
        time.sleep(0.5)
        counters = redis_counters(engine, tenant)
        print(f"\ntoken limit {limit} through {len(urls)} gateways: statuses {statuses}, service counters {counters}")
        assert counters == {"minute": limit}, counters
        engine.kill_service()
        r = llm_response(urls[0], tenant + "-other")  # a tenant without limits is not checked
        assert r.status_code == 200
        r = llm_response(urls[-1], tenant)
        assert r.status_code == 503 and r.json()["error"]["code"] == "token_limit_unavailable", r.text
        for g in gateways:
            assert g.alive()
    finally:
        for g in gateways:
            g.stop()


FAKETIME_LIB = pathlib.Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def december_gateways(workdir, monkeypatch, spec: GatewaySpec, start: str) -> list:
    """Two Debian nginx gateways whose clocks libfaketime starts at `start` (UTC) and runs on from
    (the service and the upstream, started before, keep the real clock). Envoy's binary hangs at
    start under libfaketime (its allocator), and nginx-musl's libc cannot load it; the filter's
    code is the same on every host. The cache duration is long so that nginx's workers, whose
    environment nginx replaces, never read FAKETIME again."""
    apt = subprocess.run([str(ROOT / "scripts" / "apt.sh"), "libfaketime"], capture_output=True, text=True, timeout=600)
    assert apt.returncode == 0 and FAKETIME_LIB.exists(), apt.stderr[-2000:]
    gateways = []
    with monkeypatch.context() as m:
        m.setenv("LD_PRELOAD", str(FAKETIME_LIB))
        m.setenv("FAKETIME", f"@{start}")
        m.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        m.setenv("FAKETIME_CACHE_DURATION", "86400")
        m.setenv("TZ", "UTC")
        try:
            for _ in range(2):
                gateways.append(HOSTS["nginx"](workdir).start(spec))
        except BaseException:
            for g in gateways:
                g.stop()
            raise
    return gateways


def december_budget(tenant: str, ledger: str, upstream, engine) -> tuple[GatewaySpec, str]:
    """A month budget of BUDGET_UNITS for `tenant` in global mode, and the Redis key of its
    month's YEAR counter for December 2026 as the service keys it now (its own clock)."""
    config = {
        "ledger": ledger, "prices": PRICES, "tenant": {"unverified_header": TENANT},
        "budgets": {"tenants": {tenant: {"month_nano_usd": BUDGET_UNITS * UNIT_NANO}}},
        "global": {"service": "ratelimit", "domain": DOMAIN, "timeout_ms": 3000, "on_error": "deny",
                   "unit_nano_usd": UNIT_NANO},
    }
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                       workers=WORKERS, grpc_services={"ratelimit": engine.grpc_port},
                       kv_zones={ledger: "1m eviction=none"})
    body = f"{ledger}/month/202612"
    year = 365 * 86_400
    return spec, f"{DOMAIN}_cost_{len(body)}:{body}_tenant_{tenant}_{int(time.time()) // year * year}"


def test_a_december_month_budget_is_carried_across_the_year_boundary(workdir, upstream, engine, monkeypatch):
    """plugins/cost/src/month_windows.rs through real gateways and the real service: the gateways'
    clocks are set to 2026-12-10, where the month budget's YEAR counter restarts on Dec 18 and the
    bridge counter must be carried the spend of Dec 1-2. The tenant's YEAR counter is preset to its
    whole budget (spent on Dec 1-2); a request on each gateway is refused and asks the carry, which
    one worker wins: the bridge then holds the budget once. Then the YEAR counter is deleted, as
    its window's restart on Dec 18 does: every gateway still refuses, on the bridge. Before the
    bridge, they admitted a second budget."""
    tenant = "dec-" + uuid.uuid4().hex[:8]
    spec, year_key = december_budget(tenant, "month-e2e", upstream, engine)
    engine.redis_command("SET", year_key, str(BUDGET_UNITS))
    gateways = december_gateways(workdir, monkeypatch, spec, "2026-12-10 12:00:00")
    try:
        urls = [g.url for g in gateways]
        statuses = [llm_call(url, tenant, False) for url in urls for _ in range(2)]
        assert statuses == [402] * len(statuses), statuses
        wait_until(lambda: redis_counters(engine, tenant).get("month-bridge", 0) >= BUDGET_UNITS, timeout=10)
        time.sleep(1)  # every worker's claim has been answered
        claims = {k.decode(): int(engine.redis_command("GET", k.decode()))
                  for k in engine.redis_command("KEYS", f"*month-bridge-carry/202612_tenant_{tenant}_*")}
        counters = redis_counters(engine, tenant)
        print(f"\nclaims {claims}, counters {counters}")
        assert counters == {"month": BUDGET_UNITS, "month-bridge": BUDGET_UNITS}, counters
        assert len(claims) == 1 and list(claims.values())[0] >= 1, claims
        engine.redis_command("DEL", year_key)
        statuses = [llm_call(url, tenant, False) for url in urls for _ in range(2)]
        assert statuses == [402] * len(statuses), statuses
        counters = redis_counters(engine, tenant)
        assert counters.get("month", 0) == 0 and counters["month-bridge"] == BUDGET_UNITS, counters
        for g in gateways:
            assert g.alive()
    finally:
        for g in gateways:
            g.stop()


def test_a_tenant_silent_when_the_carry_falls_due_is_carried_by_the_ticks(workdir, upstream, engine, monkeypatch):
    """The gateways' clocks start 8 s before 2026-12-03, when the carry into the bridge falls due.
    The tenant's YEAR counter is preset to 80 units (spent on Dec 1) and one request is admitted on
    "Dec 2" (6 units); then no request at all: the root contexts' ticks claim the carry for the
    tenants their workers checked, and the bridge counts the month (86) without another request."""
    tenant = "dec-" + uuid.uuid4().hex[:8]
    spec, year_key = december_budget(tenant, "month-e2e", upstream, engine)
    engine.redis_command("SET", year_key, "80")
    gateways = december_gateways(workdir, monkeypatch, spec, "2026-12-02 23:59:52")
    try:
        assert llm_call(gateways[0].url, tenant, False) == 200
        # The bridge's December counter got the request's 6 units; from "Dec 3" the carry is due.
        wait_until(lambda: redis_counters(engine, tenant).get("month-bridge", 0) >= 86, timeout=30)
        time.sleep(1)
        counters = redis_counters(engine, tenant)
        print(f"\ncounters {counters}")
        assert counters == {"month": 86, "month-bridge": 86}, counters
    finally:
        for g in gateways:
            g.stop()
