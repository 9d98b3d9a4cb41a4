"""Shared data that fills up: no trap, no budget reset, no limit lifted, and the counters move.

What fills up depends on the host:
- nginx (glibc and musl): each filter's namespace has its own `shm_kv` zone with
  `eviction=none`, as the shipped configurations declare them (nginx-compat/conf/). A small zone
  fills after a few hundred keys; then the store refuses new keys (`InternalFailure`), and the
  filters follow their `store_full` policy.
- Envoy: shared data has no size bound and evicts nothing; what bounds the keys is the filters'
  own count (`max_keys` per rate-limit rule, `max_tenants` per cost ledger), beyond which new
  clients share an overflow record.

Before the fix, a full nginx zone made the SDK panic in the rate-limit guest while it held its
key-creation lease, and new clients were admitted uncharged; the cost filter read a tenant it
could not store as a fresh one (spend 0).
"""
from __future__ import annotations

import concurrent.futures
import pathlib
import re
import time
import uuid

import pytest
import requests

from lab import ROOT, FilterSpec, GatewaySpec, kong_differs
from refusals import refusal_code

# About 490 blocks of 64 bytes: ~240 rate-limit or ledger keys of two blocks each.
SMALL_ZONE = "32k eviction=none"
FILL = 400
# The logical bound, above what the small nginx zone can hold: on nginx the zone fills first,
# on Envoy this bound is what is reached.
MAX_KEYS = 300


def rl_config(store_full: dict | None = None, **rule) -> dict:
    config = {
        "namespace": "fill",
        "rules": [{"name": "per-client", "key": [{"unverified_header": "x-client"}],
                   # A day: a window that rolls over while the test runs would lift the victim's
                   # limit (a minute's did, about 1 run in 20 of the Envoy case).
                   "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]} | rule],
        "max_keys": MAX_KEYS,
    }
    if store_full is not None:
        config["store_full"] = store_full
    return config


def get(url: str, path: str = "/anything", **headers) -> requests.Response:
    return requests.get(url + path, headers=headers, timeout=10)


def fill(url: str, header: str, n: int, prefix: str) -> list[int]:
    """One request each for `n` new clients (8 at a time); their statuses in order."""
    def one(i: int) -> int:
        return get(url, **{header: f"{prefix}-{i}"}).status_code
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def counter(gateway, family: str) -> int:
    return sum(v for k, v in gateway.stats(family).items() if family in k)


# Kong's module: a write to a full zone is a host trap (KONG_DIFFERENCES "shm-full-traps"), and
# the key-creation lease its writer held (plugins/common/src/shared_data.rs, 2 s) stays taken
# until it runs out; then the zone reads as full to every worker.
KONG_TRAP = "failed setting value to shm (could not write to slab)"
LEASE_S = 2.0


def assert_one_kong_trap(gateway) -> None:
    """On Kong: exactly one host trap, whatever the number of writes refused after it (the zone
    record marks the store full once the trapped writer's lease has run out: no second trap)."""
    text = pathlib.Path(gateway.log).read_text(errors="replace")
    assert text.count(KONG_TRAP) == 1, text.count(KONG_TRAP)
    assert "panicked" not in text
    assert gateway.alive()


def assert_no_trap(gateway) -> None:
    """Nothing in the gateway's log says a filter trapped (a panic, a wasm trap, a failed
    callback: nginx-compat's and Envoy's wordings), and the gateway still answers."""
    log = pathlib.Path(gateway.log)
    text = log.read_text(errors="replace") if log.exists() else ""
    bad = re.compile(r"panicked|wasm trap|unreachable|on_\w+ failed|proxy_on_\w+ failed")
    hits = [line for line in text.splitlines() if bad.search(line)]
    assert not hits, "\n".join(hits[:20])
    assert gateway.alive()


# None: the default policy (deny with 503), with a configuration that main before issue 17 also
# loads, so that this case shows the old behaviour (a trap, new clients admitted) rather than a
# refused configuration.
@pytest.mark.parametrize("action", [None, "deny", "overflow"])
def test_rate_limit_zone_full_lifts_no_limit(host, upstream, gateways, action):
    config = rl_config(None if action is None else {"action": action, "status": 503})
    action = action or "deny"
    spec = GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream.port},
                       workers=2, kv_zones={"ratelimit": SMALL_ZONE})
    g = gateways(host, spec)
    # A client limited before the store fills up.
    assert [get(g.url, **{"x-client": "victim"}).status_code for _ in range(3)] == [200, 200, 429]
    statuses = fill(g.url, "x-client", FILL, f"fill-{action}")
    kong = kong_differs(host, "shm-full-traps")
    if kong:
        # The one request whose write met the full zone: 500 (its guest trapped). While the
        # trapped writer's lease runs, new clients are charged in the overflow bucket (429 once
        # its 2 units are gone); after it, the store_full policy, checked on 50 more.
        assert statuses.count(500) == 1, statuses
        statuses.remove(500)
        time.sleep(LEASE_S + 0.5)
        statuses += fill(g.url, "x-client", 50, f"late-{action}")
    admitted = statuses.count(200)
    # Each new client takes one unit of its own key, or of the overflow bucket (2 per day for
    # all of them); never more.
    assert admitted <= MAX_KEYS + 2, statuses
    assert set(statuses) <= {200, 429, 503}, statuses
    if kong:
        late = statuses[-50:]
        if action == "deny":
            assert late == [503] * 50, late
        else:
            assert set(late) == {429}, late
        print(f"\nkong, store_full {action}: {admitted} of {len(statuses) + 1} new clients admitted, "
              f"{statuses.count(429)} limited, {statuses.count(503)} refused, 1 trapped (500)")
    elif host.name == "envoy":
        # No size bound in Envoy: max_keys is what fills up (the victim holds one key); the
        # others share the overflow bucket.
        assert admitted == MAX_KEYS - 1 + 2, statuses
        assert counter(g, "tollgate_rate_limit_overflow_total") == FILL - (MAX_KEYS - 1)
    else:
        assert admitted < MAX_KEYS, "the 32k zone fills before max_keys"
        assert counter(g, "tollgate_rate_limit_store_full_total") > 0
        late = statuses[-50:]
        if action == "deny":
            assert late == [503] * 50, late
            assert counter(g, "tollgate_rate_limit_requests_total.rule.per-client.outcome.store_failure_denied") >= 50
        else:
            # New clients share the overflow bucket, created before the zone filled up.
            assert set(late) == {429}, late
    # Nothing was reset or lifted: the victim and an early client are still limited.
    assert get(g.url, **{"x-client": "victim"}).status_code == 429
    early = f"fill-{action}-0"
    assert [get(g.url, **{"x-client": early}).status_code for _ in range(2)] == [200, 429]
    r = get(g.url, **{"x-client": "brand-new"})
    assert r.status_code in (429, 503)
    if r.status_code == 503:
        assert r.json()["error"] == "rate_limit_unavailable" and r.headers["retry-after"] == "1"
    if kong:
        assert_one_kong_trap(g)
    else:
        assert_no_trap(g)


def test_rules_keyed_by_client_chosen_values_cannot_use_up_other_rules_keys(host, upstream, gateways):
    """A rule keyed by the path (anything a client sends) has its own key bound; a per-user rule
    keeps creating keys for its users."""
    config = {
        "namespace": "rules",
        "rules": [
            {"name": "per-path", "match": {"prefix": "/anything/"}, "key": ["path"], "max_keys": 20,
             "limits": [{"algorithm": "fixed_window", "requests": 100, "per": "minute"}]},
            {"name": "per-user", "key": [{"unverified_header": "x-user"}],
             "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]},
        ],
        "max_keys": 1000,
    }
    spec = GatewaySpec(filters=[FilterSpec("rate-limit", config)], upstreams={"upstream": upstream.port},
                       workers=2, kv_zones={"ratelimit": "1m eviction=none"})
    g = gateways(host, spec)
    no_stats = kong_differs(host, "no-stats")
    minute = int(time.time() // 60)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: get(g.url, f"/anything/{i}").status_code, range(100)))
    assert statuses == [200] * 100
    if no_stats:
        # No key counters: the second request of each path shows them. 20 paths have a key of
        # their own (1 of 100 used); the 80 others share the overflow bucket (80 of 100 used):
        # 20 own + 20 overflow admitted, 60 refused.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            again = list(pool.map(lambda i: get(g.url, f"/anything/{i}").status_code, range(100)))
        if int(time.time() // 60) == minute:  # (a new window would admit more)
            assert (again.count(200), again.count(429)) == (40, 60), again
    else:
        assert counter(g, "tollgate_rate_limit_keys_created_total.rule.per-path") == 20
        assert counter(g, "tollgate_rate_limit_overflow_total.rule.per-path") == 80
    # Each user limited on a key of its own (in a shared overflow bucket of 2 a day, only the
    # first user would get through): that is the evidence on the kong host.
    for u in range(30):
        assert [get(g.url, "/v1/x", **{"x-user": f"u{u}"}).status_code for _ in range(3)] == [200, 200, 429]
    if not no_stats:
        assert counter(g, "tollgate_rate_limit_keys_created_total.rule.per-user") == 30
        assert counter(g, "tollgate_rate_limit_overflow_total.rule.per-user") == 0
    assert_no_trap(g)


COST = {
    "ledger": "fill",
    "prices": {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}},
    "tenant": {"unverified_header": "x-tenant"},
    "budgets": {"tenants": {"capped": {"day_nano_usd": 1}}},
    "spend_headers": True,
    "max_tenants": MAX_KEYS,
}
CHAT = {"model": "gpt-4o-mini"}
# 12 prompt and 8 completion tokens (the demo upstream's default): 12·150 + 8·600 nano-USD.
ONE_CHAT = 6_600


def chat(url: str, tenant: str) -> requests.Response:
    return requests.post(url + "/v1/chat/completions", json=CHAT, headers={"x-tenant": tenant}, timeout=10)


def spent(url: str, tenant: str) -> requests.Response:
    return requests.get(url + "/healthz", headers={"x-tenant": tenant}, timeout=10)


@pytest.mark.parametrize("budgeted", [True, False])
@pytest.mark.parametrize("action", [None, "refuse", "pool"])  # None: the default (refuse), as above
def test_cost_zone_full_resets_no_budget(host, upstream, gateways, budgeted, action):
    config = dict(COST) if action is None else dict(COST, store_full={"action": action})
    action = action or "refuse"
    if budgeted:
        config["budgets"] = {"default": {"day_nano_usd": 10**12}, "tenants": {"capped": {"day_nano_usd": 1}}}
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                       workers=2, kv_zones={"cost": SMALL_ZONE})
    g = gateways(host, spec)
    assert chat(g.url, "capped").status_code == 200
    assert chat(g.url, "capped").status_code == 402
    early = "early-" + uuid.uuid4().hex[:8]
    for _ in range(3):
        assert chat(g.url, early).status_code == 200
    prefix = uuid.uuid4().hex
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: chat(g.url, f"{prefix}-{i}").status_code, range(FILL)))
    last = f"{prefix}-{FILL - 1}"
    kong = kong_differs(host, "shm-full-traps")
    if kong:
        # The one request whose write met the full zone: 500 (its guest trapped) when a budget
        # makes the filter open the tenant's record before the upstream; without one the
        # record is written when booking, after the response went out (200; that one booking
        # is lost). While the trapped writer's lease runs, new tenants are admitted and booked
        # to the overflow record (pooled, as when the lease is busy); after it, the store_full
        # policy, checked on 50 more.
        assert statuses.count(500) == (1 if budgeted else 0), statuses
        if budgeted:
            statuses.remove(500)
        time.sleep(LEASE_S + 0.5)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses += list(pool.map(lambda i: chat(g.url, f"{prefix}-late-{i}").status_code, range(50)))
        last = f"{prefix}-late-49"
    assert set(statuses) <= {200, 503}, statuses
    # No budget reset, no spend lost for tenants that had a record.
    assert chat(g.url, "capped").status_code == 402
    r = spent(g.url, early)
    assert r.status_code == 200 and int(r.headers["x-tollgate-spend-total-nano-usd"]) == 3 * ONE_CHAT
    if host.name == "envoy":
        assert statuses == [200] * FILL
        assert counter(g, "tollgate_cost_overflow_total") >= FILL - MAX_KEYS
    else:
        if not kong_differs(host, "no-stats"):
            assert counter(g, "tollgate_cost_store_full_total") > 0
        late = statuses[-50:]
        if budgeted and action == "refuse":
            assert late == [503] * 50, late
            if not kong_differs(host, "no-stats"):
                assert counter(g, "tollgate_cost_requests_total.outcome.store_failure") >= 50
            r = chat(g.url, "newcomer")
            assert r.status_code == 503 and refusal_code(r.json()) == "budget_unavailable"
        else:
            # Admitted; their spend is booked into the overflow record (created in on_configure).
            assert late == [200] * 50, late
            r = spent(g.url, last)
            assert r.status_code == 200
            shown = int(r.headers["x-tollgate-spend-total-nano-usd"])
            if budgeted:
                # Checked against the pooled spend: every pooled tenant's bookings.
                assert shown >= 50 * ONE_CHAT
            else:
                # Not attributed to it (no record of its own); pooled, not lost.
                assert shown == 0
    if kong:
        assert_one_kong_trap(g)
    else:
        assert_no_trap(g)


def test_shipped_nginx_configs_keep_enforcing_state_out_of_evicting_zones():
    """Budgets and limits live in zones of their own that never evict; the shared `*` zone
    (LRU, where the metrics registry and anything else goes) cannot push them out."""
    for conf in sorted((ROOT / "nginx-compat" / "conf").glob("*.conf")):
        text = conf.read_text()
        uses = {"cost": "proxy_wasm cost" in text, "ratelimit": "proxy_wasm rate_limit" in text}
        for zone, used in uses.items():
            if used:
                assert re.search(rf"^\s*shm_kv {zone} \S+ eviction=none;", text, re.M), f"{conf.name}: shm_kv {zone} ... eviction=none"
