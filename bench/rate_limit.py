"""rate-limit vs Envoy's native local_ratelimit vs proxy-only, in one interleaved run on one Envoy binary.

Variants, each with 1 and 2 workers (all interleaved in the same rounds; ratios compare variants
at the same worker count):

- proxy-only: no filter.
- native-local_ratelimit: envoy.filters.http.local_ratelimit, one token bucket so large that
  nothing is rejected (enabled and enforced for 100% of requests).
- tollgate-rate-limit: the rate-limit filter keyed by a header, a token bucket so large that
  nothing is rejected (allow path: one shared-data read and one CAS write per request), RateLimit
  headers on allowed responses off; and on /reject a fixed window of 1 per day (reject path:
  one read, no write, a local 429 reply).
- tollgate-rate-limit+headers: the same with RateLimit-Policy/RateLimit on allowed responses.
- wasm-floor: bench/wasm-floor (`runner.wasm_floor`), a filter that does nothing: what any
  proxy-wasm filter costs in Envoy (context, one callback), the floor under the allow path.
- native-local_ratelimit-reject: local_ratelimit with a 1-token bucket refilled daily.

Scenarios: `allow` (GET /bench, x-api-key: bench-client) and `reject` (GET /reject, every answer
429 once the limit is primed with one request).

    scripts/bench.sh rate_limit            # 3 rounds x 5 s per cell, 8 and 32 connections, 1 and 2 workers
    scripts/bench.sh rate_limit --smoke    # seconds, for the test suite
"""
from __future__ import annotations


import runner
from lab import EnvoyNativeFilter, FilterSpec, GatewaySpec

KEY_HEADER = "x-api-key"
HUGE = 1_000_000_000


def native(max_tokens: int, tokens_per_fill: int, fill_interval: str) -> EnvoyNativeFilter:
    percent = {"numerator": 100, "denominator": "HUNDRED"}
    return EnvoyNativeFilter("envoy.filters.http.local_ratelimit", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
        "stat_prefix": "bench_local_rate_limit",
        "token_bucket": {"max_tokens": max_tokens, "tokens_per_fill": tokens_per_fill, "fill_interval": fill_interval},
        "filter_enabled": {"runtime_key": "bench_local_rate_limit_enabled", "default_value": percent},
        "filter_enforced": {"runtime_key": "bench_local_rate_limit_enforced", "default_value": percent},
    })


def tollgate(headers: bool, verified: bool = False) -> FilterSpec:
    """The filter; `verified`: keyed by the subject jwt-auth verified (x-jwt-sub, for the stacks,
    where jwt-auth runs), else by the API key header as sent (this filter alone)."""
    key = [{"header": "x-jwt-sub"}] if verified else [{"unverified_header": KEY_HEADER}]
    return FilterSpec("rate-limit", {
        # `zone`, the namespace's name before 2026-11-28, which every build reads: benchmarks
        # compare builds from before and after the rename (instructions.py --wasm).
        "zone": "bench",
        "rules": [
            {"name": "reject", "match": {"prefix": "/reject"}, "key": key,
             "limits": [{"algorithm": "fixed_window", "requests": 1, "per": "day"}]},
            {"name": "allow", "key": key,
             "limits": [{"algorithm": "token_bucket", "capacity": HUGE, "requests": HUGE, "per": "second"}]},
        ],
        "headers_on_allowed": headers,
    })


def main() -> None:
    opts = runner.options(connections="8,32", workers="1,2")

    allow, reject = {"allow"}, {"reject"}
    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], up), scenarios=allow),
        runner.Variant("native-local_ratelimit", lambda up: GatewaySpec([native(HUGE, HUGE, "1s")], up), scenarios=allow),
        runner.Variant("tollgate-rate-limit", lambda up: GatewaySpec([tollgate(False)], up)),
        runner.Variant("tollgate-rate-limit+headers", lambda up: GatewaySpec([tollgate(True)], up), scenarios=allow),
        runner.Variant("wasm-floor", lambda up: GatewaySpec([runner.wasm_floor()], up), scenarios=allow),
        runner.Variant("native-local_ratelimit-reject", lambda up: GatewaySpec([native(1, 1, "86400s")], up), scenarios=reject),
    ]
    headers = {KEY_HEADER: "bench-client"}
    scenarios = [
        runner.Scenario("allow", path="/bench", headers=headers),
        runner.Scenario("reject", path="/reject", headers=headers, expect_non_2xx=True, prime=1),
    ]
    comparisons = [
        runner.Comparison("tollgate-rate-limit", "native-local_ratelimit", allow, label="tollgate / native local_ratelimit (allow)"),
        runner.Comparison("tollgate-rate-limit+headers", "native-local_ratelimit", allow, label="tollgate+headers / native local_ratelimit (allow)"),
        runner.Comparison("tollgate-rate-limit", "proxy-only", allow, label="tollgate / proxy-only (allow)"),
        runner.Comparison("native-local_ratelimit", "proxy-only", allow, label="native / proxy-only (allow)"),
        runner.Comparison("wasm-floor", "native-local_ratelimit", allow, label="Wasm floor / native (allow)"),
        runner.Comparison("tollgate-rate-limit", "wasm-floor", allow, label="tollgate / Wasm floor (allow)"),
        runner.Comparison("tollgate-rate-limit", "native-local_ratelimit-reject", reject, label="tollgate / native local_ratelimit (reject)"),
    ]
    runner.run("rate_limit", variants, scenarios, comparisons=comparisons, **opts)


if __name__ == "__main__":
    main()
