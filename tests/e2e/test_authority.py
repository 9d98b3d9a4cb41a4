"""The host a rule matches is the one the proxy routes on and forwards, in one canonical form
(README, "What a filter reads"; plugins/common/src/authority.rs), on every host.

An absolute-form target names the host (RFC 9112 section 3.2.2): nginx selects the server with it
and forwards it as `$host`, Envoy makes it `:authority`; the Host header beside it is ignored, so
the filters must ignore it too. Spellings that name one host (case, a port, the trailing dot of a
fully qualified name, the forms of an IPv6 address) are one host to every rule; spellings that
the URL Standard reads as another address (`127.1`) or that name no host are refused with 400.
"""
from __future__ import annotations

import pytest

from lab import FilterSpec, GatewaySpec, kong_differs
from raw_http import exchange, json_body, request
from tokens import ISSUER


@pytest.fixture(autouse=True)
def _host_rules_read_the_routed_host(host):
    if kong_differs(host, "authority-is-server-name"):
        pytest.skip("Kong's module gives the server's name as :authority: host rules cannot work there")

SECRET = "authority-e2e-secret-0123456789abcdef"
JWT = {
    "providers": {"main": {"issuer": ISSUER, "hmac_secrets": [{"alg": "HS256", "secret": SECRET}]}},
    # status.example.com (and the IPv6 loopback) need no token; everything else does.
    "rules": [{"match": {"hosts": ["status.example.com", "[::1]"]}, "bypass": True}],
}
# api.example.com gets 3 requests a day in all, whatever its spelling; under /keyed, one request a
# day per host.
RATE_LIMIT = {"namespace": "authority", "rules": [
    {"name": "api", "match": {"hosts": ["api.example.com"]},
     "limits": [{"algorithm": "fixed_window", "requests": 3, "per": "day"}]},
    {"name": "keyed", "match": {"prefix": "/keyed"}, "key": ["host"],
     "limits": [{"algorithm": "fixed_window", "requests": 1, "per": "day"}]},
]}


def get(g, host: bytes | None, target: bytes = b"/x") -> tuple[int, dict | None]:
    fields = [(b"Host", host)] if host is not None else []
    status, _, body = exchange(g.url, request(target, fields))
    return status, json_body(body)


@pytest.fixture(scope="module")
def jwt_gateway(host, upstream):
    g = host.start(GatewaySpec(filters=[FilterSpec("jwt-auth", JWT)], upstreams={"upstream": upstream.port}))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def limit_gateway(host, upstream):
    """One per host and module: each test uses hosts or paths of its own, so the counts of one
    test never reach another's."""
    g = host.start(GatewaySpec(filters=[FilterSpec("rate-limit", RATE_LIMIT)], upstreams={"upstream": upstream.port}))
    yield g
    g.stop()


def test_an_absolute_form_target_decides_the_host(jwt_gateway):
    g = jwt_gateway
    assert get(g, b"status.example.com")[0] == 200
    assert get(g, b"api.example.com")[0] == 401
    # The issue's request: routed to api.example.com, so no bypass, whatever Host says.
    status, body = get(g, b"status.example.com", b"http://api.example.com/admin/x")
    assert status == 401, body
    # And the other way round: routed to status.example.com.
    assert get(g, b"api.example.com", b"http://status.example.com/admin/x")[0] == 200


@pytest.mark.parametrize("spelling", [b"STATUS.Example.COM", b"status.example.com.", b"status.example.com:8080",
                                      b"Status.Example.Com.:443", b"[::1]", b"[0:0:0:0:0:0:0:1]:8443", b"[0::1]"])
def test_every_spelling_of_a_host_matches_its_rule(jwt_gateway, spelling):
    assert get(jwt_gateway, spelling)[0] == 200, spelling


def test_a_host_scoped_limit_counts_every_spelling(limit_gateway):
    g = limit_gateway
    admitted = [get(g, h)[0] for h in (b"api.example.com", b"API.EXAMPLE.COM.", b"api.example.com:80")]
    assert admitted == [200, 200, 200]
    spelt = [b"Api.Example.Com.:8080", b"api.example.com", b"aPI.example.com:"]
    assert [get(g, h)[0] for h in spelt] == [429, 429, 429]
    # An absolute-form target for api.example.com is limited too, whatever Host says.
    status, _ = get(g, b"other.example.com", b"http://api.example.com/x")
    assert status == 429
    # Another host is not.
    assert get(g, b"other.example.com")[0] == 200


def test_a_host_key_is_one_bucket_per_host(limit_gateway):
    g = limit_gateway
    assert get(g, b"a.example.com", b"/keyed")[0] == 200
    assert get(g, b"A.Example.COM.:443", b"/keyed")[0] == 429
    assert get(g, b"a.example.com.", b"/keyed/x")[0] == 429
    assert get(g, b"b.example.com", b"/keyed")[0] == 200


# Hosts with no canonical form: numbers the URL Standard reads as 127.0.0.1, escapes, user
# information, bad ports and brackets, characters no host name has. Some are refused by the proxy
# itself before any filter; either way the answer is 400 and the upstream sees nothing.
INVALID = [b"127.1", b"0x7f.0.0.1", b"2130706433", b"127.000.0.1", b"%61pi.example.com", b"user@api.example.com",
           b"api.example.com:99999", b"api.example.com:8o", b"[::1", b"[fe80::1%25eth0]", b"a..example.com",
           b"api.example.com..", b"api example.com", b"api.ex\xc3\xa4mple.com"]


@pytest.mark.parametrize("bad", INVALID)
def test_a_host_without_canonical_form_is_refused(limit_gateway, bad):
    status, body = get(limit_gateway, bad)
    assert status == 400, (bad, status, body)
    if body is not None and "error" in body:
        assert body["error"] == "invalid_authority", body


def test_a_request_without_host_is_refused_when_a_rule_reads_it(limit_gateway):
    # HTTP/1.1 without Host: the proxies refuse it themselves (RFC 9112 section 3.2).
    assert get(limit_gateway, None)[0] == 400
