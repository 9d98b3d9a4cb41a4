"""Limits and budgets never live in shared data that evicts, unless the operator says so
(README, "What a filter reads"; plugins/common/src/eviction.rs).

An nginx zone with `eviction=lru|slru` (the implicit `*` zone is one) drops old keys to make room
for new ones: a flood of new tenants once evicted an over-budget tenant's record, which was then
served again. rate-limit, and cost with budgets, now refuse to load on such a zone (nginx -t
fails, naming it) unless `allow_eviction` is set, which loads with a warning. Envoy's shared data
never evicts; Kong's module cannot tell the filters (`no-eviction-policy`).
"""
from __future__ import annotations

import pytest
import requests

from lab import FilterSpec, GatewaySpec, kong_differs

PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}}
COST = {"ledger": "eviction", "prices": PRICES, "tenant": {"unverified_header": "x-tenant"},
        "budgets": {"default": {"day_nano_usd": 1_000_000}}}
RATE_LIMIT = {"namespace": "eviction", "rules": [{"name": "all", "limits": [{"algorithm": "fixed_window", "requests": 100, "per": "minute"}]}]}
FILTERS = {"cost": COST, "rate-limit": RATE_LIMIT}
# The zone each filter's state lives in (its keys' first segment).
ZONE = {"cost": "cost", "rate-limit": "ratelimit"}


def spec(upstream, plugin: str, zone: str | None, allow: bool = False) -> GatewaySpec:
    """`plugin` alone, its zone declared with `zone`'s arguments (None: not declared, so its keys
    go to the implicit `*` zone, which evicts)."""
    config = dict(FILTERS[plugin], allow_eviction=True) if allow else FILTERS[plugin]
    return GatewaySpec(filters=[FilterSpec(plugin, config)], upstreams={"upstream": upstream.port},
                       kv_zones={ZONE[plugin]: zone})


def refuses(host) -> bool:
    """Whether the host tells the filters that a zone evicts (nginx); Envoy never evicts."""
    return host.name != "envoy" and not kong_differs(host, "no-eviction-policy")


@pytest.mark.parametrize("plugin", ["cost", "rate-limit"])
@pytest.mark.parametrize("zone", [None, "1m eviction=lru", "1m eviction=slru", "1m"])
def test_an_evicting_zone_refuses_the_configuration(host, upstream, gateways, plugin, zone):
    if zone is not None and host.name == "envoy":
        pytest.skip("Envoy has no zones")
    if not refuses(host):
        g = gateways(host, spec(upstream, plugin, zone))
        assert requests.get(g.url + "/x", timeout=10).status_code == 200
        return
    with pytest.raises(Exception) as refused:
        gateways(host, spec(upstream, plugin, zone), timeout=20)
    assert "evicts keys" in str(refused.value), str(refused.value)[-2000:]


@pytest.mark.parametrize("plugin", ["cost", "rate-limit"])
def test_allow_eviction_loads_with_a_warning(host, upstream, gateways, plugin):
    g = gateways(host, spec(upstream, plugin, None, allow=True))
    assert requests.get(g.url + "/x", headers={"x-tenant": "t"}, timeout=10).status_code == 200
    if refuses(host):
        assert "allowed by allow_eviction" in g.log.read_text(errors="replace")


@pytest.mark.parametrize("plugin", ["cost", "rate-limit"])
def test_a_zone_that_never_evicts_loads(host, upstream, gateways, plugin):
    zone = None if host.name == "envoy" else "1m eviction=none"
    g = gateways(host, spec(upstream, plugin, zone))
    assert requests.get(g.url + "/x", headers={"x-tenant": "t"}, timeout=10).status_code == 200


def test_cost_without_budgets_loads_on_any_zone(host, upstream, gateways):
    config = {k: v for k, v in COST.items() if k != "budgets"}
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port},
                                   kv_zones={"cost": None}))
    assert requests.get(g.url + "/x", timeout=10).status_code == 200
