"""cost end to end: calls that start billable work the filter cannot price (plugins/cost/README.md,
"Calls the filter cannot price") are refused before the upstream for a tenant with a budget, on
every host; reading calls, tenants without a budget and `unpriced_calls: allow` pass.

The upstream is a recording one (Python, on loopback): it notes each request when its headers
arrive (`started`) and again once its whole body is read (`served`). A call refused at the request
headers never starts there; a background Responses call, refused at its body, is never served.
Before the filter refused them (main at 1bc8bd0) every one of these calls was served.
"""
from __future__ import annotations

import http.server
import json
import threading
import uuid

import pytest
import requests

from lab import FilterSpec, GatewaySpec
from refusals import refusal_code
from test_cost import PRICES, TENANT

BUDGETED = "capped"
CONFIG = {
    "ledger": "unpriced-calls",
    "prices": {"gpt-4o-mini": PRICES["gpt-4o-mini"]},
    "tenant": {"unverified_header": TENANT},
    # Large enough for any reservation: only the unpriced calls are refused.
    "budgets": {"tenants": {BUDGETED: {"day_nano_usd": 10**15}}},
}
MARK = "x-test-call"


class RecordingUpstream:
    """Answers every request 200 with a small JSON object, noting each one's `MARK` header in
    `started` (headers read) and `served` (body read)."""

    def __init__(self):
        self.started: list[str] = []
        self.served: list[str] = []
        started, served = self.started, self.served

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                started.append(self.headers.get(MARK, ""))
                n = int(self.headers.get("content-length") or 0)
                if len(self.rfile.read(n)) < n:
                    return
                served.append(self.headers.get(MARK, ""))
                body = b'{"id":"batch_abc","object":"batch","status":"validating"}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def recorder():
    u = RecordingUpstream()
    yield u
    u.stop()


@pytest.fixture(scope="module", params=["refuse", "allow"])
def gateway(request, host, recorder):
    config = dict(CONFIG, unpriced_calls=request.param) if request.param == "allow" else CONFIG
    g = host.start(GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": recorder.port}, workers=2))
    g.policy = request.param
    yield g
    g.stop()


BATCH = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
MESSAGE_BATCH = {"requests": [{"custom_id": "a", "params": {"model": "claude-x", "max_tokens": 10,
                                                          "messages": [{"role": "user", "content": "hi"}]}}]}
BACKGROUND = {"model": "gpt-4o-mini", "input": "hi", "background": True}

# (id, tenant, method, path, body, api envelope, what a budgeted tenant gets under `refuse`:
# "headers" refused at the request headers, "body" refused at the body, an int the status of
# the refusal of an unreadable body, None passed).
CASES = [
    ("batch", BUDGETED, "POST", "/v1/batches", BATCH, "openai", "headers"),
    ("batch-spelled", BUDGETED, "POST", "/v1//Batches/?limit=1", BATCH, "openai", "headers"),
    ("batch-encoded", BUDGETED, "POST", "/v1/%62atches", BATCH, "openai", "headers"),
    ("message-batch", BUDGETED, "POST", "/v1/messages/batches", MESSAGE_BATCH, "anthropic", "headers"),
    ("run", BUDGETED, "POST", "/v1/threads/thread_abc/runs", {"assistant_id": "asst_abc"}, "openai", "headers"),
    ("background", BUDGETED, "POST", "/v1/responses", BACKGROUND, "openai", "body"),
    ("background-string", BUDGETED, "POST", "/v1/responses", dict(BACKGROUND, background="true"), "openai", 400),
    ("list-batches", BUDGETED, "GET", "/v1/batches", None, "openai", None),
    ("cancel-batch", BUDGETED, "POST", "/v1/batches/batch_abc/cancel", {}, "openai", None),
    ("foreground", BUDGETED, "POST", "/v1/responses", dict(BACKGROUND, background=False), "openai", None),
    ("no-budget-batch", None, "POST", "/v1/batches", BATCH, "openai", None),
    ("no-budget-background", None, "POST", "/v1/responses", BACKGROUND, "openai", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_unpriced_calls(gateway, recorder, case):
    name, tenant, method, path, body, api, refused = case
    mark = f"{name}-{uuid.uuid4().hex}"
    headers = {MARK: mark, TENANT: tenant or uuid.uuid4().hex, "content-type": "application/json"}
    data = None if body is None else json.dumps(body)
    r = requests.request(method, gateway.url + path, data=data, headers=headers, timeout=10)
    if isinstance(refused, int):
        # An abuse: a `background` a lenient reader takes as true is refused under both policies.
        assert r.status_code == refused, r.text
        assert refusal_code(r.json(), api) == "unreadable_body"
        assert mark not in recorder.served
        return
    if refused is None or gateway.policy == "allow":
        assert r.status_code == 200, r.text
        assert mark in recorder.served
        return
    assert r.status_code == 403, r.text
    assert refusal_code(r.json(), api) == "unpriced_endpoint"
    assert mark not in recorder.served
    if refused == "headers":
        assert mark not in recorder.started
