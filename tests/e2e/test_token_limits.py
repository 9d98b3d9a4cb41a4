"""cost's token limits (local mode) end to end, on every host: 2 workers in front of the demo
upstream's OpenAI- and Anthropic-shaped responses (JSON and SSE, usage from x-mock-* headers).

A window's count is read back from the RateLimit field the filter adds to an admitted response
(`"<limit>";r=<tokens left before this request>;t=<seconds>`): after K requests have completed
(each is counted before its last byte leaves the gateway), one more request of the same tenant
shows what is left, which must equal the limit minus the exact weighted sum computed here.

Windows are a minute or an hour, aligned to the epoch: a test that needs one window waits out
the last seconds of the current one (`one_window`).
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import random
import re
import threading
import time
import uuid
from fractions import Fraction

import pytest
import requests

from lab import FilterSpec, GatewaySpec, kong_differs
from refusals import refusal, refusal_code

TENANT = "x-tenant"
PRICES = {
    "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 7.5e-08},
    "claude-x": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "litellm_provider": "anthropic"},
}
# OpenAI-style weights as a provider bills them: cached input at a tenth, output at 4, reasoning at 2.
WEIGHTS = {"input": 1, "cached_input": 0.1, "output": 4, "reasoning": 2}
BIG = 10**12
CONFIG = {
    "ledger": "tokens",
    "prices": PRICES,
    "tenant": {"unverified_header": TENANT},
    "token_limits": {
        "default": [{"name": "tpm", "tokens": 1000, "per": "minute"}],
        "tenants": {
            "weighted": [{"name": "wtph", "tokens": BIG, "per": "hour", "weights": WEIGHTS}],
            "models": [{"name": "mini", "tokens": 100, "per": "hour", "model": "gpt-4o-mini"},
                       {"name": "claude", "tokens": 100, "per": "hour", "model": "claude-x"}],
        },
    },
}
ENDPOINT = {"chat": "/v1/chat/completions", "chat-sse": "/v1/chat/completions", "anthropic": "/v1/messages",
            "anthropic-sse": "/v1/messages"}
MOCK = {"p": "x-mock-prompt-tokens", "c": "x-mock-completion-tokens", "cached": "x-mock-cached-tokens",
        "reasoning": "x-mock-reasoning-tokens", "creation": "x-mock-cache-creation-tokens"}


@pytest.fixture(scope="module")
def gateway(host, upstream):
    spec = GatewaySpec(filters=[FilterSpec("cost", CONFIG)], upstreams={"upstream": upstream.port}, workers=2)
    g = host.start(spec)
    yield g
    g.stop()


def call(base: str, kind: str, model: str, tenant: str, **tokens) -> requests.Response:
    body: dict = {"model": model}
    if kind == "chat-sse":
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "anthropic-sse":
        body["stream"] = True
    headers = {"content-type": "application/json", TENANT: tenant} | {MOCK[k]: str(v) for k, v in tokens.items()}
    return requests.post(base + ENDPOINT[kind], data=json.dumps(body), headers=headers, timeout=30)


def left(r: requests.Response, limit: str) -> int:
    """`r` of `limit` in the RateLimit field (tokens left when the request was admitted)."""
    m = re.search(rf'"{re.escape(limit)}";r=(\d+);t=(\d+)', r.headers.get("ratelimit", ""))
    assert m, dict(r.headers)
    return int(m.group(1))


def one_window(margin: float = 10.0) -> None:
    """Waits for the next minute when less than `margin` seconds are left in this one."""
    rest = 60 - time.time() % 60
    if rest < margin:
        time.sleep(rest + 0.2)


def weighted(p: int, c: int, cached: int = 0, reasoning: int = 0) -> int:
    """WEIGHTS applied to an OpenAI usage (prompt includes cached, completion includes reasoning),
    rounded up per response as the filter does."""
    w = {k: Fraction(str(v)) for k, v in WEIGHTS.items()}
    exact = (p - cached) * w["input"] + cached * w["cached_input"] + (c - reasoning) * w["output"] + reasoning * w["reasoning"]
    return math.ceil(exact)


def test_admitted_until_the_usage_spends_the_window_then_refused_before_the_upstream(host, gateway):
    one_window()
    tenant = uuid.uuid4().hex
    first = call(gateway.url, "chat", "gpt-4o-mini", tenant, p=400, c=200)
    assert first.status_code == 200 and "x-upstream-name" in first.headers
    assert left(first, "tpm") == 1000
    assert first.headers["ratelimit-policy"] == '"tpm";q=1000;w=60'
    second = call(gateway.url, "chat", "gpt-4o-mini", tenant, p=300, c=150)
    assert second.status_code == 200 and left(second, "tpm") == 400
    # 600 + 450 = 1050 of 1000: spent (the request that crossed it was admitted with 400 left).
    refused = call(gateway.url, "chat", "gpt-4o-mini", tenant, p=1, c=1)
    assert refused.status_code == 429, refused.text
    assert "x-upstream-name" not in refused.headers  # answered by the filter, never proxied
    code, message = refusal(refused.json(), "openai")
    assert code == "token_limit_exceeded" and "tpm" in message
    assert refused.headers["ratelimit-policy"] == '"tpm";q=1000;w=60'
    m = re.fullmatch(r'"tpm";r=0;t=(\d+)', refused.headers["ratelimit"])
    assert m, refused.headers["ratelimit"]
    retry = int(refused.headers["retry-after"])
    assert retry == int(m.group(1))
    assert abs(retry - (60 - time.time() % 60)) <= 2
    # The refused request counted nothing, and other tenants have their own windows.
    assert call(gateway.url, "chat", "gpt-4o-mini", tenant, p=1, c=1).status_code == 429
    other = call(gateway.url, "chat", "gpt-4o-mini", uuid.uuid4().hex, p=1, c=1)
    assert other.status_code == 200 and left(other, "tpm") == 1000
    if not kong_differs(host, "no-stats"):
        stats = gateway.stats("tollgate_cost")
        assert stats.get("wasmcustom.tollgate_cost_requests_total.outcome.token_limited", 0) >= 2, stats


def test_streams_count_their_final_usage(gateway):
    one_window()
    tenant = uuid.uuid4().hex
    r = call(gateway.url, "chat-sse", "gpt-4o-mini", tenant, p=300, c=200)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    # Anthropic: input_tokens excludes the cache, so the input counted is 250 + 40 + 10.
    r = call(gateway.url, "anthropic-sse", "claude-x", tenant, p=250, c=200, cached=40, creation=10)
    assert r.status_code == 200 and left(r, "tpm") == 1000 - 500
    r = call(gateway.url, "chat", "gpt-4o-mini", tenant, p=1, c=1)
    assert r.status_code == 429 and r.headers["ratelimit"].startswith('"tpm";r=0;')


def test_two_workers_count_one_window_exactly(gateway):
    """60 requests over 12 connections, weighted tokens: the window holds the exact sum."""
    rng = random.Random(35)
    jobs = []
    for _ in range(60):
        p, c = rng.randint(1, 5000), rng.randint(0, 3000)
        jobs.append((rng.choice(["chat", "chat-sse"]), {"p": p, "c": c, "cached": rng.randint(0, p), "reasoning": rng.randint(0, c)}))

    def run(job):
        kind, t = job
        r = call(gateway.url, kind, "gpt-4o-mini", "weighted", **t)
        assert r.status_code == 200, r.text

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        list(pool.map(run, jobs))
    probe = call(gateway.url, "chat", "gpt-4o-mini", "weighted", p=1, c=0)
    assert left(probe, "wtph") == BIG - sum(weighted(**t) for _, t in jobs)


def test_a_model_limit_counts_only_its_model_family(gateway):
    """`models` has 100 tokens an hour for gpt-4o-mini and 100 for claude-x."""
    r = call(gateway.url, "anthropic", "claude-x", "models", p=100, c=50)
    assert r.status_code == 200
    assert r.headers["ratelimit-policy"] == '"claude";q=100;w=3600'  # only the limit that applies
    refused = call(gateway.url, "anthropic", "claude-x", "models", p=1, c=1)
    assert refused.status_code == 429
    assert refusal_code(refused.json(), "anthropic") == "token_limit_exceeded"
    assert refused.headers["ratelimit"].startswith('"claude";r=0;t=')
    # The other model's window is untouched; a dated, prefixed name is the same family.
    mini = call(gateway.url, "chat", "openai/gpt-4o-mini-2024-07-18", "models", p=60, c=0)
    assert mini.status_code == 200 and left(mini, "mini") == 100
    assert left(call(gateway.url, "chat", "gpt-4o-mini", "models", p=1, c=0), "mini") == 40


def test_tenants_a_client_makes_up_share_an_overflow_window_beyond_max_keys(host, upstream, gateways):
    """Abuse: a client cycling tenant values. Beyond max_keys (8) no key is created: the new
    tenants share the minute's overflow record, spent sooner, never later."""
    config = json.loads(json.dumps(CONFIG))
    config["token_limits"] = {"default": [{"name": "tpm", "tokens": 100, "per": "minute"}], "max_keys": 8}
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}, workers=2))
    one_window(20)
    own = [uuid.uuid4().hex for _ in range(8)]
    for t in own:
        assert call(g.url, "chat", "gpt-4o-mini", t, p=1, c=0).status_code == 200
    # 30 made-up tenants of 4 tokens each: they share one window of 100 tokens.
    answers = [call(g.url, "chat", "gpt-4o-mini", uuid.uuid4().hex, p=4, c=0) for _ in range(30)]
    codes = [r.status_code for r in answers]
    assert codes[:25] == [200] * 25 and codes[25:] == [429] * 5, codes
    assert answers[24].headers["ratelimit"].startswith('"tpm";r=4;')
    # The first 8 tenants still have their own windows (1 token used each).
    assert left(call(g.url, "chat", "gpt-4o-mini", own[0], p=1, c=0), "tpm") == 99
    if not kong_differs(host, "no-stats"):
        stats = g.stats("tollgate_cost")
        assert stats.get("wasmcustom.tollgate_cost_token_keys_created_total") == 8, stats
        assert stats.get("wasmcustom.tollgate_cost_token_overflow_total") == 25, stats


def test_bad_token_limits_refuse_to_load(host, upstream, gateways):
    bad = json.loads(json.dumps(CONFIG))
    bad["token_limits"]["default"][0]["weights"] = {"output": 1e-4}
    with pytest.raises(Exception):
        gateways(host, GatewaySpec(filters=[FilterSpec("cost", bad)], upstreams={"upstream": upstream.port}), timeout=15)


def test_token_limits_refuse_a_zone_that_evicts(host, upstream, gateways):
    """Token counts enforce something, as budgets do: without any budget, cost with token limits
    refuses an nginx zone that evicts (a flood of made-up tenants would reset a spent window)."""
    if host.name == "envoy" or kong_differs(host, "no-eviction-policy"):
        pytest.skip("no zones (Envoy), or the host cannot say whether one evicts (Kong)")
    spec = GatewaySpec(filters=[FilterSpec("cost", CONFIG)], upstreams={"upstream": upstream.port},
                       kv_zones={"cost": "1m eviction=lru"})
    with pytest.raises(Exception) as refused:
        gateways(host, spec, timeout=20)
    assert "evicts keys" in str(refused.value), str(refused.value)[-2000:]


def test_concurrent_requests_see_each_others_reservations(host, upstream, gateways):
    """20 concurrent requests of one tenant, 2 workers, a limit of 3,000 tokens a minute of which
    600 are counted, the upstream answering after 500 ms (so that every request is admitted
    before any is booked): each request reserves its bound at admission (its body's bytes, about
    2,100, plus its max_tokens, 100) and a window is spent once counted + reserved reach the
    limit, so exactly 2 are admitted (600 + 2,2xx < 3,000 ≤ 600 + 2 x 2,2xx) and the window ends
    at 1,800, inside the limit. Without reservations all 20 were admitted (nothing was counted
    yet) and the window ended at 12,600. The holds are released by the bookings: a request
    afterwards is told what is left of the counted tokens only."""
    config = json.loads(json.dumps(CONFIG))
    config["token_limits"] = {"default": [{"name": "tpm", "tokens": 3000, "per": "minute"}]}
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}, workers=2))
    one_window(25)
    tenant = uuid.uuid4().hex
    # The usage the mock reports is at most the body's bytes and the declared max_tokens, as a
    # real provider's is: 500 prompt tokens, 100 completion tokens.
    body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "x" * 2000}]})
    headers = {"content-type": "application/json", TENANT: tenant, MOCK["p"]: "500", MOCK["c"]: "100"}

    def post(delay_ms: int = 0) -> requests.Response:
        return requests.post(g.url + "/v1/chat/completions", data=body,
                             headers=headers | {"x-mock-delay-ms": str(delay_ms)}, timeout=30)

    assert post().status_code == 200
    barrier = threading.Barrier(20)

    def racer(_: int) -> int:
        barrier.wait()
        return post(500).status_code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(racer, range(20)))
    admitted = codes.count(200)
    spent = 600 * (1 + admitted)
    print(f"\n20 concurrent requests: {admitted} admitted, window at {spent} of 3000")
    assert sorted(codes) == [200] * 2 + [429] * 18, codes
    after = post()
    assert after.status_code == 200 and left(after, "tpm") == 3000 - spent, after.headers
