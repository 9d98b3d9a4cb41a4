"""cost end to end: spend is booked before the client has its reply, on every host.

A client that has read its whole response must find the spend booked when it asks again at once
(on another connection, so on any worker). For a JSON response the client has it all once
`Content-Length` bytes arrived; for a stream, once it saw the final event (`data: [DONE]`,
`event: message_stop`), which it may act on before the host's own end of the response.
Each check is repeated many times in a row: the race it guards against lost about one booking
in 30 on nginx before the filter booked at the body's completion.
"""
from __future__ import annotations

import json
import socket
import uuid

import pytest
import requests

from harness import FilterSpec, GatewaySpec
from test_cost import PRICES, TENANT, call, expected_nano, spend

WORKERS = 4
ROUNDS = 100
# Tenants with a budget of their own (each configured by name; nginx takes at most 4 KB of
# plugin configuration in one directive argument).
BUDGET_ROUNDS = 30

CONFIG = {
    "ledger": "spend",
    "prices": PRICES,
    "tenant": {"header": TENANT},
    "budgets": {"tenants": {f"capped-{i}": {"day_nano_usd": 1} for i in range(BUDGET_ROUNDS)}},
    "spend_headers": True,
}


@pytest.fixture(scope="module")
def gateway(host, upstream):
    spec = GatewaySpec(filters=[FilterSpec("cost", CONFIG)], upstreams={"upstream": upstream.port}, workers=WORKERS)
    g = host.start(spec)
    yield g
    g.stop()


@pytest.mark.parametrize("kind,model", [("chat", "gpt-4o-mini"), ("embeddings", "text-embedding-3-small"),
                                        ("anthropic", "claude-x")])
def test_json_spend_is_visible_as_soon_as_the_reply_is(gateway, kind, model):
    expect = expected_nano(kind, model, 77, 0 if kind == "embeddings" else 5)
    misses = []
    for i in range(ROUNDS):
        tenant = uuid.uuid4().hex
        r = call(gateway.url, kind, model, tenant=tenant, p=77, c=5)
        assert r.status_code == 200, r.text
        got = spend(gateway, tenant)["total"]
        if got != expect:
            misses.append((i, got))
    assert not misses, f"{len(misses)}/{ROUNDS} bookings not visible after the reply (expected {expect}): {misses[:5]}"


def read_until_final_event(url: str, path: str, body: dict, headers: dict, final: bytes) -> bytes:
    """Posts `body` over a raw HTTP/1.1 connection and returns what was read once `final`
    (the stream's last event) has arrived, without waiting for the end of the response."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json",
            f"content-length: {len(payload)}"] + [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        got = b""
        while final not in got:
            chunk = s.recv(65536)
            assert chunk, f"connection closed before the final event: {got[-300:]!r}"
            got += chunk
    return got


@pytest.mark.parametrize("kind", ["chat-sse", "anthropic-sse"])
def test_stream_spend_is_visible_at_its_final_event(gateway, kind):
    model = "gpt-4o-mini" if kind == "chat-sse" else "claude-x"
    if kind == "chat-sse":
        path, body, final = "/v1/chat/completions", {"model": model, "stream": True, "stream_options": {"include_usage": True}}, b"data: [DONE]\n\n"
    else:
        path, body, final = "/v1/messages", {"model": model, "stream": True}, b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    expect = expected_nano(kind, model, 55, 21)
    misses = []
    for i in range(ROUNDS):
        tenant = uuid.uuid4().hex
        headers = {TENANT: tenant, "x-mock-prompt-tokens": "55", "x-mock-completion-tokens": "21", "x-mock-chunks": "2"}
        read_until_final_event(gateway.url, path, body, headers, final)
        got = spend(gateway, tenant)["total"]
        if got != expect:
            misses.append((i, got))
    assert not misses, f"{len(misses)}/{ROUNDS} stream bookings not visible at the final event (expected {expect}): {misses[:5]}"


def test_a_spent_budget_refuses_the_very_next_request(gateway):
    refused_late = []
    for i in range(BUDGET_ROUNDS):
        tenant = f"capped-{i}"
        assert call(gateway.url, "chat", "gpt-4o-mini", tenant=tenant, p=10, c=1).status_code == 200
        r = call(gateway.url, "chat", "gpt-4o-mini", tenant=tenant, p=10, c=1)
        if r.status_code != 402:
            refused_late.append((i, r.status_code))
    assert not refused_late, f"{len(refused_late)}/{BUDGET_ROUNDS} over-budget requests admitted: {refused_late[:5]}"
    assert requests.get(gateway.url + "/healthz", headers={TENANT: "capped-0"}, timeout=10).status_code == 402
