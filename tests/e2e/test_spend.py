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
import struct
import threading
import time
import uuid
from fractions import Fraction
from math import floor

import pytest
import requests

from lab import FilterSpec, GatewaySpec, kong_differs, wait_until
from refusals import refusal_code
from test_cost import PRICES, TENANT, call, expected_nano, price, spend

WORKERS = 4
ROUNDS = 100
# Tenants with a budget of their own (each configured by name; nginx takes at most 4 KB of
# plugin configuration in one directive argument).
BUDGET_ROUNDS = 30

CONFIG = {
    "ledger": "spend",
    "prices": PRICES,
    "tenant": {"unverified_header": TENANT},
    "budgets": {"tenants": {f"capped-{i}": {"day_nano_usd": 1} for i in range(BUDGET_ROUNDS)}},
    "spend_headers": True,
}


def cost_gateway(host, upstream, config: dict, workers: int):
    """A gateway with the cost filter alone, for a module's tests."""
    g = host.start(GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}, workers=workers))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def gateway(host, upstream):
    yield from cost_gateway(host, upstream, CONFIG, WORKERS)


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


# ---- Spend that used to go unbooked (issue 17, part 4) --------------------------------------

PRICED = {m: PRICES[m] for m in ("gpt-4o-mini", "claude-x", "text-embedding-3-small")}
# Each budget is spent by one request of the kind its test sends (at least 1000 nano-USD).
BUDGET = {"day_nano_usd": 1000}
BYPASS_CONFIG = {
    "ledger": "bypass",
    "prices": PRICED,
    "tenant": {"unverified_header": TENANT},
    "budgets": {"tenants": {t: BUDGET for t in ("b-stream", "b-gzip", "b-gzip-sse", "b-huge", "b-huge-sse", "b-unknown",
                                                  "b-variant", "b-malformed", "b-abort", "b-large")}},
    "spend_headers": True,
    "max_request_body_bytes": 16384,
}


@pytest.fixture(scope="module")
def bypass(host, upstream):
    yield from cost_gateway(host, upstream, BYPASS_CONFIG, 2)


def chat_stream(url: str, tenant: str, body: dict, **headers) -> requests.Response:
    h = {"content-type": "application/json", TENANT: tenant, "x-mock-prompt-tokens": "55",
         "x-mock-completion-tokens": "21", "x-mock-cached-tokens": "5", **headers}
    return requests.post(url + "/v1/chat/completions", data=json.dumps(body), headers=h, timeout=30, stream=True)


def events(stream: bytes) -> list[bytes]:
    return [e for e in stream.split(b"\n\n") if e]


def reason(gateway, name: str) -> int:
    return sum(v for k, v in gateway.stats("tollgate_cost_unpriced_total").items() if k.endswith(f".reason.{name}"))


def over_budget(gateway, tenant: str) -> None:
    r = call(gateway.url, "chat", "gpt-4o-mini", tenant=tenant, p=1, c=1)
    assert r.status_code == 402, r.text
    assert "x-upstream-name" not in r.headers


def test_streams_without_include_usage_are_priced_and_the_added_chunk_removed(bypass, upstream):
    body = {"model": "gpt-4o-mini", "stream": True}
    # What the upstream sends when asked for the usage (the filter asks for it).
    asked = chat_stream(f"http://127.0.0.1:{upstream.port}", "x", body | {"stream_options": {"include_usage": True}}).content
    usage_event = [e for e in events(asked) if b'"choices":[]' in e]
    assert len(usage_event) == 1
    tenant = uuid.uuid4().hex
    r = chat_stream(bypass.url, tenant, body)
    got = r.content
    assert r.status_code == 200
    # The client gets the stream it asked for, without the usage chunk it did not ask for; the
    # other chunks keep the upstream's "usage":null (README).
    assert got == asked.replace(usage_event[0] + b"\n\n", b"")
    assert b'"prompt_tokens"' not in got and got.endswith(b"data: [DONE]\n\n")
    assert spend(bypass, tenant)["total"] == expected_nano("chat-sse", "gpt-4o-mini", 55, 21, 5) > 0
    # A client that asked for it gets it, untouched.
    tenant2 = uuid.uuid4().hex
    r = chat_stream(bypass.url, tenant2, body | {"stream_options": {"include_usage": True}})
    assert r.content == asked
    assert spend(bypass, tenant2)["total"] == expected_nano("chat-sse", "gpt-4o-mini", 55, 21, 5)
    # Over budget, once the stream has been read: refused.
    r = chat_stream(bypass.url, "b-stream", body)
    assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    over_budget(bypass, "b-stream")


def test_the_upstream_is_asked_for_identity_and_other_bodies_pass_unchanged(bypass):
    # The echo endpoint (any path the demo upstream does not know) shows what arrived.
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "h\u00e9"}]}
    r = requests.post(bypass.url + "/anything", data=json.dumps(body),
                      headers={"content-type": "application/json", "accept-encoding": "gzip, br", TENANT: "x"}, timeout=10)
    echo = r.json()
    assert echo["headers"]["accept-encoding"] == ["identity"]
    assert echo["body_bytes"] == len(json.dumps(body)), "not a completions path: the body is not rewritten"


@pytest.mark.parametrize("kind", ["chat", "chat-sse", "anthropic", "anthropic-sse", "embeddings"])
def test_compressed_responses_are_decoded_and_priced(bypass, upstream, kind):
    """The upstream compresses although asked for identity (x-mock-gzip ignores Accept-Encoding):
    the filter decodes its copy; the client gets the compressed bytes as they were sent."""
    model = {"chat": "gpt-4o-mini", "chat-sse": "gpt-4o-mini", "anthropic": "claude-x", "anthropic-sse": "claude-x",
             "embeddings": "text-embedding-3-small"}[kind]
    headers = {"x-mock-gzip": "1", "accept-encoding": "gzip"}
    tokens = dict(p=300, c=40, cached=10)
    direct = call(f"http://127.0.0.1:{upstream.port}", kind, model, headers=headers, stream_kw=True, **tokens)
    expect = direct.raw.read(decode_content=False)
    tenant = uuid.uuid4().hex
    r = call(bypass.url, kind, model, tenant=tenant, headers=headers, stream_kw=True, **tokens)
    got = r.raw.read(decode_content=False)
    assert r.headers["content-encoding"] == "gzip" and got == expect
    assert spend(bypass, tenant)["total"] == expected_nano(kind, model, **tokens) > 0
    if kind in ("chat", "chat-sse"):
        budgeted = "b-gzip" if kind == "chat" else "b-gzip-sse"
        assert call(bypass.url, kind, model, tenant=budgeted, headers=headers, **tokens).status_code == 200
        over_budget(bypass, budgeted)


@pytest.mark.parametrize("kind", ["chat", "chat-sse", "anthropic", "anthropic-sse", "embeddings"])
def test_huge_bodies_are_scanned_whole_and_priced(bypass, upstream, kind):
    """About 2 MiB of text in the body (in one SSE event for streams): no size bound skips it."""
    model = {"chat": "gpt-4o-mini", "chat-sse": "gpt-4o-mini", "anthropic": "claude-x", "anthropic-sse": "claude-x",
             "embeddings": "text-embedding-3-small"}[kind]
    tokens = dict(p=1000, c=500)
    headers = {"x-mock-body": "huge"}
    direct = call(f"http://127.0.0.1:{upstream.port}", kind, model, headers=headers, stream_kw=True, **tokens)
    expect = direct.raw.read(decode_content=False)
    assert len(expect) > 2 << 20
    tenant = uuid.uuid4().hex
    r = call(bypass.url, kind, model, tenant=tenant, headers=headers, stream_kw=True, **tokens)
    assert r.raw.read(decode_content=False) == expect
    assert spend(bypass, tenant)["total"] == expected_nano(kind, model, **tokens)
    if kind in ("chat", "chat-sse"):
        budgeted = "b-huge" if kind == "chat" else "b-huge-sse"
        assert call(bypass.url, kind, model, tenant=budgeted, headers=headers, **tokens).status_code == 200
        over_budget(bypass, budgeted)


def test_unknown_models_are_refused_before_the_upstream_for_tenants_with_a_budget(host, bypass):
    no_stats = kong_differs(host, "no-stats")  # the statuses and the spend are what is seen
    before = 0 if no_stats else reason(bypass, "unknown_model")
    r = call(bypass.url, "chat", "no-such-model", tenant="b-unknown", p=5, c=5)
    assert r.status_code == 400 and refusal_code(r.json()) == "model_not_priced"
    assert "x-upstream-name" not in r.headers
    # Without a budget: served, counted, nothing to charge it with.
    tenant = uuid.uuid4().hex
    assert call(bypass.url, "chat", "no-such-model", tenant=tenant, p=5, c=5).status_code == 200
    assert spend(bypass, tenant)["total"] == 0
    if not no_stats:
        assert reason(bypass, "unknown_model") == before + 1
        assert bypass.stats("tollgate_cost_requests_total").get("wasmcustom.tollgate_cost_requests_total.outcome.unknown_model", 0) >= 1


def test_a_dated_model_in_the_response_is_priced_as_the_requested_one(bypass):
    # Providers answer "gpt-4o-mini" with e.g. "gpt-4o-mini-2024-07-18", which the table may lack.
    tenant = uuid.uuid4().hex
    r = call(bypass.url, "chat", "gpt-4o-mini", tenant=tenant, headers={"x-mock-model": "gpt-4o-mini-2024-07-18"}, p=400, c=100)
    assert r.status_code == 200
    assert spend(bypass, tenant)["total"] == expected_nano("chat", "gpt-4o-mini", 400, 100)
    assert call(bypass.url, "chat", "gpt-4o-mini", tenant="b-variant", headers={"x-mock-model": "gpt-4o-mini-x"}, p=400, c=100).status_code == 200
    over_budget(bypass, "b-variant")


def test_a_default_price_prices_every_unknown_model(host, upstream, gateways):
    config = dict(BYPASS_CONFIG, ledger="default-price", unknown_model={"default_price": PRICES["odd-model"]})
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}))
    tenant = uuid.uuid4().hex
    assert call(g.url, "chat", "brand-new-model", tenant=tenant, p=1234, c=567).status_code == 200
    assert spend(g, tenant)["total"] == expected_nano("chat", "odd-model", 1234, 567) == 341
    assert call(g.url, "chat", "brand-new-model", tenant="b-unknown", p=1, c=1).status_code == 200


def test_unpriceable_responses_are_charged_the_estimate_and_counted(host, bypass):
    no_stats = kong_differs(host, "no-stats")  # the estimate charged is what is seen
    before = 0 if no_stats else reason(bypass, "malformed")
    tenant = uuid.uuid4().hex
    r = call(bypass.url, "chat", "gpt-4o-mini", tenant=tenant, headers={"x-mock-body": "malformed"}, p=50, c=20)
    assert r.status_code == 200
    request_bytes = len(json.dumps({"model": "gpt-4o-mini"}))
    want = floor((request_bytes * price("gpt-4o-mini", "input_cost_per_token")
                  + len(r.content) * price("gpt-4o-mini", "output_cost_per_token")) * 10**9 + Fraction(1, 2))
    assert spend(bypass, tenant)["total"] == want > 0
    if not no_stats:
        assert reason(bypass, "malformed") == before + 1
    assert call(bypass.url, "chat", "gpt-4o-mini", tenant="b-malformed", headers={"x-mock-body": "malformed"}).status_code == 200
    over_budget(bypass, "b-malformed")


def test_a_stream_the_client_abandons_is_charged_what_it_received(host, bypass):
    """Closing the connection before the usage chunk used to leave the stream unbooked."""
    if kong_differs(host, "no-stats"):
        # No `incomplete` counter to wait on: wait for the booking itself (the tenant's spend;
        # the budgeted tenant over its budget).
        for tenant in (uuid.uuid4().hex, "b-abort"):
            r = chat_stream(bypass.url, tenant, {"model": "gpt-4o-mini", "stream": True}, **{"x-mock-chunks": "100000"})
            assert r.status_code == 200
            assert next(r.raw.stream(4096, decode_content=False))
            r.close()
            if tenant == "b-abort":
                wait_until(lambda: call(bypass.url, "chat", "gpt-4o-mini", tenant=tenant, p=1, c=1).status_code == 402, 10)
            else:
                wait_until(lambda: spend(bypass, tenant)["total"] > 0, 10)
        over_budget(bypass, "b-abort")
        return
    before = reason(bypass, "incomplete")
    for tenant in (uuid.uuid4().hex, "b-abort"):
        r = chat_stream(bypass.url, tenant, {"model": "gpt-4o-mini", "stream": True}, **{"x-mock-chunks": "100000"})
        assert r.status_code == 200
        first = next(r.raw.stream(4096, decode_content=False))
        assert first
        r.close()
        deadline = time.monotonic() + 10
        while reason(bypass, "incomplete") < before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = reason(bypass, "incomplete")
        if tenant != "b-abort":
            assert spend(bypass, tenant)["total"] > 0
    over_budget(bypass, "b-abort")


def test_an_anthropic_stream_the_client_abandons_is_charged_its_reported_input_exactly(host, bypass):
    """message_start reported 5,000 input tokens; the client left before message_delta (the log
    phase books): the input is charged exactly and only the output estimated, one token per byte
    sent (partial_usage), where the request's 37 bytes used to stand for the input."""
    no_stats = kong_differs(host, "no-stats")
    before = 0 if no_stats else reason(bypass, "partial_usage")
    tenant = uuid.uuid4().hex
    h = {"content-type": "application/json", TENANT: tenant, "x-mock-prompt-tokens": "5000", "x-mock-chunks": "100000"}
    r = requests.post(bypass.url + "/v1/messages", data=json.dumps({"model": "claude-x", "stream": True}), headers=h,
                      timeout=30, stream=True)
    assert r.status_code == 200
    assert next(r.raw.stream(4096, decode_content=False))
    r.close()
    wait_until(lambda: spend(bypass, tenant)["total"] > 0, 10)
    input_exact = expected_nano("anthropic", "claude-x", 5000, 0)  # 15,000,000 nano-USD
    per_output_token = expected_nano("anthropic", "claude-x", 0, 1)  # 15,000 nano-USD
    total = spend(bypass, tenant)["total"]
    assert total > input_exact and (total - input_exact) % per_output_token == 0, total
    if not no_stats:
        wait_until(lambda: reason(bypass, "partial_usage") == before + 1, 10)


# An Anthropic stream as its streaming reference shows it, cut after its first text delta.
CUT_STREAM = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
              b'"role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,'
              b'"usage":{"input_tokens":4000,"cache_read_input_tokens":0,"output_tokens":1}}}\n\n'
              b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
              b'"delta":{"type":"text_delta","text":"Hello"}}\n\n')


def resetting_upstream(stop: threading.Event) -> socket.socket:
    """A loopback upstream that answers each `POST /v1/messages` with CUT_STREAM, chunked, then
    resets the connection (SO_LINGER 0: an RST, no last chunk), anything else with an empty 200
    (at most 100 connections)."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)

    def serve():
        served = 0
        while not stop.is_set() and served < 100:
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            served += 1
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                if not data.startswith(b"POST /v1/messages "):
                    # The spend look-ups (`/healthz`): an empty answer.
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    continue
                head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
                conn.sendall(head + b"%x\r\n" % len(CUT_STREAM) + CUT_STREAM + b"\r\n")
                time.sleep(0.3)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_a_stream_the_upstream_resets_after_message_start_is_charged_its_reported_input(host):
    """The upstream resets the stream before message_delta: the 4,000 input tokens message_start
    reported are charged exactly, the output one token per byte the filter saw (partial_usage)."""
    stop = threading.Event()
    srv = resetting_upstream(stop)
    config = dict(BYPASS_CONFIG, ledger="reset")
    g = host.start(GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": srv.getsockname()[1]}))
    try:
        tenant = uuid.uuid4().hex
        try:
            r = requests.post(g.url + "/v1/messages", data=json.dumps({"model": "claude-x", "stream": True}),
                              headers={"content-type": "application/json", TENANT: tenant}, timeout=10)
            r.content
        except requests.RequestException:
            pass  # the reset reaches the client as a cut response
        wait_until(lambda: spend(g, tenant)["total"] > 0, 10)
        input_exact = expected_nano("anthropic", "claude-x", 4000, 0)
        per_output_token = expected_nano("anthropic", "claude-x", 0, 1)
        extra = spend(g, tenant)["total"] - input_exact
        assert extra % per_output_token == 0 and 0 < extra // per_output_token <= len(CUT_STREAM), extra
    finally:
        stop.set()
        g.stop()


def test_request_bodies_too_large_to_read_are_refused_for_tenants_with_a_budget(bypass):
    big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 20_000}]}
    r = requests.post(bypass.url + "/v1/chat/completions", json=big, headers={TENANT: "b-large"}, timeout=10)
    assert r.status_code == 413
    assert "x-upstream-name" not in r.headers
    tenant = uuid.uuid4().hex
    r = requests.post(bypass.url + "/v1/chat/completions", json=big, headers={TENANT: tenant}, timeout=10)
    assert r.status_code == 200
    assert spend(bypass, tenant)["total"] == expected_nano("chat", "gpt-4o-mini", 12, 8)
