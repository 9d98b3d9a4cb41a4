"""Issue 33: a request body the cost filter cannot read is never served unbooked to a tenant with
a budget (plugins/cost/README.md, "Request bodies the filter cannot read").

Two real lenient upstreams stand behind the gateway, on loopback:
- `PyUpstream` (here): reads a request as Python servers commonly do: `json.loads` on the body's
  bytes (UTF-8 with a byte order mark, UTF-16 and UTF-32 detected, lone surrogates, NaN
  accepted), after decompressing a `content-encoding` and decoding the `content-type`'s charset
  as aiohttp does, form and multipart bodies read as form fields, `if body.get("stream")`, any
  method;
- `testdata/lenient_upstream.go`: Go's `encoding/json` Decoder into a struct (names matched
  with Unicode simple folding, invalid UTF-8 as U+FFFD, the first value read).
Both answer an OpenAI-shaped completion for the model they read, with usage, and record what
they served. Each body below is one that upstream serves and that the filter of main (94d0694)
could not read or read otherwise: there it was served, with a model the gateway has no price
for (`gpt-unpriced`: a readable body naming it is refused, `model_not_priced`) and nothing
booked, or priced as the model the filter read while the upstream served another, or a stream
without its usage charged the estimate. Now it is refused before the upstream, which serves
nothing for that tenant.
"""
from __future__ import annotations

import base64
import codecs
import email.message
import email.parser
import email.policy
import gzip
import http.server
import json
import pathlib
import socket
import subprocess
import threading
import urllib.parse
import uuid
import zlib

import pytest
import requests

from lab import FilterSpec, GatewaySpec, Process, free_port, kong_differs, wait_for_port
from refusals import refusal_code

TENANT = "x-tenant"
ROUTE = "x-upstream"
PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}}
# What the upstreams' usage (1000 prompt, 500 completion tokens) costs at gpt-4o-mini's price.
PRICED_NANO = 1000 * 150 + 500 * 600
CONFIG = {
    "ledger": "unreadable",
    "prices": PRICES,
    "tenant": {"unverified_header": TENANT},
    # Every tenant has a budget, but `free` (listed without periods: no limit).
    "budgets": {"default": {"day_nano_usd": 10**15}, "tenants": {"free": {}}},
    "spend_headers": True,
}
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


class PyUpstream:
    """The Python lenient upstream (module docstring), on a thread; `served` lists what it
    answered: (tenant, method, path, model, stream)."""

    def __init__(self):
        self.served: list[dict] = []
        lock = threading.Lock()
        served = self.served

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def read_body(self) -> bytes:
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    out = b""
                    while True:
                        line = self.rfile.readline()
                        if not line:
                            raise ConnectionError("body cut short")
                        size = int(line.split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline().strip():
                                pass
                            return out
                        data = self.rfile.read(size + 2)
                        if len(data) < size + 2:
                            raise ConnectionError("body cut short")
                        out += data[:size]
                n = int(self.headers.get("content-length") or 0)
                data = self.rfile.read(n)
                if len(data) < n:
                    raise ConnectionError("body cut short")
                return data

            def document(self, body: bytes):
                coding = self.headers.get("content-encoding", "").strip().lower()
                if coding in ("gzip", "x-gzip"):
                    body = gzip.decompress(body)
                elif coding == "deflate":
                    body = zlib.decompress(body)
                ctype = self.headers.get("content-type", "")
                media, _, params = ctype.partition(";")
                media = media.strip().lower()
                if media == "application/x-www-form-urlencoded":
                    return {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode()).items()}
                if media.startswith("multipart/"):
                    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                        b"content-type: " + ctype.encode() + b"\r\n\r\n" + body)
                    return {p.get_param("name", header="content-disposition"): p.get_content()
                            for p in msg.iter_parts()}
                charset = email.message.Message()
                charset["content-type"] = ctype
                cs = charset.get_content_charset()
                return json.loads(body.decode(cs) if cs else body)

            def answer(self) -> None:
                if self.path == "/healthz":
                    self.reply(200, "application/json", b"{}")
                    return
                try:
                    doc = self.document(self.read_body())
                    model, stream = str(doc.get("model")), bool(doc.get("stream"))
                except ConnectionError:
                    # The gateway refused the request after sending its headers (Envoy).
                    self.close_connection = True
                    return
                except Exception as e:  # noqa: BLE001: a strict reader's refusal
                    self.reply(400, "application/json", json.dumps({"error": repr(e)}).encode())
                    return
                with lock:
                    served.append({"tenant": self.headers.get(TENANT), "method": self.command, "path": self.path,
                                   "model": model, "stream": stream})
                usage = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
                if not stream:
                    self.reply(200, "application/json", json.dumps({
                        "id": "c", "object": "chat.completion", "model": model, "usage": usage,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}).encode())
                    return
                chunk = {"id": "c", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": {"content": "ok"}}]}
                events = [chunk]
                options = doc.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    events.append({**chunk, "choices": [], "usage": usage})
                sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self.reply(200, "text/event-stream", sse.encode())

            def reply(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_GET = do_PATCH = do_DELETE = answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GoUpstream:
    """testdata/lenient_upstream.go, built here (`go build`) and run; it writes each request it
    served to its log as a JSON line."""

    def __init__(self, workdir: pathlib.Path):
        binary = workdir / "lenient-upstream"
        if not binary.exists():
            subprocess.run(["go", "build", "-o", str(binary), "lenient_upstream.go"],
                           cwd=pathlib.Path(__file__).parent / "testdata", check=True, timeout=300)
        self.port = free_port()
        self.process = Process([str(binary), f"127.0.0.1:{self.port}"], workdir / "lenient-upstream.log")
        wait_for_port(self.port, self.process.proc, 10, self.process.log)

    @property
    def served(self) -> list[dict]:
        return [json.loads(line) for line in self.process.log.read_text().splitlines() if line.startswith("{")]

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture(scope="module")
def upstreams(workdir):
    py, go = PyUpstream(), GoUpstream(workdir)
    yield {"py": py, "go": go}
    py.stop()
    go.stop()


def start(host, upstreams, config):
    return host.start(GatewaySpec(filters=[FilterSpec("cost", config)],
                                  upstreams={"py": upstreams["py"].port, "go": upstreams["go"].port},
                                  route_header=ROUTE, workers=2))


@pytest.fixture(scope="module")
def gateway(host, upstreams):
    g = start(host, upstreams, CONFIG)
    yield g
    g.stop()


def spend(gateway, tenant: str) -> int:
    r = requests.get(gateway.url + "/healthz", headers={TENANT: tenant, ROUTE: "py"}, timeout=10)
    assert r.status_code == 200, r.text
    return int(r.headers["x-tollgate-spend-total-nano-usd"])


def served(upstreams, tenant: str) -> list[dict]:
    return [s for u in upstreams.values() for s in u.served if s["tenant"] == tenant]


def utf7(text: str) -> bytes:
    """`text` as one UTF-7 base64 run (RFC 2152): `+`, modified base64 of UTF-16BE, `-`."""
    return b"+" + base64.b64encode(text.encode("utf-16-be")).rstrip(b"=") + b"-"


UNPRICED = json.dumps({"model": "gpt-unpriced", "messages": [{"role": "user", "content": "hi"}]})
MULTIPART = (b"--b\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\ngpt-unpriced\r\n"
             b"--b\r\ncontent-disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--b--\r\n")

# (id, upstream, method, headers, body, status, reason counted) of bodies a lenient upstream
# serves and this filter refuses, with what main's filter did with each.
CASES = [
    # main: not UTF-8 JSON, passed unread; Python reads gpt-unpriced: served, nothing booked.
    ("utf8_bom", "py", "POST", JSON, codecs.BOM_UTF8 + UNPRICED.encode(), 400, "json"),
    ("utf16_le", "py", "POST", JSON, UNPRICED.encode("utf-16-le"), 400, "json"),
    ("utf16_with_bom", "py", "POST", JSON, UNPRICED.encode("utf-16"), 400, "json"),
    ("utf32_be", "py", "POST", JSON, UNPRICED.encode("utf-32-be"), 400, "json"),
    ("utf8_encoded_surrogate", "py", "POST", JSON, b'{"model":"gpt-unpriced","x":"\xed\xa0\x80"}', 400, "json"),
    ("lone_surrogate_in_a_name", "py", "POST", JSON, b'{"\\ud800":1,"model":"gpt-unpriced"}', 400, "json"),
    ("nan", "py", "POST", JSON, b'{"model":"gpt-unpriced","temperature":NaN}', 400, "json"),
    # main: read, its model not decodable: no model, not refused; served gpt-unpriced\udc00.
    ("lone_surrogate_in_the_model", "py", "POST", JSON, b'{"model":"gpt-unpriced\\udc00"}', 400, "json"),
    # main: read as no stream: no include_usage added; Python streams (truthy 1) without usage:
    # charged the estimate instead of the price.
    ("stream_number", "py", "POST", JSON, b'{"model":"gpt-4o-mini","stream":1}', 400, "member_type"),
    # main: compressed, a charset, a form, multipart: passed unread or read otherwise; served.
    ("gzip", "py", "POST", {**JSON, "content-encoding": "gzip"}, gzip.compress(UNPRICED.encode()), 415, "content_encoding"),
    ("deflate", "py", "POST", {**JSON, "content-encoding": "deflate"}, zlib.compress(UNPRICED.encode()), 415, "content_encoding"),
    ("charset_utf7", "py", "POST", {"content-type": "application/json; charset=utf-7"},
     b'{"model":"gpt-4o-mini","x":"' + utf7('","model":"gpt-unpriced","y":"') + b'"}', 415, "content_type"),
    ("form", "py", "POST", {"content-type": "application/x-www-form-urlencoded"}, b"model=gpt-unpriced&prompt=hi", 415, "content_type"),
    ("multipart", "py", "POST", {"content-type": "multipart/form-data; boundary=b"}, MULTIPART, 415, "content_type"),
    # main: Go reads what the filter did not.
    ("invalid_utf8", "go", "POST", JSON, b'{"model":"gpt-unpriced","messages":[{"role":"user","content":"hi\xff"}]}', 400, "json"),
    ("model_capitalised", "go", "POST", JSON, b'{"Model":"gpt-unpriced"}', 400, "ambiguous_name"),
    ("model_and_upper_case", "go", "POST", JSON, b'{"model":"gpt-4o-mini","MODEL":"gpt-unpriced"}', 400, "ambiguous_name"),
    ("stream_long_s", "go", "POST", JSON, '{"model":"gpt-4o-mini","\u017ftream":true}'.encode(), 400, "ambiguous_name"),
    ("second_object", "go", "POST", JSON, b'{"model":"gpt-unpriced"} {"model":"gpt-4o-mini"}', 400, "json"),
    # main: only a POST's body was read; these are read now, and their model refused.
    ("put", "py", "PUT", JSON, UNPRICED.encode(), 400, None),
    ("get_with_a_body", "go", "GET", JSON, UNPRICED.encode(), 400, None),
]


def reasons(host, gateway) -> dict[str, int] | None:
    """tollgate_cost_unreadable_bodies_total by reason; None where the host serves no counters."""
    if kong_differs(host, "no-stats"):
        return None
    stats = gateway.stats("tollgate_cost_unreadable_bodies_total")
    return {k.rpartition(".")[2]: v for k, v in stats.items()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_body_a_lenient_upstream_reads_is_refused_unless_the_filter_reads_it_alike(host, gateway, upstreams, case):
    name, upstream, method, headers, body, status, reason = case
    tenant = uuid.uuid4().hex
    before = reasons(host, gateway)
    r = requests.request(method, gateway.url + CHAT, data=body, timeout=30,
                         headers={**headers, TENANT: tenant, ROUTE: upstream})
    seen = served(upstreams, tenant)
    what = f"{name}: {r.status_code} {r.text[:120]!r}; the upstream served {seen}; booked {spend(gateway, tenant)} nano-USD"
    assert r.status_code == status, what
    assert refusal_code(r.json()) == ("unreadable_body" if reason else "model_not_priced"), what
    assert seen == [], what
    if reason:
        after = reasons(host, gateway)
        if before is not None and after is not None:
            assert after.get(reason, 0) == before.get(reason, 0) + 1, (before, after)
        if reason == "content_encoding":
            assert r.headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("upstream", ["py", "go"])
def test_readable_bodies_are_served_priced_or_refused_as_before(gateway, upstreams, upstream):
    tenant = uuid.uuid4().hex
    ok = json.dumps({"model": "gpt-4o-mini", "mod\\u0065l_note": "x", "messages": [{"Model": "not read"}]})
    r = requests.post(gateway.url + CHAT, data=ok, headers={**JSON, TENANT: tenant, ROUTE: upstream}, timeout=30)
    assert r.status_code == 200, r.text
    assert spend(gateway, tenant) == PRICED_NANO
    # A stream without include_usage: asked for, priced exactly.
    tenant = uuid.uuid4().hex
    r = requests.post(gateway.url + CHAT, data=json.dumps({"model": "gpt-4o-mini", "stream": True}),
                      headers={**JSON, TENANT: tenant, ROUTE: upstream}, timeout=30)
    assert r.status_code == 200 and b'"usage"' not in r.content and r.content.endswith(b"data: [DONE]\n\n"), r.content
    assert spend(gateway, tenant) == PRICED_NANO
    r = requests.post(gateway.url + CHAT, data=UNPRICED, headers={**JSON, TENANT: tenant, ROUTE: upstream}, timeout=30)
    assert r.status_code == 400 and refusal_code(r.json()) == "model_not_priced", r.text
    # No body, or an empty one: nothing to read, nothing for the upstream to read either.
    r = requests.post(gateway.url + "/v1/batches/b/cancel", data=b"", headers={TENANT: tenant, ROUTE: "py"}, timeout=30)
    assert "unreadable_body" not in r.text and r.status_code < 500, r.text


def test_a_tenant_without_a_budget_is_served_unread_and_counted(host, gateway, upstreams):
    before = reasons(host, gateway)
    body = codecs.BOM_UTF8 + json.dumps({"model": "gpt-4o-mini"}).encode()
    r = requests.post(gateway.url + CHAT, data=body, headers={**JSON, TENANT: "free", ROUTE: "py"}, timeout=30)
    assert r.status_code == 200, r.text
    after = reasons(host, gateway)
    if before is not None and after is not None:
        assert after.get("json", 0) == before.get("json", 0) + 1, (before, after)
    # Headers are not looked at for it: a compressed body is served (the upstream decodes it).
    r = requests.post(gateway.url + CHAT, data=gzip.compress(b'{"model":"gpt-4o-mini"}'),
                      headers={**JSON, "content-encoding": "gzip", TENANT: "free", ROUTE: "py"}, timeout=30)
    assert r.status_code == 200, r.text


def h2_request(port: int, headers: list[tuple[str, str]], body: bytes, trailers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """One HTTP/2 request (prior knowledge, h2c) whose body ends with trailers: (status, body)."""
    import h2.config
    import h2.connection
    import h2.events
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, headers)
        conn.send_data(stream, body)
        conn.send_headers(stream, trailers, end_stream=True)
        s.sendall(conn.data_to_send())
        status, data = 0, b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            for ev in conn.receive_data(chunk):
                if isinstance(ev, h2.events.ResponseReceived):
                    status = int(dict(ev.headers)[b":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    data += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, stream)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    return status, data
            s.sendall(conn.data_to_send())
    return status, data


def chunked_request(port: int, head: str, body: bytes, trailer: str) -> tuple[int, bytes]:
    """One HTTP/1.1 request with a chunked body and a trailer section: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(head.encode() + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                  + b"%x\r\n" % len(body) + body + b"\r\n0\r\n" + trailer.encode() + b"\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), rest


def test_a_body_ending_with_trailers_is_read(host, gateway, upstreams):
    """Envoy calls the body callback without end_of_stream when trailers follow (HTTP/2), then
    the trailers callback: main's filter, which had none, let the held body go upstream unread.
    nginx 1.22 drops request trailers (the body ends as usual): read on main too."""
    tenant = uuid.uuid4().hex
    port = int(gateway.url.rpartition(":")[2])
    if host.name == "envoy":
        status, body = h2_request(port, [(":method", "POST"), (":path", CHAT), (":scheme", "http"),
                                         (":authority", "gw"), ("content-type", "application/json"),
                                         (TENANT, tenant), (ROUTE, "py")],
                                  UNPRICED.encode(), [("x-trailer", "1")])
    else:
        status, body = chunked_request(port, f"POST {CHAT} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                                             f"{TENANT}: {tenant}\r\n{ROUTE}: py\r\n", UNPRICED.encode(), "x-trailer: 1")
    what = f"{status} {body[:120]!r}; the upstream served {served(upstreams, tenant)}; booked {spend(gateway, tenant)}"
    assert status == 400 and refusal_code(json.loads(body)) == "model_not_priced", what
    assert served(upstreams, tenant) == [], what


def test_max_request_body_bytes_0_refuses_the_bodies_of_budgeted_tenants(host, gateways, upstreams):
    """main: 0 meant that no body is read, so none of a budgeted tenant's either: served unread."""
    g = gateways(host, GatewaySpec(filters=[FilterSpec("cost", {**CONFIG, "ledger": "max0", "max_request_body_bytes": 0})],
                                   upstreams={"py": upstreams["py"].port, "go": upstreams["go"].port}, route_header=ROUTE))
    tenant = uuid.uuid4().hex
    r = requests.post(g.url + CHAT, data=UNPRICED, headers={**JSON, TENANT: tenant, ROUTE: "py"}, timeout=30)
    what = f"{r.status_code} {r.text[:120]!r}; the upstream served {served(upstreams, tenant)}"
    assert r.status_code == 413 and refusal_code(r.json()) == "request_too_large", what
    assert served(upstreams, tenant) == []
    r = requests.post(g.url + CHAT, data=UNPRICED, headers={**JSON, TENANT: "free", ROUTE: "py"}, timeout=30)
    assert r.status_code == 200, r.text
