"""Benchmark runner: variants of a gateway measured in one run, interleaved, as ratios.

Every variant's gateway is started once, all pinned to the same cores, and stays idle while the
others are measured. Each round measures every (scenario, connections) cell on every variant in
turn (A B C A B C ...), rotating the order between rounds, so slow drifts of this shared machine
hit all variants alike. For each cell and round the runner computes ratios between variants of
the *same* round; the report gives the median with min and max over rounds.

Per measurement: requests/s, p50/p99 latency (wrk) and the gateway's CPU time per request (from
/proc/PID/stat of the gateway's processes, utime+stime), since the load generator shares the
machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from harness import DemoUpstream, EnvoyHost, GatewaySpec  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
GATEWAY_CPUS = "0"
LOAD_CPUS = "1"


@dataclasses.dataclass
class Scenario:
    """A request pattern: path, headers and how many non-2xx answers are expected (fraction)."""

    name: str
    path: str = "/bench"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    expect_non_2xx: bool = False
    prime: int = 0  # requests sent once to each gateway before measuring (e.g. to exhaust a limit)
    method: str = "GET"  # with `body`, sent through a generated wrk script (see wrk_script)
    body: str | None = None


@dataclasses.dataclass
class Variant:
    """A gateway configuration; `scenarios` limits which scenarios it runs (None: all)."""

    name: str
    spec: Callable[[dict[str, int]], GatewaySpec]
    scenarios: set[str] | None = None


@dataclasses.dataclass
class Comparison:
    """`numerator / denominator` of requests/s, per scenario and connections."""

    numerator: str
    denominator: str
    scenarios: set[str] | None = None
    label: str = ""


def options(connections: str, workers: str) -> dict:
    """The benchmark scripts' command line, parsed into `run`'s keyword arguments:
    `--smoke`, `--rounds N`, `--seconds S`, `--connections 1,8`, `--workers 1,2` (the defaults
    given here). One worker count gives `workers` as an int, several as a list."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="a second per cell, for the test suite")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--connections", default=connections, help="comma-separated")
    ap.add_argument("--workers", default=workers, help="comma-separated")
    a = ap.parse_args()
    counts = [int(w) for w in a.workers.split(",")]
    return {"connections": [int(c) for c in a.connections.split(",")], "workers": counts[0] if len(counts) == 1 else counts,
            "rounds": a.rounds, "seconds": a.seconds, "smoke": a.smoke}


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total


def wrk_script(scenario: Scenario) -> pathlib.Path:
    """The wrk script of a scenario: wrk_report.lua, preceded by the method and body if any."""
    if scenario.method == "GET" and scenario.body is None:
        return BENCH / "wrk_report.lua"
    path = BENCH / "results" / "tmp" / f"wrk-{scenario.name}.lua"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps(scenario.body or "")  # a JSON string is a valid Lua string literal here
    path.write_text(f"wrk.method = {json.dumps(scenario.method)}\nwrk.body = {body}\n"
                    f"dofile({json.dumps(str(BENCH / 'wrk_report.lua'))})\n")
    return path


def run_wrk(url: str, scenario: Scenario, connections: int, seconds: float) -> dict:
    argv = ["taskset", "-c", LOAD_CPUS, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(wrk_script(scenario))]
    for k, v in scenario.headers.items():
        argv += ["-H", f"{k}: {v}"]
    argv.append(url + scenario.path)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def prime(url: str, scenario: Scenario) -> None:
    """Sends the scenario's `prime` requests once (e.g. to exhaust a limit), statuses ignored."""
    import urllib.error
    import urllib.request
    for _ in range(scenario.prime):
        req = urllib.request.Request(url + scenario.path, headers=scenario.headers, method=scenario.method,
                                     data=scenario.body.encode() if scenario.body is not None else None)
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError:
            pass


def machine() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    envoy = subprocess.run([__import__("harness").envoy_binary(), "--version"], capture_output=True, text=True).stdout.strip().split()[-1]
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split()[1]
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "envoy": envoy, "wrk": wrk, "python": platform.python_version()}


def run(name: str, variants: list[Variant], scenarios: list[Scenario], connections: list[int], comparisons: list[Comparison],
        workers: int | list[int] = 1, rounds: int = 3, seconds: float = 5, warmup: float = 1, smoke: bool = False,
        upstream_names: list[str] | None = None, prepare: Callable[[dict[str, object]], None] | None = None) -> dict:
    """Runs the matrix and writes bench/results/<name>.json and .md; returns the results.

    `workers` may be a list: every variant then runs once per worker count, all interleaved in
    the same rounds, and ratios compare variants at the same worker count.

    `upstream_names`: one demo upstream per name, passed to `Variant.spec` as {name: port}
    (default: one, named "upstream"). `prepare(gateways)`, if given, runs once every gateway is
    up and before any measurement, with {variant name: a gateway of that variant}; it may fill
    in scenario headers that need a live gateway (e.g. a cookie minted by a first response)."""
    worker_counts = [workers] if isinstance(workers, int) else list(workers)
    if smoke:
        rounds, seconds, warmup, connections = 1, 1, 0, connections[:1]
    workdir = BENCH / "results" / "tmp" / name
    workdir.mkdir(parents=True, exist_ok=True)
    upstreams: dict[str, DemoUpstream] = {}
    host = EnvoyHost(workdir)
    gateways = {}
    raw: list[dict] = []
    try:
        for n in upstream_names or ["upstream"]:
            upstreams[n] = DemoUpstream("bench-upstream" if upstream_names is None else n, workdir, cpus=LOAD_CPUS)
        for v in variants:
            for w in worker_counts:
                spec = v.spec({n: u.port for n, u in upstreams.items()})
                spec.workers = w
                gateways[(v.name, w)] = host.start(spec, log_level="warn", cpus=GATEWAY_CPUS if w == 1 else None)
        if prepare is not None:
            prepare({vname: g for (vname, _), g in gateways.items()})
        for sc in scenarios:
            for (vname, _), g in gateways.items():
                v = next(x for x in variants if x.name == vname)
                if sc.prime and (v.scenarios is None or sc.name in v.scenarios):
                    prime(g.url, sc)
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for w, sc in ((w, sc) for w in worker_counts for sc in scenarios):
                for conns in connections:
                    for v in order:
                        if v.scenarios is not None and sc.name not in v.scenarios:
                            continue
                        g = gateways[(v.name, w)]
                        if warmup:
                            run_wrk(g.url, sc, conns, warmup)
                        before = cpu_ticks(g.pids)
                        res = run_wrk(g.url, sc, conns, seconds)
                        ticks = cpu_ticks(g.pids) - before
                        rps = res["requests"] / (res["duration_us"] / 1e6)
                        cpu_us = ticks / CLK_TCK * 1e6 / max(res["requests"], 1)
                        row = {"round": r, "scenario": sc.name, "connections": conns, "workers": w, "variant": v.name, "rps": rps,
                               "cpu_us_per_request": cpu_us, **res}
                        if res["socket_errors"] or (res["non_2xx_3xx"] and not sc.expect_non_2xx) or (sc.expect_non_2xx and res["non_2xx_3xx"] < res["requests"]):
                            row["unexpected_status"] = True
                        raw.append(row)
                        print(f"round {r} {sc.name:<22} c={conns:<3} w={w} {v.name:<28} {rps:9.0f} req/s  p50 {res['p50_us']:6d}us p99 {res['p99_us']:6d}us  cpu {cpu_us:6.1f}us/req"
                              + ("  UNEXPECTED STATUS" if row.get("unexpected_status") else ""), flush=True)
    finally:
        for g in gateways.values():
            g.stop()
        for u in upstreams.values():
            u.stop()
    results = {"name": name, "machine": machine(), "workers": workers, "rounds": rounds, "seconds": seconds, "smoke": smoke,
               "raw": raw, "ratios": ratios(raw, comparisons), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    # Not Path.with_suffix: it would turn NAME.smoke into NAME.json, overwriting the real results.
    out = BENCH / "results" / (f"{name}.smoke" if smoke else name)
    out_json, out_md = out.parent / (out.name + ".json"), out.parent / (out.name + ".md")
    out_json.write_text(json.dumps(results, indent=1) + "\n")
    out_md.write_text(markdown(results, comparisons))
    print(out_md.read_text())
    return results


def ratios(raw: list[dict], comparisons: list[Comparison]) -> list[dict]:
    """Per (scenario, connections, workers) cell: the per-round ratios' median, min and max."""
    cell_of = lambda r: (r["scenario"], r["connections"], r.get("workers", 1))
    cells = sorted({cell_of(r) for r in raw})
    out = []
    for c in comparisons:
        for cell in cells:
            sc, conns, w = cell
            if c.scenarios is not None and sc not in c.scenarios:
                continue
            per_round = []
            for rnd in sorted({r["round"] for r in raw}):
                num = [r for r in raw if r["round"] == rnd and cell_of(r) == cell and r["variant"] == c.numerator]
                den = [r for r in raw if r["round"] == rnd and cell_of(r) == cell and r["variant"] == c.denominator]
                if num and den and den[0]["rps"] > 0:
                    per_round.append(num[0]["rps"] / den[0]["rps"])
            if per_round:
                med = lambda v: statistics.median([r[v] for r in raw if cell_of(r) == cell and r["variant"] == c.numerator])
                out.append({"comparison": c.label or f"{c.numerator} / {c.denominator}", "numerator": c.numerator, "denominator": c.denominator,
                            "scenario": sc, "connections": conns, "workers": w, "median": statistics.median(per_round), "min": min(per_round),
                            "max": max(per_round), "numerator_rps_median": med("rps"), "numerator_cpu_us_median": med("cpu_us_per_request")})
    return out


def markdown(results: dict, comparisons: list[Comparison]) -> str:
    m = results["machine"]
    many = not isinstance(results["workers"], int)  # a workers column only when several counts ran
    workers = " and ".join(map(str, results["workers"])) if many else results["workers"]
    wcol, wsep = ("| workers ", "|---") if many else ("", "")
    wval = lambda r: f"| {r.get('workers', 1)} " if many else ""
    lines = [f"# {results['name']}", "",
             f"{results['date']}; {m['cores']} cores ({m['cpu']}), kernel {m['kernel']}, Envoy {m['envoy']}, wrk {m['wrk']}; "
             f"{workers} worker(s); {results['rounds']} interleaved rounds of {results['seconds']} s per cell"
             + (" (SMOKE: figures meaningless)" if results["smoke"] else "") + ".", "",
             "## Ratios of requests/s (median of per-round ratios, [min, max])", "",
             f"| comparison | scenario | conns {wcol}| ratio | [min, max] | numerator req/s | numerator CPU µs/req |", f"|---|---|---{wsep}|---|---|---|---|"]
    for r in results["ratios"]:
        lines.append(f"| {r['comparison']} | {r['scenario']} | {r['connections']} {wval(r)}| **{r['median']:.2f}x** | [{r['min']:.2f}, {r['max']:.2f}] | {r['numerator_rps_median']:.0f} | {r['numerator_cpu_us_median']:.1f} |")
    lines += ["", "## Medians per variant", "", f"| scenario | conns {wcol}| variant | req/s | p50 µs | p99 µs | gateway CPU µs/req |", f"|---|---{wsep}|---|---|---|---|---|"]
    key = lambda r: (r["scenario"], r["connections"], r.get("workers", 1), r["variant"])
    for cell in sorted({key(r) for r in results["raw"]}):
        rows = [r for r in results["raw"] if key(r) == cell]
        md = lambda k: statistics.median(r[k] for r in rows)
        lines.append(f"| {cell[0]} | {cell[1]} {wval(rows[0])}| {cell[3]} | {md('rps'):.0f} | {md('p50_us'):.0f} | {md('p99_us'):.0f} | {md('cpu_us_per_request'):.1f} |")
    bad = [r for r in results["raw"] if r.get("unexpected_status")]
    if bad:
        lines += ["", f"WARNING: {len(bad)} measurements had unexpected statuses or socket errors."]
    return "\n".join(lines) + "\n"
