"""One credential is one tenant and one rate-limit key, whatever its spelling (README,
"What a filter reads"; plugins/common/src/credential.rs).

The upstream that checks a key reads `Bearer K`, `bearer K` and `BEARER   K` as one credential
(RFC 9110 section 11.1: the scheme is case-insensitive), so cost's budgets and rate-limit's keys
must too; a header that does not hold exactly one credential is refused (401), never hashed into
a tenant or a bucket of its own.
"""
from __future__ import annotations

import json
import uuid

import pytest

from lab import FilterSpec, GatewaySpec
from raw_http import exchange, json_body, request
from refusals import refusal_code

PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}}
# 100 prompt and 10 completion tokens cost 21,000 nano-USD: one such request spends the budget.
COST = {"ledger": "credentials", "prices": PRICES, "tenant": {"api_key_header": "authorization"},
        "budgets": {"default": {"day_nano_usd": 20_000}}}
RATE_LIMIT = {"namespace": "credentials", "rules": [
    {"name": "api-key", "match": {"prefix": "/api-key"}, "key": [{"api_key_header": "x-api-key"}],
     "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]},
    {"name": "auth", "match": {"prefix": "/auth"}, "key": [{"unverified_header": "authorization"}],
     "limits": [{"algorithm": "fixed_window", "requests": 1, "per": "day"}]},
]}
CHAT = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode()


def post_chat(g, fields: list[tuple[bytes, bytes]]) -> tuple[int, dict | None]:
    fields = [(b"Host", b"gw.test"), (b"Content-Type", b"application/json"),
              (b"x-mock-prompt-tokens", b"100"), (b"x-mock-completion-tokens", b"10"), *fields]
    status, _, body = exchange(g.url, request(b"/v1/chat/completions", fields, b"POST", CHAT))
    return status, json_body(body)


def get(g, target: bytes, fields: list[tuple[bytes, bytes]]) -> tuple[int, dict | None]:
    status, _, body = exchange(g.url, request(target, [(b"Host", b"gw.test"), *fields]))
    return status, json_body(body)


@pytest.fixture(scope="module")
def cost_gateway(host, upstream):
    g = host.start(GatewaySpec(filters=[FilterSpec("cost", COST)], upstreams={"upstream": upstream.port}))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def limit_gateway(host, upstream):
    g = host.start(GatewaySpec(filters=[FilterSpec("rate-limit", RATE_LIMIT)], upstreams={"upstream": upstream.port}))
    yield g
    g.stop()


def test_a_budget_holds_for_every_spelling_of_the_key(cost_gateway):
    key = b"sk-e2e-" + uuid.uuid4().hex.encode()
    assert post_chat(cost_gateway, [(b"Authorization", b"Bearer " + key)])[0] == 200
    for spelling in (b"Bearer ", b"bearer ", b"BEARER ", b"Bearer    ", b"bEaReR \t"):
        status, body = post_chat(cost_gateway, [(b"Authorization", spelling + key)])
        assert status == 402, (spelling, status, body)
        assert refusal_code(body) == "budget_exceeded"
    # The key itself is case-sensitive: another key, another tenant.
    assert post_chat(cost_gateway, [(b"Authorization", b"Bearer " + key.upper())])[0] == 200


@pytest.mark.parametrize("value", [b"Bearer", b"Bearer a b", b"sk-no-scheme", b"Bearer a,Bearer b",
                                   b"Digest username=\"a\", realm=\"b\"", b"Basic not*base64"])
def test_a_value_that_is_not_one_credential_is_refused(cost_gateway, value):
    status, body = post_chat(cost_gateway, [(b"Authorization", value)])
    assert status == 401, (value, status, body)
    assert refusal_code(body) == "invalid_api_key"


def test_a_repeated_key_header_is_refused(cost_gateway, limit_gateway):
    # Two Authorization fields: Envoy joins them with a comma, nginx refuses a repeated
    # Authorization itself (400); either way no tenant is made of one of them.
    fields = [(b"Authorization", b"Bearer k1"), (b"Authorization", b"Bearer k2")]
    assert post_chat(cost_gateway, fields)[0] in (400, 401)
    status, body = get(limit_gateway, b"/api-key", [(b"x-api-key", b"k1"), (b"X-Api-Key", b"k2")])
    assert status == 401, body
    assert body["error"] == "invalid_credential"


def test_a_rate_limit_key_holds_for_every_spelling(limit_gateway):
    key = uuid.uuid4().hex.encode()
    assert get(limit_gateway, b"/api-key", [(b"x-api-key", key)])[0] == 200
    assert get(limit_gateway, b"/api-key", [(b"x-api-key", b" " + key + b"\t")])[0] == 200
    assert get(limit_gateway, b"/api-key", [(b"x-api-key", key)])[0] == 429
    assert get(limit_gateway, b"/api-key", [(b"x-api-key", key + b" extra")])[0] == 401
    token = b"tok-" + uuid.uuid4().hex.encode()
    assert get(limit_gateway, b"/auth", [(b"Authorization", b"Bearer " + token)])[0] == 200
    for spelling in (b"bearer ", b"BEARER  "):
        assert get(limit_gateway, b"/auth", [(b"Authorization", spelling + token)])[0] == 429, spelling
