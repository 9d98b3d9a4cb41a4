"""cost end to end: real Envoy with 4 workers (--concurrency 4) in front of the demo upstream's
OpenAI- and Anthropic-shaped responses, JSON and SSE.

Spend read-back: the filter's `spend_headers` option adds the tenant's spend as read from the
shared-data ledger at the start of a request (`x-tollgate-spend-{day,month,total}-nano-usd`) to its
response. After K concurrent requests have completed (each books before its last byte leaves the
gateway), one more request of the same tenant reads the ledger's total, which must equal the exact
sum computed here with fractions.Fraction, each request's cost rounded half up to a nano-USD as
the filter does.
"""
from __future__ import annotations

import concurrent.futures
import json
import random
import uuid
from fractions import Fraction
from math import floor

import pytest
import requests

from lab import FilterSpec, GatewaySpec, kong_differs, wait_until
from refusals import refusal_code

WORKERS = 4
TENANT = "x-tenant"

# Entries as in LiteLLM's model_prices_and_context_window.json (extra fields must be ignored).
PRICES = {
    "gpt-4o-mini": {
        "max_tokens": 16384, "max_input_tokens": 128000, "max_output_tokens": 16384,
        "input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 7.5e-08,
        "input_cost_per_token_batches": 7.5e-08, "output_cost_per_token_batches": 3e-07,
        "litellm_provider": "openai", "mode": "chat", "supports_function_calling": True, "supports_vision": True,
    },
    "o-reasoner": {"input_cost_per_token": 1.1e-06, "output_cost_per_token": 4.4e-06, "cache_read_input_token_cost": 2.75e-07,
                   "output_cost_per_reasoning_token": 5e-06, "mode": "chat"},
    "claude-x": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "cache_read_input_token_cost": 3e-07,
                 "cache_creation_input_token_cost": 3.75e-06, "litellm_provider": "anthropic", "mode": "chat"},
    # Prices that make fractional nano-USD, to check the rounding rule.
    "odd-model": {"input_cost_per_token": 1.23456789e-10, "output_cost_per_token": 3.3333e-10},
    "text-embedding-3-small": {"input_cost_per_token": 2e-08, "output_cost_per_token": 0.0, "mode": "embedding"},
}

CONFIG = {
    "ledger": "e2e",
    "prices": PRICES,
    "tenant": {"unverified_header": TENANT},
    "budgets": {"tenants": {"capped": {"day_nano_usd": 1000}, "monthly": {"month_nano_usd": 1}}},
    "spend_headers": True,
}


@pytest.fixture(scope="module")
def gateway(host, upstream):
    spec = GatewaySpec(filters=[FilterSpec("cost", CONFIG)], upstreams={"upstream": upstream.port}, workers=WORKERS)
    g = host.start(spec)
    yield g
    g.stop()


def price(model: str, field: str, fallback: str | None = None) -> Fraction:
    entry = PRICES[model]
    value = entry.get(field, entry.get(fallback) if fallback else None)
    return Fraction(repr(value)) if value is not None else Fraction(0)


def expected_nano(kind: str, model: str, p: int, c: int, cached: int = 0, reasoning: int = 0, creation: int = 0) -> int:
    """The filter's rounding: the exact USD cost, times 10^9, rounded half up."""
    inp = price(model, "input_cost_per_token")
    out = price(model, "output_cost_per_token")
    read = price(model, "cache_read_input_token_cost", "input_cost_per_token")
    create = price(model, "cache_creation_input_token_cost", "input_cost_per_token")
    reason = price(model, "output_cost_per_reasoning_token", "output_cost_per_token")
    if kind.startswith("anthropic"):
        # Anthropic's input_tokens excludes cache reads and creations.
        usd = p * inp + cached * read + creation * create + c * out
    elif kind == "embeddings":
        usd = p * inp
    else:
        # OpenAI's prompt_tokens includes cached tokens, completion_tokens includes reasoning.
        usd = (p - cached) * inp + cached * read + (c - reasoning) * out + reasoning * reason
    return floor(usd * 10**9 + Fraction(1, 2))


ENDPOINT = {"chat": "/v1/chat/completions", "chat-sse": "/v1/chat/completions", "responses": "/v1/responses",
            "embeddings": "/v1/embeddings", "anthropic": "/v1/messages", "anthropic-sse": "/v1/messages"}


def llm_body(kind: str, model: str) -> dict:
    body: dict = {"model": model}
    if kind == "chat-sse":
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "anthropic-sse":
        body["stream"] = True
    return body


def call(base: str, kind: str, model: str, tenant: str | None = None, headers: dict | None = None, stream_kw: bool = False, **tokens):
    body = llm_body(kind, model)
    h = {"content-type": "application/json", **(headers or {})}
    names = {"p": "x-mock-prompt-tokens", "c": "x-mock-completion-tokens", "cached": "x-mock-cached-tokens",
             "reasoning": "x-mock-reasoning-tokens", "creation": "x-mock-cache-creation-tokens"}
    for k, v in tokens.items():
        h[names[k]] = str(v)
    if tenant is not None:
        h[TENANT] = tenant
    return requests.post(base + ENDPOINT[kind], data=json.dumps(body), headers=h, timeout=30, stream=stream_kw)


def spend(gateway, tenant: str) -> dict[str, int]:
    r = requests.get(gateway.url + "/healthz", headers={TENANT: tenant}, timeout=10)
    assert r.status_code == 200
    return {p: int(r.headers[f"x-tollgate-spend-{p}-nano-usd"]) for p in ("day", "month", "total")}


def booked(gateway, kind, model, headers=None, **tokens) -> int:
    """The cost booked for one request (a fresh tenant's recorded spend afterwards)."""
    tenant = uuid.uuid4().hex
    r = call(gateway.url, kind, model, tenant=tenant, headers=headers, **tokens)
    assert r.status_code == 200, r.text
    assert r.headers["x-tollgate-spend-total-nano-usd"] == "0"
    return spend(gateway, tenant)["total"]


def test_openai_chat_json(gateway):
    # 60·150 + 40·75 + 50·600 nano-USD: cached tokens are part of prompt_tokens.
    assert booked(gateway, "chat", "gpt-4o-mini", p=100, c=50, cached=40, reasoning=10) == 42_000 \
        == expected_nano("chat", "gpt-4o-mini", 100, 50, 40, 10)


def test_reasoning_price_responses_and_embeddings(gateway):
    assert booked(gateway, "responses", "o-reasoner", p=1000, c=500, cached=200, reasoning=300) \
        == expected_nano("responses", "o-reasoner", 1000, 500, 200, 300)
    assert booked(gateway, "embeddings", "text-embedding-3-small", p=77) == expected_nano("embeddings", "text-embedding-3-small", 77, 0) == 1540


def test_anthropic_json_counts_cache_tokens_as_input(gateway):
    # 10·3000 + 7·300 + 5·3750 + 3·15000
    assert booked(gateway, "anthropic", "claude-x", p=10, c=3, cached=7, creation=5) == 95_850 \
        == expected_nano("anthropic", "claude-x", 10, 3, cached=7, creation=5)


def test_model_from_the_request_when_the_response_lacks_it(gateway):
    got = booked(gateway, "chat", "odd-model", headers={"x-mock-omit-model": "1"}, p=1234, c=567)
    assert got == expected_nano("chat", "odd-model", 1234, 567) == 341  # 152.345... + 188.998... rounded once


def test_unknown_model_is_unpriced(host, gateway):
    assert booked(gateway, "chat", "no-such-model", p=5, c=5) == 0
    if not kong_differs(host, "no-stats"):  # there: served and charged nothing is what is seen
        assert gateway.stats("tollgate_cost").get("wasmcustom.tollgate_cost_requests_total.outcome.unpriced", 0) > 0


@pytest.mark.parametrize("kind", ["chat-sse", "anthropic-sse"])
@pytest.mark.parametrize("crlf", [False, True])
def test_streams_are_priced_and_pass_through(gateway, upstream, kind, crlf):
    tenant = uuid.uuid4().hex
    model = "gpt-4o-mini" if kind == "chat-sse" else "claude-x"
    extra = {"x-mock-chunks": "40"} | ({"x-mock-crlf": "1"} if crlf else {})
    tokens = dict(p=321, c=123, cached=21) | ({"reasoning": 3} if kind == "chat-sse" else {"creation": 4})
    direct = call(f"http://127.0.0.1:{upstream.port}", kind, model, headers=extra, **tokens).content
    r = call(gateway.url, kind, model, tenant=tenant, headers=extra, stream_kw=True, **tokens)
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = list(r.raw.read_chunked(decode_content=False))
    assert b"".join(chunks) == direct
    # Envoy coalesces the upstream's per-event writes on loopback, so chunk counts are not
    # asserted; what reaches the client is byte-identical and the filter never holds a chunk.
    expect = expected_nano(kind, model, **tokens)
    assert spend(gateway, tenant)["total"] == expect > 0


BAD = ["malformed", "truncated", "no-usage"]


def estimate_nano(model: str, request_bytes: int, response_bytes: int) -> int:
    """What an LLM response that cannot be priced is charged (unpriced_charge: bytes): one input
    token per request byte and one output token per response byte, rounded half up once."""
    usd = request_bytes * price(model, "input_cost_per_token") + response_bytes * price(model, "output_cost_per_token")
    return floor(usd * 10**9 + Fraction(1, 2))


@pytest.mark.parametrize("kind", ["chat", "chat-sse", "anthropic", "anthropic-sse", "embeddings"])
@pytest.mark.parametrize("bad", BAD)
def test_bad_bodies_pass_through_untouched_and_are_charged_the_estimate(gateway, upstream, kind, bad):
    # Huge and compressed bodies are priced exactly (test_spend.py).
    model = "claude-x" if kind.startswith("anthropic") else ("text-embedding-3-small" if kind == "embeddings" else "gpt-4o-mini")
    headers = {"x-mock-body": bad}
    tenant = uuid.uuid4().hex
    direct = call(f"http://127.0.0.1:{upstream.port}", kind, model, headers=headers, stream_kw=True, p=50, c=20)
    expect = direct.raw.read(decode_content=False)
    r = call(gateway.url, kind, model, tenant=tenant, headers=headers, stream_kw=True, p=50, c=20)
    got = r.raw.read(decode_content=False)
    assert r.status_code == direct.status_code == 200
    assert got == expect, f"{len(got)} bytes vs {len(expect)}"
    request_bytes = len(json.dumps(llm_body(kind, model)))
    if kind == "anthropic-sse" and bad == "truncated":
        # Cut after message_start, which reported the 50 input tokens: those are charged
        # exactly and only the output estimated from the bytes (partial_usage), not the request's
        # 37 bytes.
        request_bytes = 50
    assert spend(gateway, tenant)["total"] == estimate_nano(model, request_bytes, len(expect)) > 0


def test_concurrent_spend_is_exact(host, gateway):
    """200 requests over 32 threads, every format, varied tokens, one tenant: no booking lost."""
    tenant = uuid.uuid4().hex
    rng = random.Random(4)
    kinds = [("chat", "gpt-4o-mini"), ("chat-sse", "odd-model"), ("responses", "o-reasoner"), ("embeddings", "text-embedding-3-small"),
             ("anthropic", "claude-x"), ("anthropic-sse", "claude-x"), ("chat", "odd-model"), ("chat-sse", "o-reasoner")]
    jobs = []
    for _ in range(200):
        kind, model = rng.choice(kinds)
        p, c = rng.randint(1, 5000), rng.randint(0, 3000)
        t = {"p": p, "c": c}
        if kind in ("chat", "chat-sse", "responses"):
            t |= {"cached": rng.randint(0, p), "reasoning": rng.randint(0, c)}
        elif kind.startswith("anthropic"):
            t |= {"cached": rng.randint(0, 2000), "creation": rng.randint(0, 2000)}
        jobs.append((kind, model, t))

    def run(job):
        kind, model, t = job
        r = call(gateway.url, kind, model, tenant=tenant, **t)
        assert r.status_code == 200, r.text
        return r

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(run, jobs))
    total = sum(expected_nano(kind, model, **t) for kind, model, t in jobs)
    s = spend(gateway, tenant)
    assert s == {"day": total, "month": total, "total": total}, (s, total)
    if not kong_differs(host, "no-stats"):  # there: the exact spend above shows no failed booking
        stats = gateway.stats("tollgate_cost")
        assert not any(v for k, v in stats.items() if "booking_failures" in k), stats


def test_budgets_refuse_before_the_upstream(gateway):
    # capped: 1000 nano-USD per day. The first request is admitted (spend 0), the next refused.
    r = call(gateway.url, "chat", "gpt-4o-mini", tenant="capped", p=100, c=10)
    assert r.status_code == 200
    assert r.headers["x-tollgate-spend-day-nano-usd"] == "0"
    assert expected_nano("chat", "gpt-4o-mini", 100, 10) >= 1000
    r = call(gateway.url, "chat", "gpt-4o-mini", tenant="capped", p=1, c=1)
    assert r.status_code == 402
    assert "x-upstream-name" not in r.headers  # never reached the upstream
    assert refusal_code(r.json()) == "budget_exceeded"
    assert 0 < int(r.headers["x-tollgate-budget-reset"]) <= 86_400
    # Another tenant is unaffected.
    assert call(gateway.url, "chat", "gpt-4o-mini", tenant=uuid.uuid4().hex, p=1, c=1).status_code == 200
    # monthly: 1 nano-USD per month; resets on the first of next month (at most 31 days).
    assert call(gateway.url, "anthropic", "claude-x", tenant="monthly", p=1, c=1).status_code == 200
    r = call(gateway.url, "anthropic", "claude-x", tenant="monthly", p=1, c=1)
    assert r.status_code == 402
    assert 0 < int(r.headers["x-tollgate-budget-reset"]) <= 31 * 86_400


def test_over_budget_status_429_and_bad_configs(host, upstream, gateways):
    config = dict(CONFIG, over_budget_status=429, budgets={"default": {"day_nano_usd": 0}})
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}, workers=1))
    r = call(g.url, "chat", "gpt-4o-mini", tenant="anyone", p=1, c=1)
    assert r.status_code == 429 and "retry-after" in r.headers
    bad = dict(CONFIG, prices={"m": {"input_cost_per_token": -1e-07, "output_cost_per_token": 0}})
    with pytest.raises(Exception):
        gateways(host, GatewaySpec(filters=[FilterSpec("cost", bad)], upstreams={"upstream": upstream.port}), timeout=15)


def test_the_request_body_reaches_the_upstream_when_a_filter_follows_cost(host, upstream, gateways):
    """The cost filter reads the request body; a filter after it in the chain (here one that does
    nothing) must not change what the upstream gets. Under Kong's module the body is lost
    (body-lost-after-a-reading-filter): the upstream gets the request without it, and nginx reads
    the body left in the connection as the next request line. Cost last in the chain is not
    affected (the likely stack)."""
    spec = GatewaySpec(filters=[FilterSpec("cost", CONFIG), FilterSpec("wasm-floor", {})], upstreams={"upstream": upstream.port})
    g = gateways(host, spec)
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    answers = []
    for _ in range(2):
        r = requests.post(g.url + "/v1/chat/completions", data=body, timeout=10,
                          headers={"content-type": "application/json", TENANT: f"t-{uuid.uuid4().hex[:8]}"})
        answers.append((r.status_code, r.json().get("model")))
    if kong_differs(host, "body-lost-after-a-reading-filter"):
        assert answers == [(200, "demo-model")] * 2, answers  # the demo upstream's model when it gets no body
        wait_until(lambda: "client sent invalid method" in g.log.read_text(errors="replace"), 5)
    else:
        assert answers == [(200, "gpt-4o-mini")] * 2, answers
