"""The `:authority` the filters see (tests/filters/probe reports it) is the authority the proxy routes the request on, on every host.

`GET http://api.example.com/admin/x HTTP/1.1` with `Host: status.example.com`: RFC 9112 section
3.2.2 says a server ignores that Host and a proxy replaces it with the target's authority. nginx
selects the `server {}` by `api.example.com` and gives it as `$host` (ngx_http_request.c:
`ngx_http_process_request_line` sets `headers_in.server` from the request line; Host does not
override it); Envoy's HTTP/1 codec sets `:authority` from the absolute URL. A filter whose rules
look at the authority (a host-based bypass, a tenant by host) must see that one: before, the nginx
host gave the filters the Host header (`status.example.com`) while nginx routed on
`api.example.com`.

The probe filter (`copy_authority`) copies the `:authority` it reads into the request header
`x-probe-authority`, which the demo upstream echoes back. The authority is given as the client
sent it (case, port); the filters canonicalise it themselves.

Kong's ngx_wasm_module gives the server's name and port instead (`authority-is-server-name`).
"""
from __future__ import annotations

import json
import socket

import grpc
import pytest

from lab import PROBE_WASM, FilterSpec, GatewaySpec, kong_differs
from raw_http import exchange


def authority_seen(gateway, request: bytes) -> str:
    status, _, body = exchange(gateway.url, request)
    assert status == 200, (status, body[:300])
    return json.loads(body)["headers"]["x-probe-authority"][0]


def kong_authority(gateway) -> str:
    """What Kong's module gives (ngx_proxy_wasm_maps.c, `ngx_proxy_wasm_maps_get_authority`):
    the server's `server_name` (none here: nginx's host name, which nginx lower-cases) and the
    local port."""
    return f"{socket.gethostname().lower()}:{gateway.url.rsplit(':', 1)[1]}"


@pytest.fixture
def probe(host, gateways, upstream):
    spec = GatewaySpec(filters=[FilterSpec("probe", {"request_headers": "copy_authority"}, wasm_file=PROBE_WASM)],
                       upstreams={"upstream": upstream.port})
    return gateways(host, spec)


def test_the_authority_of_an_absolute_form_target_wins_over_host(host, probe):
    cases = [
        (b"GET http://api.example.com/admin/x HTTP/1.1\r\nHost: status.example.com\r\n", "api.example.com"),
        # Host and port as sent.
        (b"GET http://API.Example.com:8080/admin/x?q=1 HTTP/1.1\r\nHost: status.example.com\r\n",
         "API.Example.com:8080"),
        # Origin form: the Host header, as before.
        (b"GET /admin/x HTTP/1.1\r\nHost: status.example.com\r\n", "status.example.com"),
    ]
    for request, want in cases:
        seen = authority_seen(probe, request + b"Connection: close\r\n\r\n")
        if kong_differs(host, "authority-is-server-name"):
            want = kong_authority(probe)
        assert seen == want, request


def test_http10_requests_without_host(host, probe):
    """HTTP/1.0 allows a request without Host: an absolute-form target gives the authority, an
    origin-form one none (nginx's `headers_in.server` is empty then)."""
    if host.name == "envoy":
        pytest.skip("Envoy refuses HTTP/1.0 (426) unless http_protocol_options.accept_http_10")
    for request, want in [(b"GET http://api.example.com:81/x HTTP/1.0\r\n\r\n", "api.example.com:81"),
                          (b"GET /x HTTP/1.0\r\n\r\n", "")]:
        seen = authority_seen(probe, request)
        if kong_differs(host, "authority-is-server-name"):
            want = kong_authority(probe)
        assert seen == want, request


def test_the_authority_of_an_http2_request(host, gateways, upstream):
    """HTTP/2's `:authority` (nginx turns it into a Host header): what a gRPC client sends. The
    probe answers with the authority it read (`authority_local`), which the client reads as the
    details of the gRPC status the local reply becomes."""
    spec = GatewaySpec(filters=[FilterSpec("probe", {"request_headers": "authority_local"}, wasm_file=PROBE_WASM)],
                       upstreams={"upstream": upstream.port}, http2_listener=True)
    g = gateways(host, spec)
    options = [("grpc.default_authority", "h2.example.com:9443")]
    with grpc.insecure_channel(g.h2_address, options=options) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary("/tollgate.test.Probe/Call")(b"", timeout=10)
    if kong_differs(host, "grpc-local-response-is-http"):
        return
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.UNKNOWN, "h2.example.com:9443")
