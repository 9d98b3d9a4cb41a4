"""sticky-upstream end to end: real Envoy, three demo upstreams that name themselves
(`x-upstream-name`), one cluster each, routed with `cluster_header` on the filter's header.

Cookies are also minted here with Python's `hmac` (the format is in
plugins/sticky-upstream/src/cookie_value.rs), to send expired, unknown-upstream and draining ones.
Traffic is bounded: about 2,000 requests in all, each with a 10 s timeout.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import math
import re
import time
import urllib.parse

import pytest

from lab import ROOT, DemoUpstream, EnvoyGateway, FilterSpec, GatewaySpec, free_port, kong_differs

SECRET = "e2e-sticky-secret-0123456789abcdef-xyz"
COOKIE = "tollgate_sticky"
ROUTE_HEADER = "x-tollgate-upstream"
MAX_AGE = 3600
METRIC = "tollgate_sticky_upstream_requests_total.outcome."


def mint(upstream: str, expiry: int, secret: str = SECRET, cookie_name: str = COOKIE) -> str:
    """A cookie value as the filter signs it: `<upstream>.<expiry>.<base64url(HMAC-SHA256)>`."""
    msg = b"tollgate-sticky-upstream/v1\0" + cookie_name.encode() + b"\0" + upstream.encode() + b"\0" + str(expiry).encode()
    tag = base64.urlsafe_b64encode(hmac.new(secret.encode(), msg, hashlib.sha256).digest()).rstrip(b"=").decode()
    return f"{upstream}.{expiry}.{tag}"


def verifies(value: str, secret: str = SECRET) -> bool:
    upstream, expiry, _ = value.rsplit(".", 2)
    return hmac.compare_digest(mint(upstream, int(expiry), secret), value)


class Response:
    def __init__(self, r: http.client.HTTPResponse):
        self.status = r.status
        self.upstream = r.getheader("x-upstream-name")
        self.set_cookies = r.headers.get_all("set-cookie") or []
        self.body = r.read()

    def seen_headers(self) -> dict:
        """The request headers as the upstream received them (demo upstream's JSON echo)."""
        assert self.status == 200, (self.status, self.body[:300])
        return json.loads(self.body)["headers"]

    def sticky_cookie(self) -> str | None:
        """The value of the filter's Set-Cookie, if exactly one was set (None if none)."""
        ours = [c for c in self.set_cookies if c.startswith(COOKIE + "=")]
        assert len(ours) <= 1, self.set_cookies
        return ours[0].split(";", 1)[0].split("=", 1)[1] if ours else None


class Client:
    """One keep-alive HTTP/1.1 connection; headers are a list so that a name may repeat, and no
    cookie is ever stored or sent unless given."""

    def __init__(self, url: str):
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)

    def get(self, path: str = "/anything", headers: list[tuple[str, str]] = (), cookie: str | None = None) -> Response:
        self.conn.putrequest("GET", path, skip_accept_encoding=True)
        for k, v in headers:
            self.conn.putheader(k, v)
        if cookie is not None:
            self.conn.putheader("cookie", cookie)
        self.conn.endheaders()
        return Response(self.conn.getresponse())

    def close(self) -> None:
        self.conn.close()


def sticky_config(weights: dict[str, int], **extra) -> dict:
    return {
        "upstreams": [{"name": n, "weight": w} for n, w in weights.items()],
        "cookie": {"name": COOKIE, "path": "/", "domain": "tollgate.test", "max_age_seconds": MAX_AGE,
                   "http_only": True, "secure": True, "same_site": "Strict"},
        "secret": SECRET,
        "route_header": ROUTE_HEADER,
        "repin_statuses": [502, 503],
        **extra,
    }


def spec(upstreams: dict[str, DemoUpstream], config: dict, workers: int = 2) -> GatewaySpec:
    return GatewaySpec(filters=[FilterSpec("sticky-upstream", config)], upstreams={n: u.port for n, u in upstreams.items()},
                       workers=workers, route_header=ROUTE_HEADER)


def counters(host, gateway) -> dict[str, int]:
    """Counter values by result, summed over the stat names Envoy derives ({} on the kong host:
    no-stats, so the tests compare them only elsewhere)."""
    out: dict[str, int] = {}
    if kong_differs(host, "no-stats"):
        return out
    for k, v in gateway.stats("tollgate_sticky_upstream").items():
        if METRIC in k:
            result = k.split(METRIC, 1)[1]
            out[result] = out.get(result, 0) + v
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)}


WEIGHTS = {"blue": 6, "green": 3, "red": 1}


@pytest.fixture(scope="module")
def upstreams(workdir):
    started = {}
    try:
        for name in WEIGHTS:
            started[name] = DemoUpstream(name, workdir)
        yield started
    finally:
        for u in started.values():
            u.stop()


@pytest.fixture(scope="module")
def gateway(host, upstreams):
    g = host.start(spec(upstreams, sticky_config(WEIGHTS)))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def draining_gateway(host, upstreams):
    """red has weight 0: it takes no new client, so reaching it proves a steer (or a valid pin)."""
    g = host.start(spec(upstreams, sticky_config({"blue": 1, "green": 1, "red": 0})))
    yield g
    g.stop()


@pytest.fixture
def client(gateway):
    c = Client(gateway.url)
    yield c
    c.close()


def test_first_response_sets_the_cookie_with_its_attributes(client):
    now = int(time.time())
    r = client.get()
    assert r.status == 200 and r.upstream in WEIGHTS, (r.status, r.upstream)
    assert len(r.set_cookies) == 1, r.set_cookies
    pair, *attrs = [p.strip() for p in r.set_cookies[0].split(";")]
    name, value = pair.split("=", 1)
    assert name == COOKIE
    assert sorted(attrs) == sorted(["HttpOnly", "SameSite=Strict", "Secure", "Path=/", "Domain=tollgate.test", f"Max-Age={MAX_AGE}"])
    upstream, expiry, tag = value.rsplit(".", 2)
    assert upstream == r.upstream, "the cookie pins the upstream that served the request"
    assert now + MAX_AGE - 5 <= int(expiry) <= int(time.time()) + MAX_AGE + 1
    assert len(tag) == 43 and verifies(value)
    assert r.seen_headers()[ROUTE_HEADER] == [r.upstream]


def test_100_requests_with_the_cookie_reach_the_same_upstream(host, gateway, client):
    first = client.get()
    value = first.sticky_cookie()
    assert value
    before = counters(host, gateway)
    for _ in range(100):
        r = client.get(cookie=f"{COOKIE}={value}")
        assert (r.status, r.upstream, r.set_cookies) == (200, first.upstream, []), (r.status, r.upstream, r.set_cookies)
    # Every upstream can be pinned (the route follows the header for each cluster), also on a
    # new connection (the other worker, maybe).
    for name in WEIGHTS:
        other = Client(gateway.url)
        try:
            for _ in range(5):
                r = other.get(cookie=f"{COOKIE}={mint(name, int(time.time()) + MAX_AGE)}")
                assert (r.status, r.upstream, r.set_cookies) == (200, name, [])
        finally:
            other.close()
    if not kong_differs(host, "no-stats"):
        assert delta(before, counters(host, gateway)) == {"pinned": 115}


def test_spread_without_cookies_matches_the_weights(gateway):
    """1,000 requests without cookies, over 4 connections (both workers). Tolerance: every
    upstream's share within 4 standard deviations of its weight's share (60/30/10 %: 6.2, 5.8
    and 3.8 percentage points for a binomial count of 1,000; a correct filter misses one of
    them about once in 5,000 runs), and Pearson's chi-square under 18.42, the critical value for
    2 degrees of freedom at p = 0.0001. Weights off by 10 points (50/35/15 %) give a chi-square
    near 50. (A fixed 5-point bound failed a correct run: blue 549 of 1,000, 3.3 deviations.)"""
    clients = [Client(gateway.url) for _ in range(4)]
    counts = dict.fromkeys(WEIGHTS, 0)
    try:
        for i in range(1000):
            r = clients[i % 4].get()
            assert r.status == 200 and r.sticky_cookie(), (r.status, r.set_cookies)
            assert r.sticky_cookie().startswith(r.upstream + ".")
            counts[r.upstream] += 1
    finally:
        for c in clients:
            c.close()
    total = sum(WEIGHTS.values())
    chi2 = sum((counts[n] - 1000 * w / total) ** 2 / (1000 * w / total) for n, w in WEIGHTS.items())
    print(f"spread over 1000 requests: {counts}, chi-square {chi2:.2f}")
    for n, w in WEIGHTS.items():
        share = w / total
        assert abs(counts[n] / 1000 - share) <= 4 * math.sqrt(share * (1 - share) / 1000), counts
    assert chi2 < 18.42, (counts, chi2)


def test_tampered_expired_and_unknown_cookies_are_replaced(host, gateway, client):
    now = int(time.time())
    good = mint("green", now + MAX_AGE)
    flipped = good[:-5] + ("A" if good[-5] != "A" else "B") + good[-4:]
    cases = {
        "invalid_cookie": [
            flipped,                                      # a tag byte changed
            "red" + good[len("green"):],                  # another upstream, the same tag
            f"green.{now + MAX_AGE - 1}" + good[good.rfind("."):],  # another expiry, the same tag
            mint("green", now + MAX_AGE, secret="another-secret-0123456789abcdef-xyz"),
            mint("green", now + MAX_AGE, cookie_name="other_cookie"),
            "garbage",
            "",
            "\"" + good,
        ],
        "expired": [mint("green", now - 10), mint("green", now + 30 * 86400)],
        "unknown_upstream": [mint("purple", now + MAX_AGE), mint("green-old", now + 60)],
    }
    before = counters(host, gateway)
    for reason, values in cases.items():
        for value in values:
            r = client.get(cookie=f"a=1; {COOKIE}={value}; b=2")
            new = r.sticky_cookie()
            assert r.status == 200 and r.upstream in WEIGHTS, (reason, value, r.status)
            assert new and new != value and verifies(new), (reason, value, r.set_cookies)
            assert new.startswith(r.upstream + "."), (new, r.upstream)
            # The replacement works.
            again = client.get(cookie=f"{COOKIE}={new}")
            assert (again.upstream, again.set_cookies) == (r.upstream, [])
    if not kong_differs(host, "no-stats"):
        d = delta(before, counters(host, gateway))
        replaced = sum(len(v) for v in cases.values())
        assert d == {"invalid_cookie": 8, "expired": 2, "unknown_upstream": 2, "pinned": replaced}, d


def test_forged_cookies_and_client_route_headers_cannot_steer(host, draining_gateway):
    """red takes no new clients (weight 0); a pin to it needs a valid cookie."""
    c = Client(draining_gateway.url)
    try:
        now = int(time.time())
        valid_red = mint("red", now + MAX_AGE)
        r = c.get(cookie=f"{COOKIE}={valid_red}")
        assert (r.status, r.upstream, r.set_cookies) == (200, "red", []), "a valid cookie reaches a draining upstream"
        blue = mint("blue", now + MAX_AGE)
        forged = [
            "red" + blue[len("blue"):],                       # the tag of a blue cookie
            f"red.{now + MAX_AGE}." + "A" * 43,
            valid_red[:-1] + ("A" if valid_red[-1] != "A" else "B"),
        ]
        seen = set()
        for value in forged * 10:
            r = c.get(cookie=f"{COOKIE}={value}")
            assert r.status == 200 and r.upstream != "red" and r.sticky_cookie(), (value, r.upstream)
            seen.add(r.upstream)
        for _ in range(30):
            r = c.get(headers=[(ROUTE_HEADER, "red")])
            assert r.upstream != "red"
            assert r.seen_headers()[ROUTE_HEADER] == [r.upstream], "the client's copy is overwritten"
            seen.add(r.upstream)
        assert seen == {"blue", "green"}
        # Several copies of the header (and odd casing) are all replaced by one.
        r = c.get(headers=[(ROUTE_HEADER, "red"), ("X-Tollgate-Upstream", "red"), (ROUTE_HEADER, "green")], cookie=f"{COOKIE}={blue}")
        assert r.upstream == "blue"
        if kong_differs(host, "hidden-headers-forwarded"):
            # The first copy is replaced, the others hidden and forwarded after it: the route
            # ($http_ reads the first visible one) is the filter's, the upstream sees all.
            assert r.seen_headers()[ROUTE_HEADER] == ["blue", "red", "green"]
        else:
            assert r.seen_headers()[ROUTE_HEADER] == ["blue"]
    finally:
        c.close()


def test_cookie_header_parsing_in_envoy(gateway, client):
    value = mint("red", int(time.time()) + MAX_AGE)
    pinned_headers = [
        f"{COOKIE}={value}",
        f"a=1;{COOKIE}={value};b=2",
        f"  a=1 ;   {COOKIE}=\"{value}\"   ; b=\"x;y\"",
        f"{COOKIE}=broken; {COOKIE}={value}",
        "x=" + "y" * 60_000 + f"; {COOKIE}={value}",
        f"a=\xff\xfe; {COOKIE}={value}; \xe9=\xe9",  # not UTF-8 around it (obs-text)
    ]
    for h in pinned_headers:
        r = client.get(cookie=h)
        assert (r.status, r.upstream, r.set_cookies) == (200, "red", []), h[:100]
    # (Control characters never reach the filter: Envoy's codec refuses them with 400.)
    for h in [";;=;", "=", COOKIE, f"{COOKIE.upper()}={value}", "\xe9=\xe9;;\xff", f"{COOKIE}=\xe9{value}", "a" * 60_000]:
        r = client.get(cookie=h)
        assert r.status == 200 and r.sticky_cookie(), h[:100]
    assert gateway.alive()


def test_an_upstream_removed_from_the_configuration_leads_to_a_repin(host, upstreams, gateway, gateways):
    # A real cookie for red, from the full gateway.
    c = Client(gateway.url)
    try:
        for _ in range(300):
            r = c.get()
            if r.upstream == "red":
                break
        assert r.upstream == "red"
        red_cookie = r.sticky_cookie()
    finally:
        c.close()
    # The same secret, without red in the filter's configuration (the cluster still exists).
    without_red = gateways(host, spec(upstreams, sticky_config({"blue": 6, "green": 3})))
    before = counters(host, without_red)
    c = Client(without_red.url)
    try:
        r = c.get(cookie=f"{COOKIE}={red_cookie}")
        new = r.sticky_cookie()
        assert r.status == 200 and r.upstream in ("blue", "green"), (r.status, r.upstream)
        assert new and new.startswith(r.upstream + ".") and verifies(new)
        again = c.get(cookie=f"{COOKIE}={new}")
        assert (again.upstream, again.set_cookies) == (r.upstream, [])
    finally:
        c.close()
    if not kong_differs(host, "no-stats"):
        assert delta(before, counters(host, without_red)) == {"unknown_upstream": 1, "pinned": 1}
    # The full gateway still honours it.
    c = Client(gateway.url)
    try:
        assert c.get(cookie=f"{COOKIE}={red_cookie}").upstream == "red"
    finally:
        c.close()


def test_an_unreachable_upstream_leads_to_a_repin(host, workdir, upstreams, gateways):
    doomed = DemoUpstream("doomed", workdir)
    try:
        names = {"blue": upstreams["blue"], "green": upstreams["green"], "doomed": doomed}
        g = gateways(host, spec(names, sticky_config({"blue": 1, "green": 1, "doomed": 1})))
        c = Client(g.url)
        pinned = mint("doomed", int(time.time()) + MAX_AGE)
        r = c.get(cookie=f"{COOKIE}={pinned}")
        assert (r.status, r.upstream, r.set_cookies) == (200, "doomed", [])
        # An upstream's own 503 is an answer, not unreachability: no re-pin (on Kong, without
        # response.code_details, the filter cannot tell them apart and re-pins).
        r = c.get("/status/503", cookie=f"{COOKIE}={pinned}")
        if kong_differs(host, "no-code-details"):
            assert (r.status, r.upstream) == (503, "doomed") and r.sticky_cookie(), r.set_cookies
            assert r.sticky_cookie().split(".", 1)[0] in ("blue", "green")
        else:
            assert (r.status, r.upstream, r.set_cookies) == (503, "doomed", [])
        before = counters(host, g)
        doomed.stop()
        r = c.get(cookie=f"{COOKIE}={pinned}")
        assert r.status == 503 and r.upstream is None, (r.status, r.upstream, r.body[:200])
        if kong_differs(host, "error-page-skips-filters"):
            assert r.set_cookies == [], "the error_page location's 503 passes no filter: the pin stays"
            c.close()
            return
        new = r.sticky_cookie()
        assert new and verifies(new), r.set_cookies
        moved_to = new.split(".", 1)[0]
        assert moved_to in ("blue", "green")
        r = c.get(cookie=f"{COOKIE}={new}")
        assert (r.status, r.upstream, r.set_cookies) == (200, moved_to, [])
        if not kong_differs(host, "no-stats"):
            assert delta(before, counters(host, g)) == {"pinned": 2, "repinned": 1}
        c.close()
    finally:
        doomed.stop()


def test_choice_by_a_hash_of_a_header(host, upstreams, gateways):
    g = gateways(host, spec(upstreams, sticky_config({"blue": 1, "green": 1, "red": 1}, choose_by={"hash_header": "x-user"})))
    c = Client(g.url)
    other = Client(g.url)
    try:
        chosen = {}
        for i in range(60):
            user = f"user-{i}"
            r = c.get(headers=[("x-user", user)])
            assert r.status == 200 and r.sticky_cookie().startswith(r.upstream + ".")
            chosen[user] = r.upstream
        assert set(chosen.values()) == set(WEIGHTS), chosen
        for user, upstream in list(chosen.items())[:20]:
            assert other.get(headers=[("x-user", user)]).upstream == upstream, "the same key, the same upstream"
        for odd in ["\xff\xfe", "", " "]:  # not UTF-8, empty, blank: never a trap
            r = c.get(headers=[("x-user", odd)])
            assert r.status == 200 and r.sticky_cookie(), (odd, r.status)
        assert c.get(headers=[("x-user", "user-0")]).upstream == chosen["user-0"], "the VM still serves"
    finally:
        c.close()
        other.close()


def test_bad_configuration_is_refused_naming_the_field(host, upstreams, workdir):
    bad = sticky_config(WEIGHTS)
    bad["upstreams"].append({"name": "blue", "weight": 1})
    with pytest.raises(Exception):
        g = host.start(spec(upstreams, bad, workers=1), timeout=20)
        g.stop()
    logs = "".join(p.read_text(errors="replace") for p in workdir.glob("*.log"))
    assert "invalid plugin configuration: field `upstreams[3].name`: duplicate upstream" in logs


def test_the_shipped_envoy_configuration_works(host, upstreams, workdir):
    """envoy/sticky-upstream.yaml, with its fixed ports replaced by free ones."""
    if host.name != "envoy":
        pytest.skip("Envoy configuration")
    text = (ROOT / "envoy" / "sticky-upstream.yaml").read_text()
    listen, admin = free_port(), free_port()
    for old, new in [(10000, listen), (9901, admin), (8081, upstreams["blue"].port), (8082, upstreams["green"].port), (8083, upstreams["red"].port)]:
        text, n = re.subn(rf"port_value: {old}\b", f"port_value: {new}", text)
        assert n == 1, old
    path = workdir / "shipped-sticky-upstream.yaml"
    path.write_text(text)
    g = EnvoyGateway(path, listen, admin, workers=1, timeout=60)
    try:
        c = Client(g.url)
        r = c.get()
        value = r.sticky_cookie()
        assert r.status == 200 and value and value.startswith(r.upstream + ".")
        for _ in range(5):
            assert c.get(cookie=f"{COOKIE}={value}").upstream == r.upstream
        c.close()
    finally:
        g.stop()
