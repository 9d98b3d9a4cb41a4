"""sticky-upstream vs Envoy's native stateful_session (cookie-based session state) vs proxy-only,
in one interleaved run on one Envoy binary, three demo upstreams (blue, green, red).

- proxy-only: one cluster (blue), no filter.
- native-stateful_session: `envoy.filters.http.stateful_session` with
  `envoy.http.stateful_session.cookie`; one cluster with the three upstreams as endpoints (its
  cookie carries a host address); its cookie is minted by a first response, pinned to blue.
- tollgate-sticky-upstream: one cluster per upstream, routed with `cluster_header`; its cookie is
  minted here with the same HMAC as the filter, pinned to blue.

Scenarios: `sticky-read`, every request carries a valid cookie (both filters' cookies are in the
same Cookie header, so each parses a two-cookie header), and `new-client`, no cookie (both
filters choose and set a cookie on every response).

    scripts/bench.sh sticky_upstream            # 3 rounds x 5 s per cell, 1 worker, 1 and 8 connections
    scripts/bench.sh sticky_upstream --smoke    # seconds, for the test suite
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import time
import urllib.parse

import runner
from harness import EnvoyNativeFilter, FilterSpec, GatewaySpec

UPSTREAMS = ["blue", "green", "red"]
SECRET = "bench-sticky-secret-0123456789abcdef-xyz"
TOLLGATE_COOKIE = "tollgate_sticky"
NATIVE_COOKIE = "envoy_sticky"
ROUTE_HEADER = "x-tollgate-upstream"
MAX_AGE = 86400


def mint(upstream: str, expiry: int) -> str:
    """The filter's cookie value (plugins/sticky-upstream/src/cookie_value.rs)."""
    msg = b"tollgate-sticky-upstream/v1\0" + TOLLGATE_COOKIE.encode() + b"\0" + upstream.encode() + b"\0" + str(expiry).encode()
    tag = base64.urlsafe_b64encode(hmac.new(SECRET.encode(), msg, hashlib.sha256).digest()).rstrip(b"=").decode()
    return f"{upstream}.{expiry}.{tag}"


def get(url: str, cookie: str | None = None) -> tuple[int, str | None, list[str]]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", "/bench", headers={"cookie": cookie} if cookie else {})
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("x-upstream-name"), r.headers.get_all("set-cookie") or []
    finally:
        conn.close()


def main() -> None:
    opts = runner.options(connections="1,8", workers="1")

    native = EnvoyNativeFilter("envoy.filters.http.stateful_session", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
        "session_state": {
            "name": "envoy.http.stateful_session.cookie",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState",
                "cookie": {"name": NATIVE_COOKIE, "path": "/", "ttl": f"{MAX_AGE}s"},
            },
        },
    })
    tollgate = FilterSpec("sticky-upstream", {
        "upstreams": [{"name": n, "weight": 1} for n in UPSTREAMS],
        "cookie": {"name": TOLLGATE_COOKIE, "path": "/", "max_age_seconds": MAX_AGE, "http_only": True},
        "secret": SECRET,
        "route_header": ROUTE_HEADER,
    })

    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], {"blue": up["blue"]}), scenarios={"sticky-read"}),
        runner.Variant("native-stateful_session", lambda up: GatewaySpec([native], {"pool": [up[n] for n in UPSTREAMS]})),
        runner.Variant("tollgate-sticky-upstream", lambda up: GatewaySpec([tollgate], {n: up[n] for n in UPSTREAMS}, route_header=ROUTE_HEADER)),
    ]
    sticky_read = runner.Scenario("sticky-read")
    scenarios = [sticky_read, runner.Scenario("new-client")]

    def prepare(gateways: dict) -> None:
        """Mints both cookies, pinned to blue, and checks that each filter honours its own."""
        native_url, tollgate_url = gateways["native-stateful_session"].url, gateways["tollgate-sticky-upstream"].url
        native_value = None
        for _ in range(30):  # the cluster's load balancer picks a host; keep the one for blue
            status, upstream, set_cookies = get(native_url)
            ours = [c for c in set_cookies if c.startswith(NATIVE_COOKIE + "=")]
            if status == 200 and upstream == "blue" and ours:
                native_value = ours[0].split(";", 1)[0].split("=", 1)[1]
                break
        if native_value is None:
            raise RuntimeError("stateful_session never pinned blue")
        tollgate_value = mint("blue", int(time.time()) + MAX_AGE)
        cookie = f"{TOLLGATE_COOKIE}={tollgate_value}; {NATIVE_COOKIE}={native_value}"
        for url in (native_url, tollgate_url):
            for _ in range(5):
                status, upstream, set_cookies = get(url, cookie)
                if (status, upstream, set_cookies) != (200, "blue", []):
                    raise RuntimeError(f"{url}: the cookie does not pin: {status} {upstream} {set_cookies}")
        sticky_read.headers["cookie"] = cookie
        print(f"sticky-read Cookie: {cookie}", flush=True)

    comparisons = [
        runner.Comparison("tollgate-sticky-upstream", "native-stateful_session", label="tollgate / native stateful_session"),
        runner.Comparison("tollgate-sticky-upstream", "proxy-only", scenarios={"sticky-read"}, label="tollgate / proxy-only"),
        runner.Comparison("native-stateful_session", "proxy-only", scenarios={"sticky-read"}, label="native stateful_session / proxy-only"),
    ]
    runner.run("sticky_upstream", variants, scenarios, comparisons=comparisons, **opts,
               upstream_names=UPSTREAMS, prepare=prepare)


if __name__ == "__main__":
    main()
