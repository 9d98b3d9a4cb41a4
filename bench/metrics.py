"""metrics filter vs proxy-only, in one interleaved run on one Envoy binary.

Variants, each with 1 and 2 workers (interleaved in the same rounds; ratios compare variants at
the same worker count):

- proxy-only: no filter.
- wasm-floor: bench/wasm-floor (`runner.wasm_floor`), a filter that does nothing: the least any
  proxy-wasm filter costs per request.
- tollgate-metrics: the metrics filter with three routes and a tenant header capped at 100 (the
  benchmark's tenant is admitted on the first request; later requests hit the per-VM caches:
  one host-clock read at the request headers, then at on_log the request headers it labels by,
  the response code and sizes, and the other filters' signals (absent here), the counters summed
  in the VM (handed to the host once a second, `flush_interval_ms`) and one histogram record).

Scenario `get`: GET /v1/chat/completions-like path /bench with x-tenant: bench. Target of issue 5:
tollgate-metrics / proxy-only >= 0.97.

    scripts/bench.sh metrics            # 3 rounds x 5 s per cell, 8 and 32 connections, 1 and 2 workers
    scripts/bench.sh metrics --smoke    # seconds, for the test suite
"""
from __future__ import annotations

import json

import runner
from lab import ROOT, FilterSpec, GatewaySpec

RULES = json.loads((ROOT / "plugins/metrics/stats_tags.json").read_text())
STATS_CONFIG = {
    "stats_tags": RULES,
    "histogram_bucket_settings": [{"match": {"prefix": "wasmcustom.tollgate_request_duration_microseconds"},
                                   "buckets": [1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000]}],
}
METRICS = {
    "routes": [{"name": "chat", "prefix": "/v1/chat"}, {"name": "responses", "prefix": "/v1/responses"}, {"name": "bench", "prefix": "/bench"}],
    "tenant": {"unverified_header": "x-tenant", "max_tenants": 100, "registry": "bench"},
}


def tollgate(verified: bool = False) -> FilterSpec:
    """The filter; `verified`: the tenant is the subject jwt-auth verified (x-jwt-sub, for the
    stacks, where jwt-auth runs), else the x-tenant header as sent (this filter alone)."""
    if not verified:
        return FilterSpec("metrics", METRICS)
    tenant = {k: v for k, v in METRICS["tenant"].items() if k != "unverified_header"}
    return FilterSpec("metrics", {**METRICS, "tenant": {**tenant, "header": "x-jwt-sub"}})


def main() -> None:
    opts = runner.options(connections="8,32", workers="1,2")

    # The same stats_config on both, so that only the filter differs.
    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], up, stats_config=STATS_CONFIG)),
        runner.Variant("tollgate-metrics", lambda up: GatewaySpec([tollgate()], up, stats_config=STATS_CONFIG)),
        runner.Variant("wasm-floor", lambda up: GatewaySpec([runner.wasm_floor()], up, stats_config=STATS_CONFIG)),
    ]
    scenarios = [runner.Scenario("get", path="/bench", headers={"x-tenant": "bench"})]
    comparisons = [
        runner.Comparison("tollgate-metrics", "proxy-only", label="tollgate-metrics / proxy-only"),
        runner.Comparison("wasm-floor", "proxy-only", label="Wasm floor / proxy-only"),
        runner.Comparison("tollgate-metrics", "wasm-floor", label="tollgate-metrics / Wasm floor"),
    ]
    runner.run("metrics", variants, scenarios, comparisons=comparisons, **opts)


if __name__ == "__main__":
    main()
