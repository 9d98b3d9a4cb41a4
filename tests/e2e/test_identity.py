"""Identities end to end (issue 17, part 2): the metrics filter's tenant label, rate-limit's key
and the cost filter's tenant trust only what jwt-auth verified on the request, on every host.

A client can send any header, `x-jwt-sub` included. jwt-auth writes it from a verified token and
publishes the value as the property `wasmx.tollgate.jwt_auth.header.x-jwt-sub`; the other filters read
that property (`{"header": "x-jwt-sub"}` in their configurations). A request jwt-auth refused,
bypassed or never saw is `unauthenticated`, whatever headers it carries.
"""
from __future__ import annotations

import json
import re
import time
import uuid

import jwt as pyjwt
import requests

from lab import FilterSpec, GatewaySpec, kong_differs

SECRET = "identity-e2e-secret-0123456789abcdef0123456789"
ISSUER = "https://issuer.identity.e2e"
JWT = {
    "providers": {"main": {"issuer": ISSUER, "hmac_secrets": [{"alg": "HS256", "secret": SECRET}],
                           "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}]}},
    "rules": [{"match": {"prefix": "/healthz"}, "bypass": True}],
}
SUB = {"header": "x-jwt-sub"}


def token(sub: str) -> dict:
    now = int(time.time())
    t = pyjwt.encode({"iss": ISSUER, "sub": sub, "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")
    return {"authorization": f"Bearer {t}"}


def get(g, path: str, headers: dict) -> int:
    return requests.get(g.url + path, headers=headers, timeout=10).status_code


def start(host, upstream, gateways, *filters: FilterSpec):
    return gateways(host, GatewaySpec(filters=list(filters), upstreams={"upstream": upstream.port}))


def tenant_counts(g) -> dict[str, int]:
    """tollgate_requests_total summed by tenant label (Envoy's stat names, or the nginx host's
    equivalent)."""
    out: dict[str, int] = {}
    for name, value in g.stats("tollgate_requests_total").items():
        m = re.search(r"\.tenant\.([a-z0-9_-]+)$", name)
        if m and "tollgate_requests_total" in name:
            out[m.group(1)] = out.get(m.group(1), 0) + value
    return out


def test_forged_claim_headers_do_not_label_metrics(host, upstream, gateways):
    """The issue's attack: refused requests carrying `x-jwt-sub: <victim>` used to be labelled
    with it and to fill the tenant registry (max_tenants), after which real tenants were `other`."""
    metrics = {"tenant": {**SUB, "max_tenants": 3, "registry": f"id{uuid.uuid4().hex[:8]}"}}
    g = start(host, upstream, gateways, FilterSpec("metrics", metrics), FilterSpec("jwt-auth", JWT))
    for i in range(10):
        assert get(g, "/v1/models", {"x-jwt-sub": f"victim-{i}"}) == 401
    for i in range(3):  # bypassed by jwt-auth: not verified either
        assert get(g, "/healthz", {"x-jwt-sub": f"victim-h{i}"}) == 200
    for sub in ("alice", "bob", "carol", "dave"):
        # A verified request with a forged header still gets its own identity.
        assert get(g, "/v1/models", {**token(sub), "x-jwt-sub": "mallory"}) == 200
    if kong_differs(host, "no-stats"):
        return  # the statuses are what Kong shows: the labels stay in its Lua-only metrics
    want = {"unauthenticated": 13, "alice": 1, "bob": 1, "carol": 1, "other": 1}
    # Each worker hands its counters over at its next flush (`flush_interval_ms`, 1 s).
    deadline = time.monotonic() + 10
    while (counts := tenant_counts(g)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [t for t in counts if t.startswith("victim") or t == "mallory"], counts
    assert counts == want, counts


def test_forged_claim_headers_are_not_rate_limit_keys(host, upstream, gateways):
    limit = {"namespace": "identity", "rules": [{"name": "per-user", "match": {"prefix": "/v1/"}, "key": [SUB],
                                            "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]}]}
    # Rate-limit before jwt-auth (e.g. to shed load before verifying): nothing is verified yet,
    # so rotating a forged x-jwt-sub does not give a client a fresh bucket, nor charge alice's.
    g = start(host, upstream, gateways, FilterSpec("rate-limit", limit), FilterSpec("jwt-auth", JWT))
    statuses = [get(g, "/v1/models", {"x-jwt-sub": sub}) for sub in ("alice", "bob", "carol")]
    assert statuses == [401, 401, 429], "one bucket for every unauthenticated request"
    # After jwt-auth: verified subjects have their own buckets; a forged header changes nothing.
    g = start(host, upstream, gateways, FilterSpec("jwt-auth", JWT), FilterSpec("rate-limit", limit))
    alice = [get(g, "/v1/models", {**token("alice"), "x-jwt-sub": f"forged-{i}"}) for i in range(3)]
    assert alice == [200, 200, 429]
    assert get(g, "/v1/models", token("bob")) == 200


PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}}
CHAT = {"content-type": "application/json", "x-mock-prompt-tokens": "100", "x-mock-completion-tokens": "10"}


def chat(g, headers: dict) -> int:
    body = json.dumps({"model": "gpt-4o-mini", "messages": []})
    return requests.post(g.url + "/v1/chat/completions", data=body, headers={**CHAT, **headers}, timeout=10).status_code


def refused_within(g, headers_for, seconds: float = 3.0) -> int:
    """Sends requests (headers_for(i)) until one is refused for its budget (402); returns how
    many were served first. The booking of a response can land just after the client has it, so
    the refusal may take a request or two."""
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        status = chat(g, headers_for(i))
        if status == 402:
            return i
        assert status == 200, status
        i += 1
        time.sleep(0.05)
    raise AssertionError(f"never refused after {i} requests")


def test_forged_claim_headers_are_not_cost_tenants(host, upstream, gateways):
    cost = {"ledger": f"id{uuid.uuid4().hex[:8]}", "prices": PRICES, "tenant": SUB,
            "budgets": {"default": {"day_nano_usd": 1}}}
    # No jwt-auth in front: a client naming a new tenant on every request used to get a fresh
    # budget each time; now all of them are `unauthenticated`, one budget.
    g = start(host, upstream, gateways, FilterSpec("cost", cost))
    assert refused_within(g, lambda i: {"x-jwt-sub": f"tenant-{i}"}) >= 1
    # Behind jwt-auth, verified tenants have their own budgets; forged headers do not move spend.
    g = start(host, upstream, gateways, FilterSpec("jwt-auth", JWT), FilterSpec("cost", cost))
    assert refused_within(g, lambda i: {**token("alice"), "x-jwt-sub": f"forged-{i}"}) >= 1
    assert chat(g, token("bob")) == 200
