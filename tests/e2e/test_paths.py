"""Paths end to end (issue 17, part 1): the rules match the normalised path, on every host.

The chain is jwt-auth (bypass on /healthz, audience `llm` required on /v1/chat) then rate-limit
(2 requests a minute on /v1/), in front of the demo upstream, which echoes the path it received
(`"path"`, still percent-encoded). Requests are written on a raw socket, so that the tricky
targets reach the gateway byte for byte.

Each test runs twice per host:
- `raw`: the gateway forwards the request target as received (Envoy without path normalisation,
  nginx's `proxy_pass` of the raw target): the filters alone must close the bypasses; Envoy also
  forwards the `:path` the filters rewrote;
- `shipped`: the shipped configurations' path handling (the lab's `normalize_paths`: Envoy's
  `normalize_path`, `merge_slashes` and escaped slashes refused; nginx proxying its `$uri`): the
  upstream must receive exactly the path the rules matched.

The table is the unit tests' (plugins/common/src/path.rs) with the answers a client sees.
"""
from __future__ import annotations

import time

import jwt as pyjwt
import pytest

from lab import FilterSpec, GatewaySpec, kong_differs
from raw_http import exchange, json_body, request

SECRET = "paths-e2e-secret-0123456789abcdef0123456789"
ISSUER = "https://issuer.paths.e2e"
JWT = {
    "providers": {"main": {"issuer": ISSUER, "audiences": ["api"], "hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}},
    "rules": [
        {"match": {"prefix": "/healthz"}, "bypass": True},
        {"match": {"prefix": "/v1/chat"}, "audiences": ["llm"]},
    ],
}


# PUT requests under /v1/ are limited to 2 a day (test_rate_limit_rules_match_every_spelling;
# a minute's window could roll over mid-test);
# the rest of /v1/ gets a limit the tests never reach.
RATE_LIMIT = {"namespace": "paths", "rules": [
    {"name": "put", "match": {"prefix": "/v1/", "methods": ["PUT"]},
     "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]},
    {"name": "v1", "match": {"prefix": "/v1/"}, "limits": [{"algorithm": "fixed_window", "requests": 10000, "per": "minute"}]},
]}


# Hosts that are nginx (ours on glibc and musl, Kong's module): raw mode proxies the target as received.
NGINX_FAMILY = ("nginx", "nginx-musl", "kong")


def token(*audiences: str) -> str:
    now = int(time.time())
    return pyjwt.encode({"iss": ISSUER, "aud": ["api", *audiences], "sub": "alice", "iat": now, "exp": now + 600},
                        SECRET, algorithm="HS256")


LLM = token("llm")
NO_LLM = token()


def send(gateway, target: bytes, bearer: str | None = None, method: bytes = b"GET") -> tuple[int, dict | None]:
    """One request with `target` as is in the request line; the status and the JSON body (the
    upstream's echo, or a filter's error), if any."""
    fields = [(b"Host", b"gw.test")]
    if bearer:
        fields.append((b"Authorization", b"Bearer " + bearer.encode()))
    status, _, body = exchange(gateway.url, request(target, fields, method))
    return status, json_body(body)


REFUSED = 400
# (target, the path the upstream receives, or REFUSED), with a token that every rule accepts.
TABLE: list[tuple[bytes, str | int]] = [
    (b"/v1/chat/completions", "/v1/chat/completions"),
    (b"/healthz/../v1/chat/completions", "/v1/chat/completions"),
    (b"/v1/./chat/completions", "/v1/chat/completions"),
    (b"//v1/chat/completions", "/v1/chat/completions"),
    (b"/v1//chat///completions", "/v1/chat/completions"),
    (b"/healthz/%2e%2e/v1/chat", "/v1/chat"),
    (b"/healthz/%2E./v1/chat", "/v1/chat"),
    (b"/v1/%2e/chat", "/v1/chat"),
    (b"/v1/ch%61t?x=%2F", "/v1/chat"),
    (b"/v1/chat%7e", "/v1/chat~"),
    (b"/v1/a%3fb", "/v1/a%3Fb"),
    (b"/v1/a%20b", "/v1/a%20b"),
    (b"/a/b/..", "/a/"),
    (b"/a/b/.", "/a/b/"),
    (b"/a//../b", "/b"),
    (b"/caf%C3%A9", "/caf%C3%A9"),
    (b"/caf%c3%a9", "/caf%C3%A9"),
    (b"http://gw.test/healthz/../v1/chat", "/v1/chat"),
    (b"/..", REFUSED),
    (b"/v1/../../etc/passwd", REFUSED),
    (b"/%2e%2e/x", REFUSED),
    (b"/healthz%2F..%2Fv1", REFUSED),
    (b"/v1%2fchat", REFUSED),
    (b"/v1%5Cchat", REFUSED),
    (b"/healthz\\..\\v1", REFUSED),
    (b"/v1/chat%00", REFUSED),
    (b"/healthz;/../v1", REFUSED),
    (b"/public/..;/admin", REFUSED),
    (b"/admin%3Bx/secret", REFUSED),
    (b"/%c0%ae%c0%ae/v1", REFUSED),
    (b"/%C3", REFUSED),
    (b"/%zz", REFUSED),
    (b"/a#b", REFUSED),
    (b"/a\x7fb", REFUSED),
    (b"/caf\xc3\xa9", REFUSED),
]
# Where Envoy's own normalisation (shipped mode), which runs before the filters, decides first:
# it merges slashes after removing dot segments, drops a `..` above the root, turns `\` into `/`
# and reads `..;` as `..` (as Tomcat does). The upstream still receives the path the rules matched.
ENVOY_SHIPPED = {
    b"/a//../b": "/a/b",
    b"/..": "/",
    b"/v1/../../etc/passwd": "/etc/passwd",
    b"/%2e%2e/x": "/x",
    b"/healthz\\..\\v1": "/v1",
    b"/healthz;/../v1": "/v1",
    b"/public/..;/admin": "/admin",
}


# Kong's module gives the filters nginx's decoded, normalised $uri as `:path` (path-is-uri): a
# percent-encoded space or UTF-8 byte arrives decoded and is refused; an escaped slash, a `;`
# segment or a `#` is resolved by nginx before the filters see it, so they judge the path that the
# shipped configurations proxy (in raw mode the upstream gets the target as received).
KONG_URI = {
    b"/v1/a%20b": REFUSED,
    b"/caf%C3%A9": REFUSED,
    b"/caf%c3%a9": REFUSED,
    b"/healthz%2F..%2Fv1": "/v1",
    b"/v1%2fchat": "/v1/chat",
    b"/healthz;/../v1": "/v1",
    b"/a#b": "/a",
}


def expected(host, mode: str, target: bytes) -> str | int:
    want = dict(TABLE)[target]
    if host.name == "envoy" and mode == "shipped":
        return ENVOY_SHIPPED.get(target, want)
    if kong_differs(host, "path-is-uri"):
        return KONG_URI.get(target, want)
    return want


@pytest.fixture(scope="module", params=["raw", "shipped"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def g(host, upstream, mode):
    """One gateway per host and mode, for every test of the module."""
    spec = GatewaySpec(filters=[FilterSpec("jwt-auth", JWT), FilterSpec("rate-limit", RATE_LIMIT)],
                       upstreams={"upstream": upstream.port}, normalize_paths=mode == "shipped")
    gateway = host.start(spec)
    yield gateway
    gateway.stop()


def test_the_bypasses_of_the_issue_are_closed(g, host, mode):
    # jwt-auth's bypass on /healthz must not cover what the upstream sees as /v1/...
    for target in (b"/healthz/../v1/chat/completions", b"/healthz/%2e%2e/v1/chat/completions",
                   b"/healthz/./../v1/chat/completions"):
        assert send(g, target, method=b"POST")[0] == 401, target
    # Prefixes are segment-aware: /healthz is not /healthzX; it still covers /healthz/...
    assert send(g, b"/healthzX")[0] == 401
    assert send(g, b"/healthz")[0] == 200
    assert send(g, b"/healthz/live")[0] == 200
    # The audience rule on /v1/chat holds whatever the spelling.
    for target in (b"/v1/./chat/completions", b"/v1/chat/../chat/completions", b"/v1/%63hat/completions",
                   b"//v1/chat/completions"):
        assert send(g, target, NO_LLM)[0] == 403, target
    # Path parameters and escaped slashes cannot be used to hide a segment (Envoy's own
    # normalisation, shipped, reads `..;` as `..`: then the token is missing).
    semicolon = 401 if host.name == "envoy" and mode == "shipped" else 400
    assert send(g, b"/healthz/..;/v1/chat/completions")[0] == semicolon
    # (Kong: nginx decodes and resolves it to /v1/chat/completions first, which needs the token.)
    escaped = 401 if kong_differs(host, "path-is-uri") else 400
    assert send(g, b"/healthz%2F..%2Fv1%2Fchat%2Fcompletions")[0] == escaped


def test_rate_limit_rules_match_every_spelling(g):
    targets = (b"//v1/chat/completions", b"/v1/./models", b"/v1//models")
    statuses = [send(g, t, LLM, method=b"PUT")[0] for t in targets]
    assert statuses == [200, 200, 429]


def test_the_tricky_paths_table(g, host, mode):
    failures = []
    for target, _ in TABLE:
        want = expected(host, mode, target)
        status, body = send(g, target, LLM)
        if want == REFUSED:
            if status != 400:
                failures.append((target, status, body))
            continue
        # The demo upstream echoes the path it received.
        got = body.get("path") if body else None
        # nginx in raw mode forwards the target as received (the host does not apply `:path`
        # writes): the shipped nginx configurations proxy $uri instead (see the README).
        if status != 200 or (not (host.name in NGINX_FAMILY and mode == "raw") and got != want):
            failures.append((target, status, got, want))
    assert not failures, failures


def test_a_64_kib_path(g, host, mode):
    filler = b"a/../" * 13_000  # 65 000 bytes of segments that cancel out
    assert send(g, b"/v1/chat/" + filler + b"completions")[0] == 401
    if not (host.name in NGINX_FAMILY and mode == "raw"):  # there the upstream gets all 65 000 bytes
        status, body = send(g, b"/healthz/" + filler + b"x", NO_LLM)
        assert (status, body and body.get("path")) == (200, "/healthz/x")
    climbing = b"/.." * 22_000
    status = send(g, climbing)[0]
    # Envoy's own normalisation (shipped) drops `..` above the root: then the path is `/`,
    # which needs a token.
    assert status == (401 if host.name == "envoy" and mode == "shipped" else 400)


def test_ignore_case_rules_match_every_case(host, upstream, gateways):
    """`ignore_case` (Envoy's StringMatcher option) guards an upstream that reads paths
    case-insensitively; rules without it keep RFC 3986's case-sensitive paths."""
    jwt = dict(JWT, rules=[{"match": {"prefix": "/v1/admin", "ignore_case": True}, "audiences": ["admin"]},
                           {"match": {"prefix": "/v1/ops"}, "audiences": ["admin"]},
                           {"match": {"prefix": "/"}, "bypass": True}])
    limit = {"namespace": "case", "rules": [{"name": "models", "match": {"prefix": "/v1/models", "ignore_case": True},
                                        "limits": [{"algorithm": "fixed_window", "requests": 1, "per": "day"}]}]}
    g = gateways(host, GatewaySpec(filters=[FilterSpec("jwt-auth", jwt), FilterSpec("rate-limit", limit)],
                                   upstreams={"upstream": upstream.port}))
    for target in (b"/v1/admin/x", b"/V1/ADMIN/x", b"/v1/Admin", b"/V1/admin/../ADMIN/x"):
        assert send(g, target, NO_LLM)[0] == 403, target
    # Case-sensitive by default: /V1/OPS is not /v1/ops (the bypass rule takes it).
    assert send(g, b"/v1/ops/x", NO_LLM)[0] == 403
    assert send(g, b"/V1/OPS/x", NO_LLM)[0] == 200
    assert [send(g, t, NO_LLM)[0] for t in (b"/v1/models", b"/V1/MODELS", b"/v1/Models/x")] == [200, 429, 429]
