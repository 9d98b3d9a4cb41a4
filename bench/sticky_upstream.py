"""sticky-upstream vs Envoy's native stateful_session (cookie-based session state) vs proxy-only,
in one interleaved run on one Envoy binary, three demo upstreams (blue, green, red).

- proxy-only: one cluster (blue), no filter.
- native-stateful_session: `envoy.filters.http.stateful_session` with
  `envoy.http.stateful_session.cookie`; one cluster with the three upstreams as endpoints (its
  cookie carries a host address); its cookie is minted by a first response, pinned to blue.
- wasm-floor: bench/wasm-floor (`runner.wasm_floor`), a filter that does nothing, one cluster
  (blue): the least any proxy-wasm filter costs per request.
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
from lab import EnvoyNativeFilter, FilterSpec, GatewaySpec

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


def get(url: str, cookie: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, str | None, list[str]]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", "/bench", headers=(headers or {}) | ({"cookie": cookie} if cookie else {}))
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("x-upstream-name"), r.headers.get_all("set-cookie") or []
    finally:
        conn.close()


def native() -> EnvoyNativeFilter:
    """`envoy.filters.http.stateful_session` with a cookie-based session state."""
    return EnvoyNativeFilter("envoy.filters.http.stateful_session", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
        "session_state": {
            "name": "envoy.http.stateful_session.cookie",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState",
                "cookie": {"name": NATIVE_COOKIE, "path": "/", "ttl": f"{MAX_AGE}s"},
            },
        },
    })


def tollgate() -> FilterSpec:
    """The sticky-upstream filter over UPSTREAMS (one cluster each, routed by ROUTE_HEADER)."""
    return FilterSpec("sticky-upstream", {
        "upstreams": [{"name": n, "weight": 1} for n in UPSTREAMS],
        "cookie": {"name": TOLLGATE_COOKIE, "path": "/", "max_age_seconds": MAX_AGE, "http_only": True},
        "secret": SECRET,
        "route_header": ROUTE_HEADER,
    })


def native_upstreams(up: dict[str, int]) -> dict[str, list[int]]:
    """stateful_session's cluster: one cluster with every upstream as an endpoint."""
    return {"pool": [up[n] for n in UPSTREAMS]}


def tollgate_upstreams(up: dict[str, int]) -> dict[str, int]:
    """sticky-upstream's clusters: one per upstream, named like it."""
    return {n: up[n] for n in UPSTREAMS}


def native_cookie(url: str, headers: dict[str, str] | None = None) -> str:
    """A stateful_session cookie value pinned to blue, minted by the gateway at `url` (its value
    is the host's address, so it is valid on every gateway of the same upstreams)."""
    for _ in range(30):  # the cluster's load balancer picks a host; keep the one for blue
        status, upstream, set_cookies = get(url, headers=headers)
        ours = [c for c in set_cookies if c.startswith(NATIVE_COOKIE + "=")]
        if status == 200 and upstream == "blue" and ours:
            return ours[0].split(";", 1)[0].split("=", 1)[1]
    raise RuntimeError("stateful_session never pinned blue")


def sticky_cookie(native_value: str | None) -> str:
    """The Cookie header of the sticky-read requests: both filters' cookies, pinned to blue
    (sticky-upstream's only when there is no stateful_session cookie)."""
    ours = f"{TOLLGATE_COOKIE}={mint('blue', int(time.time()) + MAX_AGE)}"
    return ours if native_value is None else f"{ours}; {NATIVE_COOKIE}={native_value}"


def check_pins(url: str, cookie: str, headers: dict[str, str] | None = None) -> None:
    """Raises unless the gateway at `url` honours `cookie`: blue, and no new cookie."""
    for _ in range(5):
        status, upstream, set_cookies = get(url, cookie, headers)
        if (status, upstream, set_cookies) != (200, "blue", []):
            raise RuntimeError(f"{url}: the cookie does not pin: {status} {upstream} {set_cookies}")


def main() -> None:
    opts = runner.options(connections="1,8", workers="1")

    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], {"blue": up["blue"]}), scenarios={"sticky-read"}),
        runner.Variant("native-stateful_session", lambda up: GatewaySpec([native()], native_upstreams(up))),
        runner.Variant("tollgate-sticky-upstream", lambda up: GatewaySpec([tollgate()], tollgate_upstreams(up), route_header=ROUTE_HEADER)),
        runner.Variant("wasm-floor", lambda up: GatewaySpec([runner.wasm_floor()], {"blue": up["blue"]}), scenarios={"sticky-read"}),
    ]
    sticky_read = runner.Scenario("sticky-read")
    scenarios = [sticky_read, runner.Scenario("new-client")]

    def prepare(gateways: dict) -> None:
        """Mints both cookies, pinned to blue, and checks that each filter honours its own."""
        native_url, tollgate_url = gateways["native-stateful_session"].url, gateways["tollgate-sticky-upstream"].url
        cookie = sticky_cookie(native_cookie(native_url))
        for url in (native_url, tollgate_url):
            check_pins(url, cookie)
        sticky_read.headers["cookie"] = cookie
        print(f"sticky-read Cookie: {cookie}", flush=True)

    comparisons = [
        runner.Comparison("tollgate-sticky-upstream", "native-stateful_session", label="tollgate / native stateful_session"),
        runner.Comparison("tollgate-sticky-upstream", "proxy-only", scenarios={"sticky-read"}, label="tollgate / proxy-only"),
        runner.Comparison("native-stateful_session", "proxy-only", scenarios={"sticky-read"}, label="native stateful_session / proxy-only"),
        runner.Comparison("wasm-floor", "native-stateful_session", scenarios={"sticky-read"}, label="Wasm floor / native stateful_session"),
        runner.Comparison("tollgate-sticky-upstream", "wasm-floor", scenarios={"sticky-read"}, label="tollgate / Wasm floor"),
    ]
    runner.run("sticky_upstream", variants, scenarios, comparisons=comparisons, **opts,
               upstream_names=UPSTREAMS, prepare=prepare)


if __name__ == "__main__":
    main()
