"""cost vs proxy-only, in one interleaved run on one Envoy binary.

Variants:
- proxy-only: no filter.
- wasm-floor: bench/wasm-floor (`runner.wasm_floor`), a filter that does nothing: the least any
  proxy-wasm filter costs per request.
- tollgate-cost: the cost filter (tenant from x-tenant, a price for the model, a default budget
  so large that nothing is refused): per request one shared-data read (budget check), a copy of
  the small request body (model), the response inspected (JSON copied, or SSE parsed
  incrementally), one CAS write (booking) at the end.

Scenarios (POST, the demo upstream's mock LLM endpoints):
- `json`: a small non-streaming chat completion (/v1/chat/completions).
- `sse`: a streamed chat completion with stream_options.include_usage (8 content chunks).

    scripts/bench.sh cost            # 3 rounds x 5 s per cell, 8 and 32 connections
    scripts/bench.sh cost --smoke    # seconds, for the test suite
"""
from __future__ import annotations

import json

import runner
from lab import FilterSpec, GatewaySpec

HUGE = 10**18


def tollgate(verified: bool = False) -> FilterSpec:
    """The filter; `verified`: the tenant is the subject jwt-auth verified (x-jwt-sub, for the
    stacks, where jwt-auth runs), else the x-tenant header as sent (this filter alone)."""
    return FilterSpec("cost", {
        "ledger": "bench",
        "prices": {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
                                   "cache_read_input_token_cost": 7.5e-08}},
        "tenant": {"header": "x-jwt-sub"} if verified else {"unverified_header": "x-tenant"},
        "budgets": {"default": {"day_nano_usd": HUGE}},
    })


def main() -> None:
    opts = runner.options(connections="8,32", workers="1")

    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], up)),
        runner.Variant("tollgate-cost", lambda up: GatewaySpec([tollgate()], up)),
        runner.Variant("wasm-floor", lambda up: GatewaySpec([runner.wasm_floor()], up)),
    ]
    headers = {"content-type": "application/json", "x-tenant": "bench-tenant", "x-mock-prompt-tokens": "120",
               "x-mock-completion-tokens": "40", "x-mock-cached-tokens": "20"}
    scenarios = [
        runner.Scenario("json", path="/v1/chat/completions", headers=headers, method="POST",
                        body=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})),
        runner.Scenario("sse", path="/v1/chat/completions", headers=headers | {"x-mock-chunks": "8"}, method="POST",
                        body=json.dumps({"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True},
                                         "messages": [{"role": "user", "content": "hi"}]})),
    ]
    comparisons = [
        runner.Comparison("tollgate-cost", "proxy-only", label="cost / proxy-only"),
        runner.Comparison("wasm-floor", "proxy-only", label="Wasm floor / proxy-only"),
        runner.Comparison("tollgate-cost", "wasm-floor", label="cost / Wasm floor"),
    ]
    runner.run("cost", variants, scenarios, comparisons=comparisons, **opts)


if __name__ == "__main__":
    main()
