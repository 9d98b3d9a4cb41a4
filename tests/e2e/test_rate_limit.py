"""rate-limit end to end: real Envoy with 4 workers (--concurrency 4), one shared-data store.

Most tests share one gateway whose rules are told apart by path prefix; each test uses its own
random client key, so tests cannot see each other's counters. Contention and configuration tests
start their own gateways.
"""
from __future__ import annotations

import itertools
import json
import random
import re
import shutil
import subprocess
import threading
import time
import uuid
import zlib

import pytest
import requests

from lab import ROOT, FilterSpec, GatewaySpec, kong_differs

# Limits under 64 concurrent connections and contention on both cores: run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = pytest.mark.serial

WORKERS = 4
KEY = "x-api-key"


def fixed(requests_: int, per: str, **kw) -> dict:
    return {"algorithm": "fixed_window", "requests": requests_, "per": per, **kw}


def keyed(name: str, prefix: str, limits: list[dict], **kw) -> dict:
    return {"name": name, "match": {"prefix": prefix}, "key": [{"unverified_header": KEY}], "limits": limits, **kw}


RULES = [
    keyed("exact", "/exact", [fixed(50, "minute")]),
    keyed("headers", "/headers", [
        {"name": "burst", "algorithm": "token_bucket", "capacity": 3, "requests": 1, "per": "second"},
        fixed(100, "hour", name="hourly"),
    ]),
    keyed("iso", "/iso", [fixed(3, "minute")]),
    keyed("second", "/second", [fixed(3, "second")]),
    keyed("bucket", "/bucket", [{"algorithm": "token_bucket", "capacity": 4, "requests": 1, "per": "second"}]),
    keyed("deny", "/deny", [fixed(2, "minute")], missing_key="deny"),
    keyed("allow", "/allow", [fixed(2, "minute")], missing_key="allow"),
    keyed("shared", "/shared", [fixed(2, "minute")], missing_key="shared"),
    keyed("weight", "/weight", [fixed(10, "minute")], weight_header="x-cost-units", max_weight=8),
    {"name": "xff", "match": {"prefix": "/xff"}, "key": [{"client_address": {"trusted_hops": 1}}], "limits": [fixed(2, "minute")]},
    {"name": "peer", "match": {"prefix": "/peer", "methods": ["GET"]},
     "key": [{"unverified_header": KEY}, {"client_address": {"trusted_hops": 0}}, "method"], "limits": [fixed(2, "minute")]},
]


@pytest.fixture(scope="module")
def gateway(host, upstream):
    config = {"namespace": "e2e", "rules": RULES, "headers_on_allowed": True}
    spec = GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream.port}, workers=WORKERS,
                       worker_log=True)
    g = host.start(spec)
    yield g
    g.stop()


def new_key() -> str:
    return uuid.uuid4().hex


def get(gateway, path, key=None, headers=None, **kw):
    h = dict(headers or {})
    if key is not None:
        h[KEY] = key
    return requests.get(gateway.url + path, headers=h, timeout=10, **kw)


SF_ITEM = re.compile(r'"([A-Za-z0-9._-]+)"((?:;[a-z][a-z0-9_.*-]*=[0-9]+)*)\s*(?:,\s*|$)')


def sf_list(value: str) -> dict[str, dict[str, int]]:
    """A RateLimit / RateLimit-Policy value (a list of sf-string items with integer parameters)."""
    out, pos = {}, 0
    for m in SF_ITEM.finditer(value):
        assert m.start() == pos, f"malformed at {pos}: {value!r}"
        pos = m.end()
        out[m.group(1)] = {k: int(v) for k, v in (p.split("=") for p in m.group(2).split(";")[1:])}
    assert pos == len(value), f"malformed: {value!r}"
    return out


def wait_for_fresh_window(period: float, need: float) -> None:
    """Sleeps into the next epoch-aligned window unless `need` seconds are left in this one."""
    left = period - (time.time() % period)
    if left < need:
        time.sleep(left + 0.2)


def burst(url: str, total: int, conns: int, headers: dict, timeout: float = 120) -> tuple[list[int], float]:
    """`total` requests over `conns` keep-alive connections (one thread and Session each)."""
    counter = itertools.count()
    start = threading.Barrier(conns + 1)
    statuses: list[int] = []
    lock = threading.Lock()

    def worker():
        session = requests.Session()
        start.wait()
        mine = []
        while next(counter) < total:
            mine.append(session.get(url, headers=headers, timeout=30).status_code)
        with lock:
            statuses.extend(mine)
        session.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conns)]
    for t in threads:
        t.start()
    start.wait()
    began = time.monotonic()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "burst did not finish in time"
    return statuses, time.monotonic() - began


def counter(gateway, suffix: str) -> int:
    return sum(v for k, v in gateway.stats("tollgate_rate_limit").items() if k.endswith(suffix))


def workers_used(gateway) -> int:
    stats = gateway.stats("downstream_cx_total")
    return sum(1 for k, v in stats.items() if re.search(r"\.worker_\d+\.downstream_cx_total$", k) and v > 0)


def exact_burst(gateway, precreate: bool) -> tuple[int, int, float]:
    n, conns = 50, 64
    total = 10 * n
    key = new_key()
    wait_for_fresh_window(60, 20)
    window = int(time.time() // 60)
    admitted = 0
    if precreate:
        first = get(gateway, "/exact", key)
        assert first.status_code == 200
        admitted = 1
    statuses, elapsed = burst(gateway.url + "/exact", total, conns, {KEY: key})
    assert int(time.time() // 60) == window, "the burst crossed a window boundary"
    assert len(statuses) == total
    assert set(statuses) <= {200, 429}, set(statuses)
    admitted += statuses.count(200)
    return admitted, n, elapsed


def test_a_limit_of_n_admits_exactly_n_under_64_connections_on_4_workers(host, gateway):
    """The key exists before the burst (one request), which keeps the test outside the documented
    first-insert bound (plugins/rate-limit/src/limiter.rs); the next test covers a fresh key."""
    no_stats = kong_differs(host, "no-stats")
    if no_stats:
        # No per-worker connection counters: the access log of the workers (pids) shows which
        # ones served (CPU time did not: a worker's share of the burst can take under a tick).
        logged_before = len(gateway.worker_log())
    else:
        before = (counter(gateway, "rule.exact.outcome.allowed"), counter(gateway, "rule.exact.outcome.limited"))
    admitted, n, elapsed = exact_burst(gateway, precreate=True)
    used = len(set(gateway.worker_log()[logged_before:])) if no_stats else workers_used(gateway)
    print(f"\nexact: {admitted} admitted of 1 + 500 requests for a limit of {n}/minute over 64 connections, "
          f"{used} of {WORKERS} workers served connections, {elapsed:.1f}s; over-admission {admitted - n}")
    assert admitted == n
    assert used >= 2, "the connections must be spread over several workers"
    if not no_stats:
        after = (counter(gateway, "rule.exact.outcome.allowed"), counter(gateway, "rule.exact.outcome.limited"))
        assert (after[0] - before[0], after[1] - before[1]) == (n, 501 - n)


def test_a_fresh_key_hit_by_64_connections_is_created_once(host, gateway):
    """No pre-created key: the first requests race to create it. The creation lock makes the
    first insert exact; the documented residual (a worker stalled for the 2 s lease inside two host
    calls) does not happen here."""
    no_stats = kong_differs(host, "no-stats")
    created_before = 0 if no_stats else counter(gateway, "tollgate_rate_limit_keys_created_total.rule.exact")
    admitted, n, elapsed = exact_burst(gateway, precreate=False)
    print(f"\nexact (fresh key): {admitted} admitted of 500 for {n}/minute, {elapsed:.1f}s; over-admission {admitted - n} "
          f"(documented bound: (workers-1) x {n} = {(WORKERS - 1) * n}, only past a 2 s stall)")
    # Created once is what admitted == n shows on the kong host ("no-stats": no key counter); a
    # key created twice would reset it and admit more.
    assert admitted == n
    if not no_stats:
        assert counter(gateway, "tollgate_rate_limit_keys_created_total.rule.exact") - created_before == 1


def test_ratelimit_headers_on_allowed_and_limited_responses(gateway):
    key = new_key()
    policy = '"burst";q=1;w=1;tollgate-burst=3, "hourly";q=100;w=3600'
    hour_left = 3600 - int(time.time()) % 3600
    seen = []
    for _ in range(3):
        r = get(gateway, "/headers", key)
        assert r.status_code == 200, r.text
        assert r.headers["x-upstream-name"] == "upstream-a"
        assert r.headers["ratelimit-policy"] == policy
        seen.append(sf_list(r.headers["ratelimit"]))
    assert [s["burst"]["r"] for s in seen] == [2, 1, 0]
    assert [s["hourly"]["r"] for s in seen] == [99, 98, 97]
    assert all(s["burst"]["t"] == 1 for s in seen), seen
    assert all(abs(s["hourly"]["t"] - hour_left) <= 2 for s in seen), (seen, hour_left)

    r = get(gateway, "/headers", key)
    assert r.status_code == 429, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["error"] == "rate_limited" and "burst" in body["message"]
    assert r.headers["ratelimit-policy"] == policy
    limited = sf_list(r.headers["ratelimit"])
    assert list(limited) == ["burst"], "only the refusing limit"
    assert limited["burst"]["r"] == 0 and limited["burst"]["t"] == 1
    retry_after = r.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= limited["burst"]["t"], "RFC 9110 10.2.3 delay-seconds, not before t"
    assert "x-upstream-name" not in r.headers

    time.sleep(1.1)  # one burst unit refills
    r = get(gateway, "/headers", key)
    assert r.status_code == 200
    assert sf_list(r.headers["ratelimit"])["hourly"]["r"] == 96, "the refused request took nothing from the hourly limit"


def test_headers_on_allowed_can_be_turned_off(host, upstream, gateways):
    config = {"rules": [keyed("quiet", "/", [fixed(1, "minute")])], "headers_on_allowed": False, "status": 503}
    g = gateways(host, GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream.port}, workers=2))
    key = new_key()
    r = get(g, "/q", key)
    assert r.status_code == 200 and "ratelimit" not in r.headers and "ratelimit-policy" not in r.headers
    r = get(g, "/q", key)
    assert r.status_code == 503, "the configured status"
    assert r.headers["ratelimit-policy"] == '"quiet";q=1;w=60' and "retry-after" in r.headers


def test_keys_are_isolated(gateway):
    a, b = new_key(), new_key()
    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"  # hashed client keys (over 128 bytes)
    for key in (a, b, long_a, long_b):
        statuses = [get(gateway, "/iso", key).status_code for _ in range(5)]
        assert statuses == [200] * 3 + [429] * 2, (key[:8], statuses)


CRC_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def crc32_twin(target: str, prefix: str, free: int = 6) -> str:
    """A string `prefix` + `free` characters of CRC_ALPHABET whose CRC-32 (zlib's, nginx's
    ngx_crc32_long) equals `target`'s, found by meet in the middle: for strings of one length the
    CRC is affine in the bytes, so each free character adds a fixed XOR term. 64^6 = 2^36
    candidates for a 32-bit value: about 16 answers, found in a second."""
    n = len(prefix) + free
    zero = zlib.crc32(prefix.encode() + b"\0" * free)
    term = [{c: zlib.crc32(prefix.encode() + b"\0" * i + c.encode() + b"\0" * (free - i - 1)) ^ zero
             for c in CRC_ALPHABET} for i in range(free)]
    half = free // 2
    right: dict[int, str] = {}
    for tail in itertools.product(CRC_ALPHABET, repeat=free - half):
        x = 0
        for i, c in enumerate(tail):
            x ^= term[half + i][c]
        right.setdefault(x, "".join(tail))
    want = zlib.crc32(target.encode()) ^ zero
    for head in itertools.product(CRC_ALPHABET, repeat=half):
        x = want
        for i, c in enumerate(head):
            x ^= term[i][c]
        if x in right:
            twin = prefix + "".join(head) + right[x]
            assert len(twin) == n and zlib.crc32(twin.encode()) == zlib.crc32(target.encode())
            return twin
    raise AssertionError("no twin: widen the alphabet or `free`")


def test_a_client_key_with_the_crc32_of_anothers_shares_its_bucket_only_under_kong(host, gateway):
    """Kong's shared memory finds a key by its CRC-32 alone (shm-keys-by-crc32): a client that
    picks its key so that the shared-data key's CRC-32 is a victim's spends the victim's limit.
    The other hosts compare the keys themselves: the two stay apart."""
    victim = new_key()
    head = f"ratelimit/e2e/iso/0/{len(victim)}:"  # key.rs's shared-data key, up to the client key
    # A value of the victim's length, so that the length prefix is the same.
    attacker_value = crc32_twin(head + victim, head + "attacker" + "a" * (len(victim) - 14))[len(head):]
    shared = lambda client: f"{head}{client}"
    assert len(attacker_value) == len(victim) and attacker_value != victim
    assert zlib.crc32(shared(attacker_value).encode()) == zlib.crc32(shared(victim).encode())
    assert [get(gateway, "/iso", attacker_value).status_code for _ in range(3)] == [200] * 3
    first = get(gateway, "/iso", victim).status_code
    if kong_differs(host, "shm-keys-by-crc32"):
        assert first == 429, "the victim's bucket is the attacker's"
    else:
        assert first == 200


def test_fixed_windows_roll_over(gateway):
    for attempt in range(3):
        key = new_key()
        wait_for_fresh_window(1, 0.9)
        second = int(time.time())
        statuses = [get(gateway, "/second", key).status_code for _ in range(4)]
        if int(time.time()) != second:
            continue  # crossed a boundary on a slow machine: try again
        assert statuses == [200, 200, 200, 429], statuses
        wait_for_fresh_window(1, 1.0)
        statuses = [get(gateway, "/second", key).status_code for _ in range(3)]
        assert statuses == [200] * 3, "a new window"
        return
    pytest.fail("could not send 4 requests within one second")


def test_token_bucket_refills_at_its_rate(gateway):
    key = new_key()
    statuses = [get(gateway, "/bucket", key).status_code for _ in range(5)]
    assert statuses == [200] * 4 + [429], statuses
    r = get(gateway, "/bucket", key)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    time.sleep(2.2)  # 1 unit per second: 2 units
    statuses = [get(gateway, "/bucket", key).status_code for _ in range(3)]
    assert statuses == [200, 200, 429], statuses


def test_requests_without_the_key_follow_the_missing_key_policy(host, gateway):
    # On the kong host ("no-stats") the statuses and the error body are the evidence.
    no_stats = kong_differs(host, "no-stats")
    if not no_stats:
        before = (counter(gateway, "rule.deny.outcome.missing_key_denied"), counter(gateway, "rule.allow.outcome.missing_key_allowed"))
    r = get(gateway, "/deny")
    assert r.status_code == 429 and r.json()["error"] == "rate_limit_key_missing"
    assert get(gateway, "/deny", "").status_code == 429, "an empty value is missing too"
    assert get(gateway, "/deny", new_key()).status_code == 200

    assert [get(gateway, "/allow").status_code for _ in range(4)] == [200] * 4, "not limited"

    shared = [get(gateway, "/shared").status_code for _ in range(3)]
    assert shared == [200, 200, 429], "one bucket for every request without the key"
    assert get(gateway, "/shared", new_key()).status_code == 200, "requests with a key have their own"
    if not no_stats:
        after = (counter(gateway, "rule.deny.outcome.missing_key_denied"), counter(gateway, "rule.allow.outcome.missing_key_allowed"))
        assert (after[0] - before[0], after[1] - before[1]) == (2, 4)


def test_weight_header_charges_cost_units(gateway):
    key = new_key()

    def w(value):
        return get(gateway, "/weight", key, headers={"x-cost-units": value} if value is not None else None)

    r = w("4")
    assert r.status_code == 200 and sf_list(r.headers["ratelimit"])["weight"]["r"] == 6
    assert sf_list(w("4").headers["ratelimit"])["weight"]["r"] == 2
    assert w("4").status_code == 429, "4 units do not fit in 2"
    r = w("2")
    assert r.status_code == 200 and sf_list(r.headers["ratelimit"])["weight"]["r"] == 0
    for bad in ("abc", "0", "9", "-1", "1.5", ""):
        r = w(bad)
        assert r.status_code == 400 and r.json()["error"] == "invalid_weight", (bad, r.status_code)
    assert w(None).status_code == 429, "no header: 1 unit"


def test_client_address_from_x_forwarded_for_with_one_trusted_hop(gateway):
    net = f"198.51.{random.randint(0, 255)}"

    def via(xff):
        return get(gateway, "/xff", headers={"x-forwarded-for": xff}).status_code

    assert [via(f"6.6.6.{i}, {net}.1") for i in range(3)] == [200, 200, 429], "the left part is spoofable: ignored"
    assert [via(f"{net}.2") for _ in range(3)] == [200, 200, 429], "another client"
    assert via("not-an-ip") == 429 and get(gateway, "/xff").status_code == 429, "missing key: denied"


def test_peer_address_and_method_in_a_composite_key(gateway):
    key = new_key()
    assert [get(gateway, "/peer", key).status_code for _ in range(3)] == [200, 200, 429]
    post = [requests.post(gateway.url + "/peer", headers={KEY: key}, timeout=10).status_code for _ in range(3)]
    assert post == [200] * 3, "the rule matches GET only"


def contention_config(policy: str) -> dict:
    # Eight limits on one key widen the window between a limit's read and its CAS write; no
    # retries: a single mismatch is contention.
    limits = [fixed(10_000_000, "hour", name=f"l{i}") for i in range(8)]
    return {"rules": [keyed("hot", "/", limits)], "cas_retries": 0, "on_contention": policy, "headers_on_allowed": False}


def load(url: str, seconds: int, conns: int, headers: dict) -> dict:
    """wrk when installed (the benchmarks need it), else Python threads."""
    if shutil.which("wrk"):
        argv = ["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "-s", str(ROOT / "bench" / "wrk_report.lua")]
        for k, v in headers.items():
            argv += ["-H", f"{k}: {v}"]
        out = subprocess.run(argv + [url], capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
        report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        return {"requests": report["requests"], "non_2xx": report["non_2xx_3xx"]}
    statuses, _ = burst(url, 3000, conns, headers)
    return {"requests": len(statuses), "non_2xx": sum(s != 200 for s in statuses)}


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_contention_is_fail_open_or_fail_closed_as_configured(host, upstream, gateways, policy):
    g = gateways(host, GatewaySpec(filters=[FilterSpec("rate-limit", contention_config(policy))], upstreams={"upstream": upstream.port}, workers=WORKERS))
    key = new_key()
    assert get(g, "/hot", key).status_code == 200
    totals = {"requests": 0, "non_2xx": 0}
    contended = 0
    if kong_differs(host, "no-stats"):
        # No counters: what is seen is the statuses. The limits (10M an hour) never refuse, so
        # under `deny` every refusal is a contended request (shown by its body below); under
        # `allow` contention cannot be seen, only that nothing is refused.
        for _ in range(5 if policy == "deny" else 2):
            res = load(g.url + "/hot", 3, 64, {KEY: key})
            totals = {k: totals[k] + res[k] for k in totals}
            if totals["non_2xx"] >= 5:
                break
        print(f"\non_contention={policy} (kong, no counters): {totals['requests']} requests, {totals['non_2xx']} non-2xx")
        if policy == "allow":
            assert totals["non_2xx"] == 0, "fail-open: nothing refused"
        else:
            assert totals["non_2xx"] > 0, "fail-closed: contended requests refused"
            refused = [r for r in (get(g, "/hot", key) for _ in range(200)) if r.status_code != 200]
            assert all(r.status_code == 429 and r.json()["error"] == "rate_limit_contention" for r in refused)
        return
    for _ in range(5):
        res = load(g.url + "/hot", 3, 64, {KEY: key})
        totals = {k: totals[k] + res[k] for k in totals}
        contended = counter(g, f"rule.hot.outcome.contention_{'allowed' if policy == 'allow' else 'denied'}")
        if contended >= 5:
            break
    retries = counter(g, "tollgate_rate_limit_cas_retries_total.rule.hot")
    print(f"\non_contention={policy}: {totals['requests']} requests, {contended} contended, {retries} CAS retries, {totals['non_2xx']} non-2xx")
    assert contended > 0, "no contention produced"
    assert retries >= contended
    if policy == "allow":
        assert totals["non_2xx"] == 0, "fail-open: nothing refused"
        assert counter(g, "rule.hot.outcome.contention_denied") == 0
    else:
        # wrk does not count the requests still in flight when it stops: <= rather than ==.
        assert 0 < totals["non_2xx"] <= contended, "fail-closed: the contended requests refused"
        assert counter(g, "rule.hot.outcome.contention_allowed") == 0
        r = get(g, "/hot", key)
        assert r.status_code in (200, 429)


def test_bad_configuration_is_refused_naming_the_field(host, upstream, workdir):
    bad = {"rules": [keyed("r", "/", [{"algorithm": "fixed_window", "requests": 5, "per": "fortnight"}])]}
    spec = GatewaySpec(filters=[FilterSpec("rate-limit", bad)], upstreams={"upstream": upstream.port})
    with pytest.raises(Exception):
        g = host.start(spec, timeout=20)
        g.stop()
    logs = "".join(p.read_text(errors="replace") for p in workdir.glob("*.log"))
    assert "rules[0].limits[0].per" in logs and "fortnight" in logs
