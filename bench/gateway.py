"""The gateway's performance report (issue 8): every filter, the likely and the full stacks, beside
proxy-only and Envoy's native equivalents, on every host (Envoy; nginx once its host and module
exist), at 1, 8 and 32 connections, with 1 worker and with 2 (this machine's cores), k6 as the
load generator (bench/k6/gateway.js), all in one interleaved run.

Scenarios (bench/k6/gateway.js presets; the variants that run each one):

| scenario | variants |
|---|---|
| proxy-only | proxy-only |
| jwt-valid-hs256, jwt-valid-rs256 | proxy-only, tollgate-jwt-auth, native-jwt_authn |
| jwt-reject-wrong-secret | tollgate-jwt-auth, native-jwt_authn (every answer 401) |
| rate-limit-allow | proxy-only, tollgate-rate-limit, native-local_ratelimit |
| cost-openai-nonstream-small, cost-openai-stream | proxy-only, tollgate-cost |
| metrics | proxy-only, tollgate-metrics |
| sticky-read | proxy-only, tollgate-sticky-upstream, native-stateful_session |
| stack-likely | proxy-only, tollgate-likely, native-likely |
| stack-full | proxy-only, tollgate-full, native-full |

Also (issue 20): wasm-floor (bench/wasm-floor, the least a proxy-wasm filter costs) on
proxy-only and each single filter's scenario, wasm-floor-5 (five of them: what each filter of a
chain pays for its own HTTP context, the most one context for a whole chain could save) on
proxy-only, and on stack-likely tollgate-likely-cached / native-likely-cached (jwt-auth's and
jwt_authn's verified-token caches on, as deployed).

Variants reuse the per-filter benchmarks' configurations (jwt_auth.py, rate_limit.py, cost.py,
metrics.py, sticky_upstream.py): jwt caches off on both sides (every request verified), rate
limits that never reject and no RateLimit headers on allowed responses, a cost budget that never
refuses, the metrics filter with a tenant label. Stacks, in chain order: tollgate-likely =
metrics, jwt-auth, rate-limit, cost; tollgate-full = the same plus sticky-upstream;
native-likely = jwt_authn + local_ratelimit and native-full = the same plus stateful_session
(Envoy has no native cost or metrics filter: the native stacks do less work). Every gateway has
the metrics benchmark's stats_config, so that only the filters differ.

    scripts/bench.sh gateway             # the full report (about 1 h with Envoy, 40 min more with nginx)
    scripts/bench.sh gateway --smoke     # a second per scenario, 1 worker, 1 connection: the test suite
    scripts/bench.sh gateway --scenarios proxy-only,stack-likely --connections 8 --workers 2 --hosts envoy
    scripts/bench.sh gateway --name gateway_issue20 --scenarios ... # some cells, beside the last full report
"""
from __future__ import annotations

import dataclasses

import cost
import jwt_auth
import metrics
import rate_limit
import report
import runner
import sticky_upstream
from lab import GatewaySpec

HOSTS = "envoy,nginx"


def likely_stack(keys: jwt_auth.Keys, cached: bool) -> list:
    """Our likely stack, in chain order: metrics, jwt-auth (its verified-token cache on or off),
    rate-limit, cost. jwt-auth verifies the subject the other filters take their identity from."""
    return [metrics.tollgate(True), jwt_auth.tollgate(keys, cached), rate_limit.tollgate(False, True), cost.tollgate(True)]


def native_likely_stack(keys: jwt_auth.Keys, cached: bool) -> list:
    """Envoy's native likely stack: `jwt_authn` (its cache on or off) and a `local_ratelimit`
    that never rejects."""
    return [jwt_auth.native(keys, cached), rate_limit.native(rate_limit.HUGE, rate_limit.HUGE, "1s")]


def main() -> None:
    opts = runner.options(connections="1,8,32", workers="1,2", hosts=HOSTS, smoke_workers="1", name="gateway")
    name = opts.pop("name")
    keys = jwt_auth.make_keys(ttl=86400)  # a full run on two hosts takes hours

    def spec(filters, upstreams, **kw):
        return GatewaySpec(filters, upstreams, stats_config=metrics.STATS_CONFIG, **kw)

    blue = lambda up: {"blue": up["blue"]}
    rl_native = lambda: rate_limit.native(rate_limit.HUGE, rate_limit.HUGE, "1s")
    likely = lambda: likely_stack(keys, False)
    native_likely = lambda: native_likely_stack(keys, False)
    likely_cached = lambda: likely_stack(keys, True)
    floors = lambda n: [dataclasses.replace(runner.wasm_floor(), config={"instance": i}) for i in range(n)]
    variants = {
        "proxy-only": lambda up: spec([], blue(up)),
        "tollgate-jwt-auth": lambda up: spec([jwt_auth.tollgate(keys, False)], blue(up)),
        "native-jwt_authn": lambda up: spec([jwt_auth.native(keys, False)], blue(up)),
        "tollgate-rate-limit": lambda up: spec([rate_limit.tollgate(False)], blue(up)),
        "native-local_ratelimit": lambda up: spec([rl_native()], blue(up)),
        "tollgate-cost": lambda up: spec([cost.tollgate()], blue(up)),
        "tollgate-metrics": lambda up: spec([metrics.tollgate()], blue(up)),
        "tollgate-sticky-upstream": lambda up: spec([sticky_upstream.tollgate()], sticky_upstream.tollgate_upstreams(up),
                                                    route_header=sticky_upstream.ROUTE_HEADER),
        "native-stateful_session": lambda up: spec([sticky_upstream.native()], sticky_upstream.native_upstreams(up)),
        "tollgate-likely": lambda up: spec(likely(), blue(up)),
        "native-likely": lambda up: spec(native_likely(), blue(up)),
        "tollgate-full": lambda up: spec(likely() + [sticky_upstream.tollgate()], sticky_upstream.tollgate_upstreams(up),
                                         route_header=sticky_upstream.ROUTE_HEADER),
        "native-full": lambda up: spec(native_likely() + [sticky_upstream.native()], sticky_upstream.native_upstreams(up)),
        "wasm-floor": lambda up: spec(floors(1), blue(up)),
        # Distinct configurations: nginx-compat runs one filter once per request however often
        # the same configuration stands in a chain.
        "wasm-floor-5": lambda up: spec(floors(5), blue(up)),
        "tollgate-likely-cached": lambda up: spec(likely_cached(), blue(up)),
        "native-likely-cached": lambda up: spec(native_likely_stack(keys, True), blue(up)),
    }
    hs256 = {"TOKEN_HS256": keys.hs256}
    sticky = {"STICKY_UPSTREAM": "blue"}  # STICKY_COOKIE: set by prepare()
    jwt_variants = ["proxy-only", "tollgate-jwt-auth", "native-jwt_authn"]
    # scenario -> (its k6 environment, the variants that run it)
    matrix = {
        "proxy-only": ({}, ["proxy-only", "wasm-floor", "wasm-floor-5"]),
        "jwt-valid-hs256": (hs256, jwt_variants + ["wasm-floor"]),
        "jwt-valid-rs256": ({"TOKEN_RS256": keys.rs256}, jwt_variants),
        "jwt-reject-wrong-secret": ({"TOKEN_WRONG": keys.wrong_secret}, jwt_variants[1:]),
        "rate-limit-allow": ({}, ["proxy-only", "tollgate-rate-limit", "native-local_ratelimit", "wasm-floor"]),
        "cost-openai-nonstream-small": ({}, ["proxy-only", "tollgate-cost", "wasm-floor"]),
        "cost-openai-stream": ({}, ["proxy-only", "tollgate-cost"]),
        "metrics": ({}, ["proxy-only", "tollgate-metrics", "wasm-floor"]),
        "sticky-read": (dict(sticky), ["proxy-only", "tollgate-sticky-upstream", "native-stateful_session", "wasm-floor"]),
        "stack-likely": (dict(hs256), ["proxy-only", "tollgate-likely", "native-likely", "tollgate-likely-cached",
                                       "native-likely-cached"]),
        "stack-full": (hs256 | sticky, ["proxy-only", "tollgate-full", "native-full"]),
    }
    scenarios = [runner.Scenario(name, env=dict(env)) for name, (env, _) in matrix.items()]
    runs = lambda v: {sc for sc, (_, vs) in matrix.items() if v in vs}
    variant_list = [runner.Variant(name, build, scenarios=runs(name)) for name, build in variants.items()]

    def prepare(gateways: dict) -> None:
        """The sticky scenarios' Cookie: sticky-upstream's (minted here) and stateful_session's
        (minted by a first response), both pinned to blue; k6 checks that every answer is blue's."""
        native_gw = gateways.get("native-stateful_session")
        cookie = sticky_upstream.sticky_cookie(sticky_upstream.native_cookie(native_gw.url) if native_gw is not None else None)
        for sc in scenarios:
            if "STICKY_UPSTREAM" in sc.env:
                sc.env["STICKY_COOKIE"] = cookie

    hosts = opts["hosts"]
    comparisons = []
    for v in variants:
        both = runs(v) & runs("proxy-only")
        if v != "proxy-only" and both:
            comparisons.append(runner.Comparison(v, "proxy-only", both, label=f"{v} / proxy-only", group=report.VS_PROXY))
    natives = [("tollgate-jwt-auth", "native-jwt_authn"), ("tollgate-rate-limit", "native-local_ratelimit"),
               ("tollgate-sticky-upstream", "native-stateful_session"), ("tollgate-likely", "native-likely"),
               ("tollgate-full", "native-full"), ("tollgate-likely-cached", "native-likely-cached")]
    for h in hosts:  # ours on each host against Envoy's native filters
        for ours, native in natives:
            comparisons.append(runner.Comparison(ours, native, runs(ours) & runs(native), label=f"{ours} / {native}",
                                                 numerator_host=h, denominator_host="envoy", group=report.VS_NATIVE))
    # Each filter against the Wasm floor on the same request and host; five floors against one.
    for ours in ["tollgate-jwt-auth", "tollgate-rate-limit", "tollgate-cost", "tollgate-metrics",
                 "tollgate-sticky-upstream", "wasm-floor-5"]:
        comparisons.append(runner.Comparison(ours, "wasm-floor", runs(ours) & runs("wasm-floor"),
                                             label=f"{ours} / wasm-floor", group=report.VS_FLOOR))
    for other in [h for h in hosts if h != "envoy"]:  # the same variant on another host against Envoy
        for v in variants:
            if not v.startswith("native-"):
                comparisons.append(runner.Comparison(v, v, label=f"{v}: {other} / envoy", numerator_host=other,
                                                     denominator_host="envoy", group=report.VS_ENVOY))

    if "kong" in hosts and "nginx" in hosts:  # the same filters and nginx: Kong's module against ours
        for v in variants:
            if not v.startswith("native-"):
                comparisons.append(runner.Comparison(v, v, label=f"{v}: kong / nginx", numerator_host="kong",
                                                     denominator_host="nginx", group=report.VS_OURS))
    runner.run(name, variant_list, scenarios, comparisons=comparisons, load="k6",
               upstream_names=sticky_upstream.UPSTREAMS, prepare=prepare, report=report.markdown, **opts)


if __name__ == "__main__":
    main()
