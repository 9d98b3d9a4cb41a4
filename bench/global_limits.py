"""Local mode vs global mode (issue 19): what asking Envoy's rate limit service
(`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, envoyproxy/ratelimit on Redis)
costs a request, on the rate-limit allow path and on the likely stack, in one interleaved run.

Variants (2 workers each; every one on every available host, all in the same rounds):

- rate-limit-local: the rate-limit filter alone, one keyed rule (`unverified_header` x-api-key),
  a fixed window of 1,000,000,000 requests per minute (never reached), counted in the gateway's
  shared data (one read and one CAS write per request).
- rate-limit-global: the same rule with a `global` block (plugins/rate-limit/README.md, "Global
  mode"): one ShouldRateLimit per request, the request paused until the reply; the service
  INCRBYs one Redis counter (fixed_cache_impl.go, DoLimit).
- likely-local: the likely stack of bench/gateway.py (metrics, jwt-auth, rate-limit, cost, each
  keyed by the subject jwt-auth verified), with rate-limit's rule as above and cost's default
  budget given per day and per month (400,000 USD each: never reached, and within the 2^32 - 1
  units of 10^-4 USD that global mode allows).
- likely-global: the same with `global` blocks in rate-limit and cost (plugins/cost/README.md,
  "Global budgets"): per request one ShouldRateLimit from rate-limit, one from cost (its check,
  `hits_addend` 0 on the day and month descriptors) and the booking, which cost's root context
  sends in batches from its 100 ms tick (up to 64 bookings per call).
- native-ratelimit-global (Envoy only): Envoy's own global rate limit filter
  (envoy.filters.http.ratelimit, its `rate_limits` in the filter's configuration) on the same
  service, one descriptor from x-api-key whose limit (the same) is in the engine's
  configuration: what the protocol costs in Envoy without Wasm, the reference for ours.

Every `global` block: `timeout_ms` 2000 (never reached on loopback, even on this shared machine,
so that the timeout does not cut the latency tail) and `on_error: deny` (a failed call is a 503,
never a fast admission); k6 counts every answer other than 200 (`non_2xx_3xx` in the results,
"non-200" in the report).

Scenarios (bench/k6/gateway.js presets): `rate-limit-allow` (GET /bench, x-api-key) for the
rate-limit variants, `stack-likely` (POST /v1/chat/completions with an HS256 token, an API key
and a tenant) for the likely ones. 1, 8 and 32 connections (k6 VUs): at 1 the machine is not
saturated and the added latency is the calls' own; at 8 and 32 the gateways, k6 and the engine
compete for the 2 cores and queueing is in it.

Per cell the runner measures requests/s, p50/p99 (k6), the gateway's CPU time per request and,
over the same interval, the engine's: utime+stime of the ratelimit service and of redis-server
from /proc/PID/stat (`runner.run(side_processes=...)`). The report gives per host and cell the
requests/s ratio global / local and the added latency (global minus local, p50 and p99, per
round), median [min, max] over rounds, with the engine's CPU per request beside it; then, on the
same engine once the gateways are stopped, the service's latency from a direct gRPC client
(bench/engine_latency.py's run_cell: "service + Redis" and "service only", 1, 8 and 32 streams).

    scripts/bench.sh global_limits                     # 3 rounds x 5 s per cell, Envoy and nginx (~10 min)
    scripts/bench.sh global_limits --hosts envoy --rounds 5
    scripts/bench.sh global_limits --smoke             # a second per cell, 1 connection: the test suite

Writes bench/results/global_limits.{json,md} (`--smoke`: global_limits.smoke.*).
"""
from __future__ import annotations

import json
import os
import re
import statistics

import cost
import engine_latency
import jwt_auth
import metrics
import ratelimit_engine
import runner
from lab import EnvoyNativeFilter, FilterSpec, GatewaySpec
from ratelimit_engine import DOMAIN, RatelimitEngine

NAME = "global_limits"
HOSTS = "envoy,nginx"
SERVICE = "ratelimit"  # the Envoy cluster / nginx upstream of the engine (GatewaySpec.grpc_services)
LIMIT = 1_000_000_000  # requests per minute: never reached; the filter's maximum (and below the protocol's uint32)
TIMEOUT_MS = 2000
UNIT_NANO_USD = 100_000  # cost's default booking unit, 10^-4 USD
BUDGET_NANO_USD = 400_000 * 10**9  # 400,000 USD: 4e9 units, under 2^32 - 1
GLOBAL = {"service": SERVICE, "domain": DOMAIN, "timeout_ms": TIMEOUT_MS, "on_error": "deny"}
# (numerator, denominator, scenario, label): global / local per stack, then ours / Envoy's own
# global rate limit filter on the same service (Envoy only).
PAIRS = [("rate-limit-global", "rate-limit-local", "rate-limit-allow", "rate-limit: global / local"),
         ("likely-global", "likely-local", "stack-likely", "likely: global / local"),
         ("rate-limit-global", "native-ratelimit-global", "rate-limit-allow", "rate-limit global / Envoy's ratelimit filter"),
         ("native-ratelimit-global", "rate-limit-local", "rate-limit-allow", "Envoy's ratelimit filter / rate-limit local")]
NATIVE_DOMAIN = "bench-native"
# The engine's configuration for Envoy's own filter, which sends no limit override: the same
# limit as rate-limit's rule, for any value of the descriptor key `key` (the x-api-key header).
NATIVE_CONFIG = f"""domain: {NATIVE_DOMAIN}
descriptors:
  - key: key
    rate_limit:
      unit: minute
      requests_per_unit: {1_000_000_000}
"""
ENGINE = ("ratelimit", "redis")  # the side processes' names in the results


def native_ratelimit() -> EnvoyNativeFilter:
    """Envoy's own global rate limit filter (envoy.filters.http.ratelimit) on the same service:
    one descriptor (`key`, the x-api-key header) per request, its limit from the engine's
    configuration (NATIVE_CONFIG); 2 s timeout and failure_mode_deny as our `global` blocks."""
    return EnvoyNativeFilter("envoy.filters.http.ratelimit", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": NATIVE_DOMAIN, "timeout": f"{TIMEOUT_MS / 1000:g}s", "failure_mode_deny": True,
        "rate_limit_service": {"grpc_service": {"envoy_grpc": {"cluster_name": SERVICE}}, "transport_api_version": "V3"},
        "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "key"}}]}],
    })


def rate_limit(verified: bool, global_mode: bool) -> FilterSpec:
    """One keyed fixed-window rule that never refuses; `verified`: keyed by jwt-auth's subject
    (x-jwt-sub, in the stack), else by x-api-key as sent. `global_mode`: with the `global` block."""
    key = [{"header": "x-jwt-sub"}] if verified else [{"unverified_header": "x-api-key"}]
    # `zone` (the namespace's old name, read by every build), so that builds from before the rename
    # can be compared.
    config = {"zone": "bench-global", "headers_on_allowed": False,
              "rules": [{"name": "allow", "key": key, "limits": [{"algorithm": "fixed_window", "requests": LIMIT, "per": "minute"}]}]}
    if global_mode:
        config["global"] = dict(GLOBAL)
    return FilterSpec("rate-limit", config)


def cost_filter(global_mode: bool) -> FilterSpec:
    """bench/cost.py's filter in the stack (tenant = jwt-auth's subject) with a day and a month
    budget that are never reached; `global_mode`: with the `global` block."""
    spec = cost.tollgate(True)
    config = dict(spec.config)
    config["budgets"] = {"default": {"day_nano_usd": BUDGET_NANO_USD, "month_nano_usd": BUDGET_NANO_USD}}
    if global_mode:
        config["global"] = dict(GLOBAL, unit_nano_usd=UNIT_NANO_USD)
    return FilterSpec("cost", config)


def median_min_max(values: list[float]) -> tuple[float, float, float] | None:
    return (statistics.median(values), min(values), max(values)) if values else None


def fmt(t: tuple[float, float, float] | None, digits: int = 0, unit: str = "", sign: bool = False) -> str:
    if t is None:
        return "-"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"**{f.format(t[0])}{unit}** [{f.format(t[1])}, {f.format(t[2])}]"


def engine_cpu(row: dict) -> float:
    side = row.get("side_cpu_us_per_request", {})
    return sum(side.get(k, 0.0) for k in ENGINE)


def deltas(results: dict) -> list[dict]:
    """Per host, pair and (connections, workers) cell: the same-round differences global minus
    local of p50 and p99 (µs) and the requests/s ratio, median [min, max] over rounds; the
    engine's CPU per request (service, Redis, sum) and the cores it kept busy
    (CPU per request x requests/s), medians over rounds of the global variant."""
    raw = results["raw"]
    out = []
    for host in results["hosts"]:
        for glob, local, scenario, label in PAIRS:
            cells = sorted({(r["connections"], r["workers"]) for r in raw if r["host"] == host and r["scenario"] == scenario})
            for conns, workers in cells:
                pick = lambda v: {r["round"]: r for r in raw if r["host"] == host and r["variant"] == v
                                  and r["connections"] == conns and r["workers"] == workers and r["scenario"] == scenario}
                g, l = pick(glob), pick(local)
                rounds = sorted(set(g) & set(l))
                if not rounds:
                    continue
                gs = [g[k] for k in rounds]
                side = lambda name: median_min_max([r.get("side_cpu_us_per_request", {}).get(name, 0.0) for r in gs])
                out.append({
                    "host": host, "label": label, "numerator": glob, "denominator": local, "scenario": scenario, "connections": conns,
                    "workers": workers, "rounds": len(rounds),
                    "rps_ratio": median_min_max([g[k]["rps"] / l[k]["rps"] for k in rounds if l[k]["rps"] > 0]),
                    "added_p50_us": median_min_max([g[k]["p50_us"] - l[k]["p50_us"] for k in rounds]),
                    "added_p99_us": median_min_max([g[k]["p99_us"] - l[k]["p99_us"] for k in rounds]),
                    "gateway_cpu_ratio": median_min_max([g[k]["cpu_us_per_request"] / l[k]["cpu_us_per_request"]
                                                         for k in rounds if l[k]["cpu_us_per_request"] > 0]),
                    "gateway_cpu_us": (median_min_max([r["cpu_us_per_request"] for r in gs]),
                                       median_min_max([l[k]["cpu_us_per_request"] for k in rounds])),
                    "service_cpu_us": side("ratelimit"), "redis_cpu_us": side("redis"),
                    "engine_cpu_us": median_min_max([engine_cpu(r) for r in gs]),
                    "engine_cores": median_min_max([engine_cpu(r) * r["rps"] / 1e6 for r in gs]),
                    "local_engine_cpu_us": median_min_max([engine_cpu(l[k]) for k in rounds]),
                    "non_200": {glob: sum(g[k]["non_2xx_3xx"] for k in rounds), local: sum(l[k]["non_2xx_3xx"] for k in rounds)},
                })
    return out


def markdown(results: dict, comparisons: list, files_dir) -> str:
    """The report: machine and load, the global / local table per host, the medians per
    variant, the direct client's figures (filled in by main once measured)."""
    m = results["machine"]
    loads = [r["loadavg_1m"] for r in results["raw"] if "loadavg_1m" in r]
    d = deltas(results)
    results["global_vs_local"] = d
    versions = f"Envoy {m['envoy']}" + (f", nginx {m['nginx']} (wasmtime {m.get('wasmtime', '?')})" if "nginx" in m else "")
    lines = [f"# Global vs local mode (issue 19): `bench/{NAME}.py`", "",
             f"{results['date']}; {m['cores']} cores ({m['cpu']}), kernel {m['kernel']}; {versions}, k6 {m.get('k6', '?')}; "
             f"envoyproxy/ratelimit {results.get('engine', {}).get('version', '?')} and Redis {results.get('engine', {}).get('redis', '?')} on loopback; "
             f"2 workers; {results['rounds']} interleaved rounds of {results['seconds']} s per cell (1 s warm-up), order rotated per round"
             + (" (SMOKE: figures meaningless)" if results["smoke"] else "") + ".", "",
             f"Load on the shared machine: 1-minute load average {min(loads):.1f} to {max(loads):.1f} over the measurements "
             f"({results.get('loadavg_before', ['?'])[0]} before the run), on {m['cores']} cores: other engineers' builds and tests "
             "ran beside it, which is why the figures are same-round ratios and differences (median [min, max] over rounds). "
             "Gateways (2 workers) unpinned; k6 and the demo upstream pinned to core 1; the engine (service, Redis) unpinned.", ""]
    if results.get("skipped_hosts"):
        lines += ["Not measured: " + "; ".join(f"{k}: {v}" for k, v in results["skipped_hosts"].items()) + ".", ""]
    lines += ["## Global / local, per request", "",
              "Requests/s ratio and added latency (the first variant minus the second: the same round's k6 p50 and p99), "
              "median [min, max] over rounds. Target (global / local): p99 added at most 1 ms. The engine's CPU: the ratelimit service's and Redis' utime+stime "
              "over the global variant's measurement, per request, and the cores it kept busy at that rate (on this 2-core "
              "machine, CPU the gateways and k6 did not get: part of the requests/s ratio).", "",
              "| host | comparison (1st / 2nd) | conns | req/s ratio | added p50 µs | added p99 µs | p99 added ≤ 1 ms | gateway CPU µs/req 1st vs 2nd (ratio) "
              "| engine CPU µs/req of the 1st (service + Redis) | engine cores busy | non-200 1st / 2nd |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d:
        target = ("-" if r["added_p99_us"] is None or not r["denominator"].endswith("-local")  # the target is global vs local
                  else "met" if r["added_p99_us"][0] <= 1000 else "**missed**")
        gcpu = f"{r['gateway_cpu_us'][0][0]:.1f} vs {r['gateway_cpu_us'][1][0]:.1f} ({fmt(r['gateway_cpu_ratio'], 2, 'x')})"
        ecpu = f"{fmt(r['engine_cpu_us'], 1)} ({r['service_cpu_us'][0]:.1f} + {r['redis_cpu_us'][0]:.1f})"
        lines.append(f"| {r['host']} | {r['label']} | {r['connections']} | {fmt(r['rps_ratio'], 2, 'x')} | {fmt(r['added_p50_us'], sign=True)} "
                     f"| {fmt(r['added_p99_us'], sign=True)} | {target} | {gcpu} | {ecpu} | {fmt(r['engine_cores'], 2)} "
                     f"| {r['non_200'][r['numerator']]} / {r['non_200'][r['denominator']]} |")
    idle = [r["local_engine_cpu_us"][2] for r in d if r["local_engine_cpu_us"] is not None and r["denominator"].endswith("-local")]
    if idle:
        lines += ["", f"During the local variants' measurements the engine used at most {max(idle):.2f} µs per request (idle: "
                      "it is only asked by the global variants)."]
    lines += ["", "## Medians per variant", "",
              "| host | scenario | conns | variant | req/s | p50 µs | p99 µs | gateway CPU µs/req | service CPU µs/req | Redis CPU µs/req | non-200 (all rounds) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["host"], r["scenario"], r["connections"], r["variant"])
    for cell in sorted({key(r) for r in results["raw"]}):
        rows = [r for r in results["raw"] if key(r) == cell]
        md = lambda f: statistics.median(f(r) for r in rows)
        lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {cell[3]} | {md(lambda r: r['rps']):.0f} | {md(lambda r: r['p50_us']):.0f} "
                     f"| {md(lambda r: r['p99_us']):.0f} | {md(lambda r: r['cpu_us_per_request']):.1f} "
                     f"| {md(lambda r: r.get('side_cpu_us_per_request', {}).get('ratelimit', 0)):.1f} "
                     f"| {md(lambda r: r.get('side_cpu_us_per_request', {}).get('redis', 0)):.1f} | {sum(r['non_2xx_3xx'] for r in rows)} |")
    bad = [r for r in results["raw"] if r.get("unexpected_status")]
    if bad:
        lines += ["", f"WARNING: {len(bad)} measurements had answers other than 200, failed k6 checks or crossed a k6 "
                      "threshold (p99 over 1 s counts): see `unexpected_status` in the JSON."]
    lines += direct_client_section(results.get("direct_client"))
    return "\n".join(lines) + "\n"


def direct_client_section(direct: dict | None) -> list[str]:
    if not direct:
        return []
    lines = ["", "## The engine on its own: a direct gRPC client", "",
             f"The same engine after the gateways stopped, `bench/engine_latency.py`'s `run_cell`: one HTTP/2 connection, "
             f"N concurrent streams (grpcio threads under Python's GIL: the client's own cost is in every figure), "
             f"{direct['rounds']} interleaved rounds of {direct['seconds']} s; \"service + Redis\" is a 1-hit charge on one "
             "descriptor with a limit override (the allow path), \"service only\" the same call for a domain the engine "
             "does not know (answered without Redis). Medians [min, max] over rounds.", "",
             "| streams | variant | calls/s | p50 µs | p99 µs | service CPU µs/call | Redis CPU µs/call | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for streams, by_variant in direct["cells"].items():
        for variant, cells in by_variant.items():
            get = lambda f: median_min_max([f(c) for c in cells])
            lines.append(f"| {streams} | {variant} | {fmt(get(lambda c: c['calls_per_s']))} | {fmt(get(lambda c: c['p50_ms'] * 1000))} "
                         f"| {fmt(get(lambda c: c['p99_ms'] * 1000))} | {fmt(get(lambda c: c['cpu_us_per_call']['ratelimit']), 1)} "
                         f"| {fmt(get(lambda c: c['cpu_us_per_call']['redis']), 1)} | {sum(c['errors'] for c in cells)} |")
    return lines


def direct_client(engine: RatelimitEngine, streams_list: list[int], rounds: int, seconds: float) -> dict:
    """engine_latency.run_cell on `engine`, both variants interleaved (order rotated per round)."""
    variants = {"service + Redis": DOMAIN, "service only": "not-configured"}
    pids = {"ratelimit": engine.service.pid, "redis": engine.redis.pid}
    cells: dict[int, dict[str, list[dict]]] = {s: {v: [] for v in variants} for s in streams_list}
    with engine_latency.RlsClient(engine.grpc_address) as client:
        engine_latency.run_cell(client, DOMAIN, 4, 0.5, pids)  # warm-up: the connection, the service's Redis pool
        for rnd in range(rounds):
            order = list(variants)[rnd % 2:] + list(variants)[:rnd % 2]
            for streams in streams_list:
                for name in order:
                    cell = engine_latency.run_cell(client, variants[name], streams, seconds, pids)
                    cells[streams][name].append(cell)
                    print(f"direct client round {rnd} {name:16} {streams:2} streams: {cell['calls_per_s']:7.0f} calls/s "
                          f"p50 {cell['p50_ms'] * 1000:6.0f}us p99 {cell['p99_ms'] * 1000:6.0f}us errors {cell['errors']}", flush=True)
    return {"rounds": rounds, "seconds": seconds, "cells": cells}


def engine_versions() -> dict[str, str]:
    """The engine's versions: envoyproxy/ratelimit's pinned pseudo-version (scripts/ratelimit.sh)
    and redis-server's."""
    found = re.search(r"^RATELIMIT_VERSION=(\S+)", (runner.ROOT / "scripts" / "ratelimit.sh").read_text(), re.M)
    redis = runner.tool_version([ratelimit_engine.REDIS_BIN, "--version"],
                                lambda t: next(w.split("=", 1)[1] for w in t.split() if w.startswith("v=")))
    return {"version": found.group(1) if found else "?", "redis": redis}


def main() -> None:
    opts = runner.options(connections="1,8,32", workers="2", hosts=HOSTS)
    keys = jwt_auth.make_keys(ttl=86400)
    loadavg_before = os.getloadavg()
    engine = RatelimitEngine()
    (engine.runtime_root / "ratelimit" / "config" / "bench_native.yaml").write_text(NATIVE_CONFIG)
    with engine:
        services = {SERVICE: engine.grpc_port}

        def spec(filters, up):
            return GatewaySpec(filters, up, stats_config=metrics.STATS_CONFIG, grpc_services=services)

        def likely(global_mode: bool) -> list[FilterSpec]:
            return [metrics.tollgate(True), jwt_auth.tollgate(keys, False), rate_limit(True, global_mode), cost_filter(global_mode)]

        rl, stack = {"rate-limit-allow"}, {"stack-likely"}
        variants = [
            runner.Variant("rate-limit-local", lambda up: spec([rate_limit(False, False)], up), scenarios=rl),
            runner.Variant("rate-limit-global", lambda up: spec([rate_limit(False, True)], up), scenarios=rl),
            runner.Variant("native-ratelimit-global", lambda up: spec([native_ratelimit()], up), scenarios=rl),
            runner.Variant("likely-local", lambda up: spec(likely(False), up), scenarios=stack),
            runner.Variant("likely-global", lambda up: spec(likely(True), up), scenarios=stack),
        ]
        scenarios = [runner.Scenario("rate-limit-allow"), runner.Scenario("stack-likely", env={"TOKEN_HS256": keys.hs256})]
        comparisons = [runner.Comparison(g, l, {sc}, label=label) for g, l, sc, label in PAIRS]
        engine_info = {**engine_versions(), "settings": engine.settings}

        def report(results: dict, comparisons_: list, files_dir) -> str:
            results["engine"] = engine_info
            results["loadavg_before"] = list(loadavg_before)
            return markdown(results, comparisons_, files_dir)

        results = runner.run(NAME, variants, scenarios, comparisons=comparisons, load="k6", report=report,
                             side_processes=lambda: {"ratelimit": [engine.service.pid], "redis": [engine.redis.pid]}, **opts)
        streams = [1] if opts["smoke"] else sorted({1, *opts["connections"]})
        results["direct_client"] = direct_client(engine, streams, opts["rounds"] if not opts["smoke"] else 1,
                                                 1 if opts["smoke"] else opts["seconds"])
    # The report again, now with the direct client's section.
    out = runner.BENCH / "results" / (f"{NAME}.smoke" if opts["smoke"] else NAME)
    md = markdown(results, comparisons, None)
    (out.parent / (out.name + ".json")).write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out.parent / (out.name + ".md")).write_text(md)
    print("\n".join(direct_client_section(results["direct_client"])))


if __name__ == "__main__":
    main()
