"""No client copy of a header jwt-auth writes reaches an upstream under a name that the upstream
reads as that header (README, "What a filter reads"; plugins/jwt-auth/README.md).

The upstream is Python's wsgiref, which reads `x_jwt_sub`, `X-Jwt_Sub` and `x-jwt-sub` alike as
`HTTP_X_JWT_SUB` (PHP's `$_SERVER` also reads `.` as `_`). Three ways a host can treat names with
`_`: its default (Envoy forwards them, nginx drops them), forwarded (nginx
`underscores_in_headers on`), refused (Envoy's `headers_with_underscores_action: REJECT_REQUEST`,
as envoy/*.yaml ship). In every one, the bypassed request carries no claim header and the
authenticated one carries exactly the verified value.
"""
from __future__ import annotations

import json
import time

import jwt as pyjwt
import pytest

from harness import PROBE_WASM, FilterSpec, GatewaySpec, kong_differs
from raw_http import exchange, json_body, request
from tokens import ISSUER
from wsgi_upstream import WsgiUpstream

SECRET = "aliases-e2e-secret-0123456789abcdef"
JWT = {
    "providers": {"main": {
        "issuer": ISSUER, "hmac_secrets": [{"alg": "HS256", "secret": SECRET}],
        "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}], "forward_payload_header": "x-jwt-payload",
    }},
    "rules": [{"match": {"prefix": "/public"}, "bypass": True}],
}
SPELLINGS = [b"x_jwt_sub", b"X_JWT_SUB", b"x-jwt_sub", b"X_Jwt-Sub", b"x.jwt.sub", b"X.Jwt-Sub", b"x-jwt.sub"]


def token(sub: str) -> str:
    now = int(time.time())
    return pyjwt.encode({"iss": ISSUER, "sub": sub, "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")


@pytest.fixture(scope="module")
def wsgi():
    u = WsgiUpstream()
    yield u
    u.stop()


@pytest.fixture(scope="module", params=["default", "forwarded", "refused"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def g(host, wsgi, mode):
    underscores = {"default": None, "forwarded": True, "refused": False}[mode]
    gateway = host.start(GatewaySpec(filters=[FilterSpec("jwt-auth", JWT)], upstreams={"upstream": wsgi.port},
                                     underscores_in_headers=underscores))
    yield gateway
    gateway.stop()


def send(g, target: bytes, fields: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    status, _, body = exchange(g.url, request(target, [(b"Host", b"gw.test"), *fields]))
    parsed = json_body(body) or {}
    return status, parsed.get("environ", parsed)


def refused_by_the_proxy(host, mode: str, name: bytes) -> bool:
    """Envoy configured to refuse names with `_` answers 400 before any filter."""
    return host.name == "envoy" and mode == "refused" and b"_" in name


def removal_is_seen_by_kong(host, mode: str) -> bool:
    return not (mode == "forwarded" and kong_differs(host, "hidden-headers-forwarded"))


@pytest.mark.parametrize("name", SPELLINGS)
def test_a_bypassed_request_carries_no_claim_header(g, host, mode, name):
    if not removal_is_seen_by_kong(host, mode):
        pytest.skip("Kong's module forwards the copies a filter removes (hidden-headers-forwarded)")
    status, environ = send(g, b"/public/x", [(name, b"admin"), (name.replace(b"sub", b"payload"), b"e30")])
    if refused_by_the_proxy(host, mode, name):
        assert status == 400
        return
    assert status == 200, environ
    assert "HTTP_X_JWT_SUB" not in environ, (name, environ)
    assert "HTTP_X_JWT_PAYLOAD" not in environ, (name, environ)


@pytest.mark.parametrize("name", SPELLINGS)
def test_an_authenticated_request_carries_only_the_verified_claim(g, host, mode, name):
    if not removal_is_seen_by_kong(host, mode):
        pytest.skip("Kong's module forwards the copies a filter removes (hidden-headers-forwarded)")
    bearer = b"Bearer " + token("bob").encode()
    # The forged copy before and after the token's header.
    status, environ = send(g, b"/private", [(name, b"admin"), (b"Authorization", bearer), (name, b"root")])
    if refused_by_the_proxy(host, mode, name):
        assert status == 400
        return
    assert status == 200, environ
    assert environ.get("HTTP_X_JWT_SUB") == "bob", (name, environ)
    payload = json.loads(pyjwt.utils.base64url_decode(environ["HTTP_X_JWT_PAYLOAD"]))
    assert payload["sub"] == "bob"
    if not kong_differs(host, "hidden-headers-forwarded"):  # Kong forwards the token jwt-auth removed
        assert "HTTP_AUTHORIZATION" not in environ


@pytest.mark.parametrize("forwarded", [False, True])
def test_the_host_vouches_for_plain_names_only_when_they_are(host, gateways, upstream, forwarded):
    """jwt-auth skips listing the names when the host answers `tollgate.request.plain_header_names`
    with `1` (Tollgate's nginx module); so `1` must never be given for a request that carries a name
    with `_` or `.`, however nginx is configured. Envoy and Kong's module have no such property."""
    spec = GatewaySpec(filters=[FilterSpec("probe", {"request_headers": "plain_header_names"}, wasm_file=PROBE_WASM)],
                       upstreams={"upstream": upstream.port}, underscores_in_headers=forwarded or None)
    g = gateways(host, spec)
    cases = [([(b"X-Plain-1", b"a")], "1")] + [([(b"X-Plain-1", b"a"), (name, b"admin")], "0") for name in SPELLINGS]
    for fields, plain in cases:
        status, _, body = exchange(g.url, request(b"/x", [(b"Host", b"gw.test"), *fields]))
        if host.name != "nginx" and host.name != "nginx-musl":
            assert status in (200, 400), body[:200]
            if status == 200:
                assert json.loads(body) is None, (host.name, body)
            continue
        assert status == 200, body[:200]
        # nginx drops names with `_` unless `underscores_in_headers on`, and names with `.` unless
        # `ignore_invalid_headers off`: what it drops is not there to vouch for.
        dropped = not (forwarded and b"." not in fields[-1][0])
        want = "1" if plain == "1" or dropped else "0"
        assert json.loads(body) == want, (forwarded, fields, body)
