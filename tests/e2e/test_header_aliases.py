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

from lab import PROBE_WASM, WASM_DIR, FilterSpec, GatewaySpec, RawNginx, free_port, kong_differs, nginx_quote,\
    selected_nginx_hosts
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
def test_the_host_vouches_for_plain_names_only_when_nginx_drops_the_others(host, gateways, upstream, forwarded):
    """jwt-auth lists no request's names when the host answers `tollgate.http.plain_header_names`
    with `1` (Tollgate's nginx module, when nginx drops every name with `_` or `.`); so `1` must
    never be given where such a name reaches the filters, and a name the answer vouches for never
    does. Envoy and Kong's module have no such property."""
    spec = GatewaySpec(filters=[FilterSpec("probe", {"request_headers": "plain_header_names"}, wasm_file=PROBE_WASM)],
                       upstreams={"upstream": upstream.port}, underscores_in_headers=forwarded or None)
    g = gateways(host, spec)
    nginx = host.name in ("nginx", "nginx-musl")
    for fields in [[(b"X-Plain-1", b"a")]] + [[(b"X-Plain-1", b"a"), (name, b"admin")] for name in SPELLINGS]:
        status, _, body = exchange(g.url, request(b"/x", [(b"Host", b"gw.test"), *fields]))
        if not nginx:
            assert status in (200, 400), body[:200]
            if status == 200:
                assert json.loads(body) is None, (host.name, body)
            continue
        assert status == 200, body[:200]
        # `underscores_in_headers on` lets names with `_` through: then no vouching.
        assert json.loads(body) == ("0" if forwarded else "1"), (forwarded, fields, body)


@pytest.mark.parametrize("build", selected_nginx_hosts())
def test_a_default_server_that_forwards_underscores_makes_every_server_look(tmp_path, wsgi, build):
    """nginx reads the headers before Host with the settings of the address's default server (or
    the TLS SNI server), and those after with the server the Host selects (ngx_http_request.c
    takes the server's settings again after each header), so `underscores_in_headers on` in the
    default server lets an `x_jwt_sub` sent before Host into a server that keeps it off. The module vouches for plain
    names only when every server keeps the defaults; here it must not, and jwt-auth, guarding
    the Host-selected server, removes the spelling itself."""
    port = free_port()
    jwt = nginx_quote(json.dumps(JWT))
    lenient = f"""    server {{
        listen 127.0.0.1:{port} default_server;
        underscores_in_headers on;
        location / {{ return 404; }}
    }}
    upstream wsgi {{ server 127.0.0.1:{wsgi.port}; }}"""
    n = RawNginx(tmp_path, f"    module jwt_auth {WASM_DIR / 'tollgate_jwt_auth.wasm'};", f"""
        server_name api.test;
        location / {{ proxy_wasm jwt_auth {jwt}; proxy_pass http://wsgi; }}""", host=build, extra_http=lenient,
                 port=port)
    try:
        for name in (b"x_jwt_sub", b"X_Jwt_Sub"):
            # Before Host, nginx reads the name with the default server's settings and keeps it
            # (without jwt-auth the upstream sees HTTP_X_JWT_SUB: admin); after Host, with
            # api.test's, and drops it.
            for fields in ([(name, b"admin"), (b"Host", b"api.test")], [(b"Host", b"api.test"), (name, b"admin")]):
                status, _, body = exchange(f"http://127.0.0.1:{port}", request(b"/public/x", fields))
                environ = (json_body(body) or {}).get("environ", {})
                assert status == 200, body[:300]
                assert "HTTP_X_JWT_SUB" not in environ, (fields, environ)
    finally:
        n.stop()
