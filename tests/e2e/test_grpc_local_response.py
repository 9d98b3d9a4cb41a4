"""Local responses to gRPC requests, through a real gRPC client (grpcio) over cleartext HTTP/2,
on every host.

A filter that answers a request itself (`proxy_send_local_response`) on a gRPC request must give
the client a gRPC status, as Envoy does (`Http::Utility::sendLocalReply`, source/common/http/
utility.cc): a trailers-only response, `:status 200`, `content-type: application/grpc`,
`grpc-status` (the filter's gRPC status when it gave one from 0 to 16, else its HTTP status
mapped by `Grpc::Utility::httpToGrpcStatus`), `grpc-message` (the body, percent-encoded).

- proxy-wasm-rust-sdk's `send_grpc_response(Aborted, Some(msg), [])`, as its `grpc_auth_random`
  example aborts calls (the probe's `grpc_abort`): the client sees ABORTED and the message,
  with the non-ASCII character and the `%` the message carries.
- Tollgate's own refusals: jwt-auth without a token on a gRPC request is UNAUTHENTICATED (its
  HTTP 401 mapped), with jwt-auth's body as the details.
- The same filters on a plain HTTP request keep answering HTTP (status, body, content-type); a
  gRPC content type over HTTP/1.1 gets the gRPC fields in the response headers.

Before this, the nginx host ignored the gRPC status: the client saw UNKNOWN ("Stream removed",
an HTTP 200 text/plain answer) instead of ABORTED, and for jwt-auth its library's mapping of the
HTTP 401 without the filter's message. Kong's ngx_wasm_module answers HTTP
(`grpc-local-response-is-http`), and a gRPC status aborts its worker
(`grpc-status-aborts-the-worker`).
"""
from __future__ import annotations

import grpc
import pytest
import requests

import tokens
from lab import PROBE_WASM, FilterSpec, GatewaySpec, kong_differs, wait_until

# The probe's GRPC_ABORT_MESSAGE (tests/filters/probe/src/lib.rs).
ABORT_MESSAGE = "probe aborted the call: 100% sûr"


def call(gateway, method: str = "/tollgate.test.Probe/Call", metadata=None) -> grpc.RpcError | bytes:
    """One unary call with raw bytes (no protobuf) to the gateway's HTTP/2 listener: the reply's
    bytes, or the RpcError the client raised."""
    with grpc.insecure_channel(gateway.h2_address) as channel:
        stub = channel.unary_unary(method)
        try:
            return stub(b"\x08\x01", timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            return e


def grpc_spec(filters, upstream) -> GatewaySpec:
    return GatewaySpec(filters=filters, upstreams={"upstream": upstream.port}, http2_listener=True)


def test_send_grpc_response_gives_the_client_its_status_and_message(host, gateways, upstream):
    g = gateways(host, grpc_spec([FilterSpec("probe", {"request_headers": "grpc_abort"}, wasm_file=PROBE_WASM)],
                                 upstream))
    e = call(g)
    assert isinstance(e, grpc.RpcError), e
    if kong_differs(host, "grpc-status-aborts-the-worker"):
        # The worker died on the call: the connection closed under the client.
        assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
        wait_until(lambda: "exited on signal 6" in g.log.read_text(errors="replace"), 10)
        return
    assert (e.code(), e.details()) == (grpc.StatusCode.ABORTED, ABORT_MESSAGE)
    # A plain HTTP request to the same filter keeps today's HTTP answer: the SDK's status (200),
    # the message as the body, text/plain.
    r = requests.get(g.url + "/plain", timeout=10)
    assert (r.status_code, r.content.decode(), r.headers.get("content-type")) == (200, ABORT_MESSAGE, "text/plain")
    assert "grpc-status" not in r.headers


def test_a_grpc_content_type_over_http1_gets_the_grpc_fields(host, gateways, upstream):
    """No trailers-only form exists over HTTP/1.1: the fields come as response headers, with an
    empty body (`content-length: 0`, as Envoy's HTTP/1 codec ends a headers-only response)."""
    g = gateways(host, grpc_spec([FilterSpec("probe", {"request_headers": "grpc_abort"}, wasm_file=PROBE_WASM)],
                                 upstream))
    send = lambda: requests.post(g.url + "/tollgate.test.Probe/Call", data=b"\x00\x00\x00\x00\x00",  # noqa: E731
                                 headers={"content-type": "application/grpc+proto", "te": "trailers"}, timeout=10)
    if kong_differs(host, "grpc-status-aborts-the-worker"):
        with pytest.raises(requests.ConnectionError):
            send()
        return
    r = send()
    assert r.status_code == 200
    assert r.headers.get("content-type") == "application/grpc"
    assert r.headers.get("grpc-status") == "10"
    assert r.headers.get("grpc-message") == "probe aborted the call: 100%25 s%C3%BBr"
    assert r.content == b"" and r.headers.get("content-length") == "0"


@pytest.fixture(scope="module")
def keys():
    return tokens.Keys()


def test_jwt_auth_refusing_a_grpc_call_is_unauthenticated(host, gateways, upstream, keys):
    config = {
        "providers": {"main": {"issuer": tokens.ISSUER, "audiences": ["api"], "local_jwks": keys.jwks(),
                               "from_headers": [{"name": "authorization", "value_prefix": "Bearer "}]}},
        "rules": [{"match": {"prefix": "/"}, "providers": ["main"]}],
    }
    g = gateways(host, grpc_spec([FilterSpec("jwt-auth", config)], upstream))
    # The HTTP answer to the same refusal: jwt-auth's 401 and its body.
    plain = requests.post(g.url + "/tollgate.test.Probe/Call", data=b"x", timeout=10)
    assert plain.status_code == 401, plain.text
    e = call(g)
    assert isinstance(e, grpc.RpcError), e
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, (e.code(), e.details())
    if kong_differs(host, "grpc-local-response-is-http"):
        # grpcio maps the HTTP 401 itself; the filter's message does not reach it.
        assert e.details() != plain.content.decode()
        return
    assert e.details() == plain.content.decode()
    # jwt-auth's own fields stay beside the gRPC ones (Envoy keeps a local reply's extra fields).
    assert any(k == "www-authenticate" for k, _ in e.initial_metadata() or ()) or \
        any(k == "www-authenticate" for k, _ in e.trailing_metadata() or ()), \
        (e.initial_metadata(), e.trailing_metadata())
    # With a valid token the call reaches the upstream, which is no gRPC server: what the client
    # gets there is the upstream's business, only that it is not the filter's refusal.
    token = keys.token(aud="api")
    e = call(g, metadata=[("authorization", f"Bearer {token}")])
    assert not (isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAUTHENTICATED), e
