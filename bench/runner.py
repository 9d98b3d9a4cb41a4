"""Benchmark runner: variants of a gateway measured in one run, interleaved, as ratios.

Every variant's gateway is started once, all pinned to the same cores, and stays idle while the
others are measured. Each round measures every (scenario, connections) cell on every variant in
turn (A B C A B C ...), rotating the order between rounds, so slow drifts of this shared machine
hit all variants alike. For each cell and round the runner computes ratios between variants of
the *same* round; the report gives the median with min and max over rounds.

Per measurement: requests/s, p50/p99 latency and the gateway's CPU time per request (from
/proc/PID/stat of the gateway's processes and their children, utime+stime), since the load
generator shares the machine. The load generator is wrk (the per-filter benchmarks) or k6
(bench/k6/gateway.js, the gateway suite: bench/gateway.py), which then also leaves its JSON
summary per measurement. Hosts (envoy, nginx: lab.HOSTS) are one more dimension:
every (host, variant, workers) gateway takes part in the same interleaved rounds.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
# The repository root for the gateway lab (lab/), tests/e2e for the suites' helpers the
# benchmarks share (litellm.py, ratelimit_engine.py).
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT))

import lab  # noqa: E402
from lab import DemoUpstream, EnvoyNativeFilter, FilterSpec, GatewaySpec  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
GATEWAY_CPUS = "0"
LOAD_CPUS = "1"
K6_SCRIPT = BENCH / "k6" / "gateway.js"
K6_BIN = ROOT / "target" / "tools" / "bin" / "k6"  # installed by scripts/k6.sh


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
    # k6: the scenario is bench/k6/gateway.js's preset of the same name; `env` adds its variables
    # (tokens, cookies, ...). path/headers/body above are then unused.
    env: dict[str, str] = dataclasses.field(default_factory=dict)


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
    # Hosts: both None compares variants on the same host, for each host; otherwise the
    # numerator runs on numerator_host and the denominator on denominator_host (e.g. nginx / envoy).
    numerator_host: str | None = None
    denominator_host: str | None = None
    group: str = ""  # the report's section (and chart) it belongs to


def wasm_floor(all_callbacks: bool = False) -> FilterSpec:
    """The Wasm floor, bench/wasm-floor: a proxy-wasm filter that does nothing. Trimmed by
    scripts/build.sh to the one stream callback any filter that looks at requests needs
    (proxy_on_request_headers, plus the SDK's context create/delete), it is the least a
    proxy-wasm filter costs a host per request. With `all_callbacks`, the untrimmed module, which
    exports every stream callback as the proxy-wasm Rust SDK does (what trimming saves)."""
    return FilterSpec("wasm-floor-all-callbacks" if all_callbacks else "wasm-floor", {})


def options(connections: str, workers: str, hosts: str | None = None, smoke_workers: str | None = None,
            name: str | None = None) -> dict:
    """The benchmark scripts' command line, parsed into `run`'s keyword arguments:
    `--smoke`, `--rounds N`, `--seconds S`, `--connections 1,8`, `--workers 1,2` (the defaults
    given here), `--scenarios a,b` (a subset). One worker count gives `workers` as an int,
    several as a list. With `hosts`, also `--hosts envoy,nginx`. With `smoke_workers`, the worker
    counts of `--smoke` when `--workers` is not given. With `name` (the benchmark's), also
    `--name NAME`: the report's name (`run`'s first argument, under "name"), so that a run of
    some cells does not overwrite the last full report."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="a second per cell, for the test suite")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--connections", default=connections, help="comma-separated")
    ap.add_argument("--workers", default=None, help=f"comma-separated (default {workers})")
    ap.add_argument("--scenarios", default=None, help="comma-separated subset of the scenarios")
    if hosts is not None:
        ap.add_argument("--hosts", default=hosts, help="comma-separated; a host that is not available is skipped with a note")
    if name is not None:
        ap.add_argument("--name", default=name, help=f"the report's name (default {name}: bench/results/{name}.md)")
    a = ap.parse_args()
    wanted = a.workers or (smoke_workers if a.smoke and smoke_workers else workers)
    counts = [int(w) for w in wanted.split(",")]
    out = {"connections": [int(c) for c in a.connections.split(",")], "workers": counts[0] if len(counts) == 1 else counts,
           "rounds": a.rounds, "seconds": a.seconds, "smoke": a.smoke,
           "only": a.scenarios.split(",") if a.scenarios else None}
    if hosts is not None:
        out["hosts"] = [h for h in a.hosts.split(",") if h]
    if name is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", a.name):
            ap.error(f"--name {a.name!r}: letters, digits, '_', '.', '-' only")
        out["name"] = a.name
    return out


def process_tree(pids: list[int]) -> list[int]:
    """`pids` and all their descendants (e.g. nginx's master and its workers)."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.append(pid)
            todo += children.get(pid, [])
    return out


def cpu_ticks(pids: list[int]) -> int:
    """utime+stime of `pids` and their descendants, in clock ticks."""
    total = 0
    for pid in process_tree(pids):
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


def k6_binary() -> str:
    """The pinned k6 of scripts/k6.sh (not whatever `k6` is on PATH)."""
    if not K6_BIN.exists():
        raise RuntimeError(f"{K6_BIN} is missing: run scripts/k6.sh")
    return str(K6_BIN)


def run_k6(url: str, scenario: Scenario, connections: int, seconds: float, summary: pathlib.Path | None = None,
           tags: dict[str, str] | None = None, pin: bool = True) -> dict:
    """One run of bench/k6/gateway.js (preset `scenario.name`, `connections` VUs, `seconds`).
    Returns wrk-like totals (requests, duration_us, p50_us, p99_us, non_2xx_3xx, socket_errors)
    plus k6's check and threshold results and, when `summary` is given, k6's summary (also
    written there by the script's handleSummary)."""
    env = {"BASE_URL": url, "SCENARIO": scenario.name, "VUS": str(connections), "DURATION": f"{max(seconds, 1):g}s",  # k6: >= 1 s
           **scenario.env, **{f"TAG_{k.upper()}": v for k, v in (tags or {}).items()}}
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.unlink(missing_ok=True)
        env["SUMMARY_JSON"] = str(summary)
    argv = (["taskset", "-c", LOAD_CPUS] if pin else []) + [k6_binary(), "run", "--quiet", "--no-color", "--address", ""]
    for k, v in env.items():
        argv += ["-e", f"{k}={v}"]
    argv.append(str(K6_SCRIPT))
    proc_env = os.environ | {"K6_NO_USAGE_REPORT": "true"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, env=proc_env, cwd=BENCH)
    if r.returncode not in (0, 99):  # 99: a threshold was crossed (reported, not fatal here)
        raise RuntimeError(f"k6 exited with {r.returncode}: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    if summary is None:
        return {"k6_exit": r.returncode}
    data = json.loads(summary.read_text())
    m, name = data["metrics"], scenario.name
    val = lambda metric, key, default=0: m.get(f"{metric}{{scenario:{name}}}", {}).get("values", {}).get(key, default)
    requests = int(val("http_reqs", "count"))
    failed = int(val("http_req_failed", "passes"))
    return {"requests": requests, "duration_us": int(data["state"]["testRunDurationMs"] * 1000),
            "p50_us": round(val("http_req_duration", "med") * 1000), "p99_us": round(val("http_req_duration", "p(99)") * 1000),
            "non_2xx_3xx": failed, "socket_errors": 0, "checks_passed": int(val("checks", "passes")),
            "checks_failed": int(val("checks", "fails")), "k6_exit": r.returncode,
            "thresholds_ok": all(t.get("ok", True) for metric in m.values() for t in (metric.get("thresholds") or {}).values()),
            "summary": data}


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


def tool_version(argv: list[str], pick: Callable[[str], str]) -> str:
    """`pick` applied to the output of `argv`, or "absent"."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        return pick(r.stdout + r.stderr)
    except (OSError, IndexError, RuntimeError, subprocess.SubprocessError):
        return "absent"


def machine(load: str = "wrk", hosts: list[str] | None = None) -> dict:
    """The machine (CPU model and cores from /proc/cpuinfo) and the versions of what was measured."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    out = {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
           "envoy": tool_version([lab.envoy_binary(), "--version"], lambda t: t.strip().split()[-1])}
    if load == "wrk":
        out["wrk"] = tool_version(["wrk", "-v"], lambda t: t.split()[1])
    else:
        out["k6"] = tool_version([k6_binary(), "version"], lambda t: t.splitlines()[0].removeprefix("k6 "))
    if "nginx" in (hosts or []):
        out["nginx"] = tool_version([lab.NGINX_BINARY, "-v"], lambda t: t.strip().rsplit("/", 1)[-1])
        lock = ROOT / "nginx-compat" / "Cargo.lock"  # the module's Wasm runtime
        found = re.search(r'name = "wasmtime"\nversion = "([^"]+)"', lock.read_text()) if lock.exists() else None
        out["wasmtime"] = found.group(1) if found else "?"
    # The compiler of the wasm filters: rustup's toolchain, or Debian's with build-std (scripts/build.sh).
    rustc = "/usr/bin/rustc" if (ROOT / ".cache" / "wasm-from-build-std").exists() else "rustc"
    out["rustc"] = tool_version([rustc, "--version"], lambda t: t.split()[1])
    return out


def host_unavailable(name: str) -> str | None:
    """Why host `name` cannot run here (its class's `unavailable()`: what is not built or
    installed), or None."""
    cls = lab.HOSTS.get(name)
    if cls is None:
        return "not in lab.HOSTS"
    return cls.unavailable()


def runs_on(host: str, spec: GatewaySpec) -> bool:
    """Envoy's native filters exist on Envoy only."""
    return host == "envoy" or not any(isinstance(f, EnvoyNativeFilter) for f in spec.filters)


def gateway_pids(g: Any) -> list[int]:
    """The processes whose CPU time (with their children's) is the gateway's."""
    pids = getattr(g, "pids", None)
    if pids:
        return list(pids)
    proc = getattr(getattr(g, "process", None), "proc", None)
    if proc is not None:
        return [proc.pid]
    raise RuntimeError(f"{type(g).__name__} has neither `pids` nor `process`: its CPU time cannot be measured")


def start_gateway(host: Any, spec: GatewaySpec, cpus: str | None) -> Any:
    """host.start(spec) with the keyword arguments the host takes; pins it to `cpus` with taskset
    afterwards when the host cannot do it itself."""
    params = inspect.signature(host.start).parameters
    kwargs: dict[str, Any] = {}
    if "log_level" in params:
        kwargs["log_level"] = "warn"
    if "cpus" in params:
        kwargs["cpus"] = cpus
    g = host.start(spec, **kwargs)
    if cpus and "cpus" not in params:
        for pid in process_tree(gateway_pids(g)):
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)
    return g


def run(name: str, variants: list[Variant], scenarios: list[Scenario], connections: list[int], comparisons: list[Comparison],
        workers: int | list[int] = 1, rounds: int = 3, seconds: float = 5, warmup: float = 1, smoke: bool = False,
        upstream_names: list[str] | None = None, prepare: Callable[[dict[str, object]], None] | None = None,
        hosts: list[str] | None = None, load: str = "wrk", only: list[str] | None = None,
        report: Callable[[dict, list[Comparison], pathlib.Path], str] | None = None,
        side_processes: Callable[[], dict[str, list[int]]] | None = None) -> dict:
    """Runs the matrix and writes bench/results/<name>.json and .md; returns the results.

    `workers` may be a list: every variant then runs once per worker count, all interleaved in
    the same rounds, and ratios compare variants at the same worker count.

    `hosts` (default ["envoy"]): every variant runs on each available host (a host that is not,
    see host_unavailable, is skipped with a printed note, and so is a variant that fails to start
    on a host other than Envoy; variants with Envoy's native filters run on Envoy only), all in
    the same rounds. `load`: "wrk" or "k6"; with k6, the summary of
    every measurement goes to bench/results/<name>/k6/<host>/w<workers>-c<connections>/
    <scenario>--<variant>.json (one entry per round). `only`: run these scenarios only.
    `report(results, comparisons, files_dir)` returns the markdown report (default: `markdown`);
    files_dir is bench/results/<name>/, for its charts.

    `upstream_names`: one demo upstream per name, passed to `Variant.spec` as {name: port}
    (default: one, named "upstream"). `prepare(gateways)`, if given, runs once every gateway is
    up and before any measurement, with {variant name: a gateway of that variant}; it may fill
    in scenario headers that need a live gateway (e.g. a cookie minted by a first response).

    `side_processes()`, if given, names processes outside the gateways whose CPU time the
    requests also cost (e.g. {"service": [pid], "redis": [pid]}, the global limits' engine); it
    is called per measurement (a process may have been restarted) and each row gets
    `side_cpu_us_per_request` {name: µs of utime+stime per request, descendants included},
    measured over the same interval as the gateway's."""
    worker_counts = [workers] if isinstance(workers, int) else list(workers)
    if only:
        unknown = set(only) - {sc.name for sc in scenarios}
        if unknown:
            raise SystemExit(f"unknown scenarios {sorted(unknown)}; known: {[sc.name for sc in scenarios]}")
        scenarios = [sc for sc in scenarios if sc.name in only]
    if smoke:
        rounds, seconds, warmup, connections = 1, 1, 0, connections[:1]
    skipped: dict[str, str] = {}
    available = []
    for h in hosts or ["envoy"]:
        why = host_unavailable(h)
        if why:
            skipped[h] = why
            print(f"NOTE: skipping host {h}: {why}", flush=True)
        else:
            available.append(h)
    if not available:
        raise SystemExit("no host to measure")
    out = BENCH / "results" / (f"{name}.smoke" if smoke else name)
    files_dir = out.parent / out.name  # bench/results/<name>[.smoke]/: k6 summaries, charts
    if load == "k6":
        shutil.rmtree(files_dir / "k6", ignore_errors=True)
    workdir = BENCH / "results" / "tmp" / name
    workdir.mkdir(parents=True, exist_ok=True)
    upstreams: dict[str, DemoUpstream] = {}
    gateways: dict[tuple[str, str, int], Any] = {}  # (host, variant, workers)
    raw: list[dict] = []
    summaries: dict[pathlib.Path, dict] = {}
    try:
        for n in upstream_names or ["upstream"]:
            upstreams[n] = DemoUpstream("bench-upstream" if upstream_names is None else n, workdir, cpus=LOAD_CPUS)
        for h in available:
            host = lab.HOSTS[h](workdir)
            for v in variants:
                for w in worker_counts:
                    spec = v.spec({n: u.port for n, u in upstreams.items()})
                    spec.workers = w
                    if not runs_on(h, spec):
                        continue
                    try:
                        gateways[(h, v.name, w)] = start_gateway(host, spec, GATEWAY_CPUS if w == 1 else None)
                    except Exception as e:  # noqa: BLE001 - a host in the making may not run every variant yet
                        if h == "envoy":
                            raise
                        skipped[f"{h}: {v.name}, {w} worker(s)"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                        print(f"NOTE: skipping {v.name} ({w} worker(s)) on {h}: {e}", flush=True)
        by_variant: dict[str, object] = {}
        for (_, vname, _), g in gateways.items():
            by_variant.setdefault(vname, g)
        if prepare is not None:
            prepare(by_variant)
        runs = lambda vname, sc: (lambda v: v.scenarios is None or sc.name in v.scenarios)(next(x for x in variants if x.name == vname))
        for sc in scenarios:
            for (_, vname, _), g in gateways.items():
                if sc.prime and runs(vname, sc):
                    prime(g.url, sc)
        for r in range(rounds):
            for w, sc in ((w, sc) for w in worker_counts for sc in scenarios):
                cell = [k for k in gateways if k[2] == w and runs(k[1], sc)]
                order = cell[r % len(cell):] + cell[: r % len(cell)] if cell else []
                for conns in connections:
                    for key in order:
                        h, vname, _ = key
                        g = gateways[key]
                        pids = gateway_pids(g)
                        side = side_processes() if side_processes is not None else {}
                        if load == "k6":
                            if warmup:
                                run_k6(g.url, sc, conns, warmup)
                            before = cpu_ticks(pids)
                            side_before = {k: cpu_ticks(v) for k, v in side.items()}
                            res = run_k6(g.url, sc, conns, seconds, summary=workdir / "k6-summary.json",
                                         tags={"host": h, "variant": vname, "workers": str(w)})
                        else:
                            if warmup:
                                run_wrk(g.url, sc, conns, warmup)
                            before = cpu_ticks(pids)
                            side_before = {k: cpu_ticks(v) for k, v in side.items()}
                            res = run_wrk(g.url, sc, conns, seconds)
                        ticks = cpu_ticks(pids) - before
                        side_ticks = {k: cpu_ticks(v) - side_before[k] for k, v in side.items()}
                        rps = res["requests"] / (res["duration_us"] / 1e6)
                        cpu_us = ticks / CLK_TCK * 1e6 / max(res["requests"], 1)
                        summary = res.pop("summary", None)
                        row = {"round": r, "host": h, "scenario": sc.name, "connections": conns, "workers": w, "variant": vname, "rps": rps,
                               "cpu_us_per_request": cpu_us, "loadavg_1m": os.getloadavg()[0], **res}
                        if side:
                            row["side_cpu_us_per_request"] = {k: t / CLK_TCK * 1e6 / max(res["requests"], 1) for k, t in side_ticks.items()}
                        if summary is not None:
                            path = files_dir / "k6" / h / f"w{w}-c{conns}" / f"{sc.name}--{vname}.json"
                            entry = summaries.setdefault(path, {"host": h, "variant": vname, "scenario": sc.name, "workers": w,
                                                                "connections": conns, "rounds": []})
                            entry["rounds"].append({"round": r, "summary": summary})
                            path.parent.mkdir(parents=True, exist_ok=True)
                            path.write_text(json.dumps(entry, indent=1) + "\n")
                            row["k6_summary"] = str(path.relative_to(BENCH / "results"))
                            bad = (not res["requests"] or res["non_2xx_3xx"] or res["checks_failed"] or not res["thresholds_ok"])
                        else:
                            bad = (res["socket_errors"] or (res["non_2xx_3xx"] and not sc.expect_non_2xx)
                                   or (sc.expect_non_2xx and res["non_2xx_3xx"] < res["requests"]))
                        if bad:
                            row["unexpected_status"] = True
                        raw.append(row)
                        hostcol = f"{h:<6} " if len(available) > 1 or load == "k6" else ""
                        print(f"round {r} {hostcol}{sc.name:<22} c={conns:<3} w={w} {vname:<28} {rps:9.0f} req/s  p50 {res['p50_us']:6d}us p99 {res['p99_us']:6d}us  cpu {cpu_us:6.1f}us/req"
                              + ("  UNEXPECTED STATUS" if row.get("unexpected_status") else ""), flush=True)
    finally:
        for g in gateways.values():
            g.stop()
        for u in upstreams.values():
            u.stop()
    results = {"name": name, "machine": machine(load, available), "load": load, "hosts": available, "skipped_hosts": skipped,
               "workers": workers, "connections": connections, "rounds": rounds, "seconds": seconds, "smoke": smoke,
               "raw": raw, "ratios": ratios(raw, comparisons), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    # Not Path.with_suffix: it would turn NAME.smoke into NAME.json, overwriting the real results.
    out_json, out_md = out.parent / (out.name + ".json"), out.parent / (out.name + ".md")
    out_json.write_text(json.dumps(results, indent=1) + "\n")
    out_md.write_text(report(results, comparisons, files_dir) if report else markdown(results, comparisons))
    print(out_md.read_text())
    return results


def ratios(raw: list[dict], comparisons: list[Comparison]) -> list[dict]:
    """Per comparison, host pair and (scenario, connections, workers) cell: the median, min and
    max over rounds of the same-round ratios of requests/s and of gateway CPU time per request."""
    cell_of = lambda r: (r["scenario"], r["connections"], r.get("workers", 1))
    host_of = lambda r: r.get("host", "envoy")
    cells = sorted({cell_of(r) for r in raw})
    hosts = list(dict.fromkeys(host_of(r) for r in raw))
    rounds = sorted({r["round"] for r in raw})
    out = []
    for c in comparisons:
        if c.numerator_host is None and c.denominator_host is None:
            pairs = [(h, h) for h in hosts]
        else:
            pairs = [(c.numerator_host or c.denominator_host, c.denominator_host or c.numerator_host)]
        for nh, dh in pairs:
            for cell in cells:
                sc, conns, w = cell
                if c.scenarios is not None and sc not in c.scenarios:
                    continue
                rows = lambda variant, host: [r for r in raw if cell_of(r) == cell and r["variant"] == variant and host_of(r) == host]
                num_rows, den_rows = rows(c.numerator, nh), rows(c.denominator, dh)
                per_round, cpu_per_round = [], []
                for rnd in rounds:
                    num = [r for r in num_rows if r["round"] == rnd]
                    den = [r for r in den_rows if r["round"] == rnd]
                    if num and den and den[0]["rps"] > 0:
                        per_round.append(num[0]["rps"] / den[0]["rps"])
                        if den[0]["cpu_us_per_request"] > 0:
                            cpu_per_round.append(num[0]["cpu_us_per_request"] / den[0]["cpu_us_per_request"])
                if not per_round:
                    continue
                med = lambda rs, k: statistics.median(r[k] for r in rs)
                out.append({"comparison": c.label or f"{c.numerator} / {c.denominator}", "group": c.group,
                            "numerator": c.numerator, "denominator": c.denominator,
                            "host": nh if nh == dh else f"{nh} / {dh}", "numerator_host": nh, "denominator_host": dh,
                            "scenario": sc, "connections": conns, "workers": w, "rounds": len(per_round),
                            "median": statistics.median(per_round), "min": min(per_round), "max": max(per_round),
                            "cpu_median": statistics.median(cpu_per_round) if cpu_per_round else None,
                            "cpu_min": min(cpu_per_round) if cpu_per_round else None,
                            "cpu_max": max(cpu_per_round) if cpu_per_round else None,
                            "numerator_rps_median": med(num_rows, "rps"), "numerator_cpu_us_median": med(num_rows, "cpu_us_per_request"),
                            "numerator_p99_us_median": med(num_rows, "p99_us"),
                            "denominator_rps_median": med(den_rows, "rps"), "denominator_cpu_us_median": med(den_rows, "cpu_us_per_request")})
    return out


def markdown(results: dict, comparisons: list[Comparison]) -> str:
    m = results["machine"]
    many = not isinstance(results["workers"], int)  # a workers column only when several counts ran
    workers = " and ".join(map(str, results["workers"])) if many else results["workers"]
    wcol, wsep = ("| workers ", "|---") if many else ("", "")
    wval = lambda r: f"| {r.get('workers', 1)} " if many else ""
    several = len(results.get("hosts", ["envoy"])) > 1  # a host column only when several hosts ran
    hcol, hsep = ("host | ", "---|") if several else ("", "")
    hval = lambda r: f"{r.get('host', 'envoy')} | " if several else ""
    cpu_ratio = lambda r: f"{r['cpu_median']:.2f}x" if r.get("cpu_median") is not None else "-"
    load = f"k6 {m['k6']}" if "k6" in m else f"wrk {m.get('wrk', '?')}"
    lines = [f"# {results['name']}", "",
             f"{results['date']}; {m['cores']} cores ({m['cpu']}), kernel {m['kernel']}, Envoy {m['envoy']}, {load}; "
             f"{workers} worker(s); {results['rounds']} interleaved rounds of {results['seconds']} s per cell"
             + (" (SMOKE: figures meaningless)" if results["smoke"] else "") + ".", "",
             "## Ratios of requests/s (median of per-round ratios, [min, max])", "",
             f"| {hcol}comparison | scenario | conns {wcol}| ratio | [min, max] | CPU/req ratio | numerator req/s | numerator CPU µs/req |",
             f"|{hsep}---|---|---{wsep}|---|---|---|---|---|"]
    for r in results["ratios"]:
        lines.append(f"| {hval(r)}{r['comparison']} | {r['scenario']} | {r['connections']} {wval(r)}| **{r['median']:.2f}x** | [{r['min']:.2f}, {r['max']:.2f}] "
                     f"| {cpu_ratio(r)} | {r['numerator_rps_median']:.0f} | {r['numerator_cpu_us_median']:.1f} |")
    lines += ["", "## Medians per variant", "", f"| {hcol}scenario | conns {wcol}| variant | req/s | p50 µs | p99 µs | gateway CPU µs/req |",
              f"|{hsep}---|---{wsep}|---|---|---|---|---|"]
    key = lambda r: (r.get("host", "envoy"), r["scenario"], r["connections"], r.get("workers", 1), r["variant"])
    for cell in sorted({key(r) for r in results["raw"]}):
        rows = [r for r in results["raw"] if key(r) == cell]
        md = lambda k: statistics.median(r[k] for r in rows)
        lines.append(f"| {hval(rows[0])}{cell[1]} | {cell[2]} {wval(rows[0])}| {cell[4]} | {md('rps'):.0f} | {md('p50_us'):.0f} | {md('p99_us'):.0f} | {md('cpu_us_per_request'):.1f} |")
    bad = [r for r in results["raw"] if r.get("unexpected_status")]
    if bad:
        lines += ["", f"WARNING: {len(bad)} measurements had unexpected statuses or socket errors."]
    return "\n".join(lines) + "\n"
