"""Start and reload of nginx with the full chain: seconds from `nginx` (or SIGHUP) to the first
request the chain serves, without and with the compiled-code cache (`tollgate_compiled_cache`).

Variants, interleaved in each round (a fresh prefix per cell):
- `no-cache`: every start and reload compiles the five filters (the master, before fork);
- `cache-cold`: an empty cache directory: compiled and stored (what the first start after a new
  build costs); its reload loads what the start stored;
- `cache-warm`: the cache filled by an earlier start of the same build: loaded, not compiled.

Per cell: the full chain of bench/instructions.py (metrics, jwt-auth, rate-limit, cost,
sticky-upstream; `full`), `worker_processes W`, the three demo upstreams up. `start` is the time
from spawning `nginx` to the first 200 from an upstream for bench/instructions.py's request
(polled every 10 ms on new connections); `reload` is the time from SIGHUP to the first 200
served by a worker of the new generation (a worker pid the master did not have before), the
compilation being done by the master between the two. `nginx -t` is timed too (it compiles as a
start does).

    python3 bench/startup.py                      # 2 workers, 3 rounds
    python3 bench/startup.py --workers 8 --rounds 3
    python3 bench/startup.py --smoke              # one round: tests/e2e/test_bench_smoke.py
    python3 bench/startup.py --module main=/tmp/main.so --module now=target/nginx/ngx_http_tollgate_wasm_module.so
    python3 bench/startup.py --chain jwt-auth --cpus 0,1 ...   # one filter (a variant of instructions.py), nginx on CPUs 0-1

Writes bench/results/startup.json and .md (medians with min and max)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import signal
import statistics
import subprocess
import time

import runner  # also puts the repository root (lab) and tests/e2e on sys.path

import instructions
import jwt_auth
import lab
import sticky_upstream

BENCH = pathlib.Path(__file__).resolve().parent
VARIANTS = ["no-cache", "cache-cold", "cache-warm"]
POLL_S = 0.01
TIMEOUT_S = 120


def first_200(port: int, request: instructions.Request, since: float, pids_before: set[int] | None = None,
              master: int | None = None) -> float:
    """Seconds from `since` until `request` gets a 200 from an upstream on a new connection (and,
    with `pids_before`, from a worker of `master` not among them: the answer's worker is not
    visible, so a new worker set must exist first)."""
    while time.monotonic() - since < TIMEOUT_S:
        if pids_before is not None and master is not None:
            now = set(children(master))
            if not now or now & pids_before:
                time.sleep(POLL_S)
                continue
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request(request.method, request.path, body=request.body, headers=request.headers)
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return time.monotonic() - since
        except OSError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"no 200 within {TIMEOUT_S} s")


def machine() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    nginx = subprocess.run([str(lab.NGINX_BINARY), "-v"], capture_output=True, text=True).stderr.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "nginx": nginx.rsplit("/", 1)[-1]}


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cell(variant: str, workers: int, spec: lab.GatewaySpec, request: instructions.Request, prefix: pathlib.Path,
         warm_cache: pathlib.Path, module: pathlib.Path | None = None, cpus: str | None = None) -> dict:
    prefix.mkdir(parents=True)
    port, admin = lab.free_port(), lab.free_port()
    conf_text = lab.nginx_config(spec, prefix, port, admin, prefix / "error.log", "notice", module)
    conf_text = conf_text.replace(f"worker_processes {spec.workers};", f"worker_processes {workers};")
    cache = {"no-cache": None, "cache-cold": prefix / "cache", "cache-warm": warm_cache}[variant]
    if cache is not None:
        conf_text = conf_text.replace("wasm {\n", f"wasm {{\n    tollgate_compiled_cache {cache};\n", 1)
    conf = prefix / "nginx.conf"
    conf.write_text(conf_text)
    argv = (["taskset", "-c", cpus] if cpus else []) + \
        [str(lab.NGINX_BINARY), "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    t0 = time.monotonic()
    subprocess.run(argv + ["-t", "-q"], check=True, capture_output=True, timeout=TIMEOUT_S)
    nginx_t = time.monotonic() - t0
    if variant == "cache-cold":
        subprocess.run(["rm", "-rf", str(cache)], check=True)  # -t filled it
    stderr = open(prefix / "stderr.log", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        start = first_200(port, request, t0)
        before = set(children(proc.pid))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        reload = first_200(port, request, t0, before, proc.pid)
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        stderr.close()
    log = (prefix / "error.log").read_text(errors="replace")
    return {"nginx_t": nginx_t, "start": start, "reload": reload,
            "reused": log.count("compiled code reused"), "compiled": log.count("; stored")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default=None)
    ap.add_argument("--smoke", action="store_true", help="one round (startup.smoke.*): checks that it runs")
    ap.add_argument("--wasm", action="append", default=[], metavar="LABEL=DIR",
                    help="a build of the filters (repeatable): builds compared in the same rounds, interleaved "
                         "(default: the built filters alone)")
    ap.add_argument("--module", action="append", default=[], metavar="LABEL=PATH",
                    help="a build of the nginx module (repeatable), with the built filters: compared as --wasm")
    ap.add_argument("--chain", default="full",
                    help="the filters: a variant of bench/instructions.py (default full: the five filters)")
    ap.add_argument("--cpus", default=None, metavar="LIST",
                    help="run nginx (master and workers) on these CPUs only (taskset -c LIST): compilation's "
                         "threads follow the CPUs nginx may use")
    a = ap.parse_args()
    if a.wasm and a.module:
        raise SystemExit("--wasm or --module, not both")
    pairs = [tuple(w.split("=", 1)) for w in a.wasm or a.module]
    if any(len(b) != 2 for b in pairs):
        raise SystemExit("--wasm wants LABEL=DIR, --module LABEL=PATH")
    # (label, filters' directory or None, module or None); none given: the built ones.
    builds = [(label, None, pathlib.Path(path).resolve()) if a.module else (label, path, None) for label, path in pairs] \
        or [("built", None, None)]
    default_wasm = lab.paths.WASM_DIR
    # One build: rows named by variant (as before); several: "LABEL VARIANT".
    row_name = (lambda label, v: v) if len(builds) == 1 else (lambda label, v: f"{label} {v}")
    if a.smoke:
        a.rounds = 1
    a.name = a.name or ("startup.smoke" if a.smoke else "startup")
    workdir = BENCH / "results" / "tmp" / a.name
    subprocess.run(["rm", "-rf", str(workdir)], check=True)
    workdir.mkdir(parents=True)
    keys = jwt_auth.make_keys(ttl=86400)
    request = instructions.stack_full_request(keys)
    upstreams = {}
    runs: dict[str, list[dict]] = {row_name(label, v): [] for label, _, _ in builds for v in VARIANTS}
    try:
        for name in sticky_upstream.UPSTREAMS:
            upstreams[name] = lab.DemoUpstream(name, workdir)
        ports = {k: u.port for k, u in upstreams.items()}
        spec = instructions.variant_spec(a.chain, keys, ports)
        for label, wasm, module in builds:
            lab.paths.WASM_DIR = pathlib.Path(wasm) if wasm else default_wasm
            cell("cache-warm", a.workers, spec, request, workdir / f"fill-{label}", workdir / f"warm-cache-{label}",
                 module, a.cpus)  # fills it (its -t)
        for r in range(a.rounds):
            for label, wasm, module in builds:
                lab.paths.WASM_DIR = pathlib.Path(wasm) if wasm else default_wasm
                for v in VARIANTS:
                    name = row_name(label, v)
                    row = cell(v, a.workers, spec, request, workdir / f"{label}-{v}-{r + 1}", workdir / f"warm-cache-{label}",
                               module, a.cpus)
                    runs[name].append(row)
                    print(f"round {r + 1} {name}: nginx -t {row['nginx_t']:.2f} s, start {row['start']:.2f} s, "
                          f"reload {row['reload']:.2f} s (modules reused {row['reused']}, stored {row['compiled']})", flush=True)
    finally:
        for u in upstreams.values():
            u.stop()
    summary = {v: {k: {"median": statistics.median(x[k] for x in rs), "min": min(x[k] for x in rs),
                       "max": max(x[k] for x in rs)} for k in ("nginx_t", "start", "reload")} for v, rs in runs.items()}
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(),
              "workers": a.workers, "rounds": a.rounds, "runs": runs, "summary": summary,
              "chain": a.chain, "cpus": a.cpus,
              "command": f"python3 bench/startup.py --workers {a.workers} --rounds {a.rounds}"
                         + (f" --chain {a.chain}" if a.chain != "full" else "") + (f" --cpus {a.cpus}" if a.cpus else "")
                         + "".join(f" --wasm {label}={wasm}" for label, wasm, _ in builds if wasm)
                         + "".join(f" --module {label}={module}" for label, _, module in builds if module)}
    out = BENCH / "results"
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    fmt = lambda s: f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"
    chain = "the full chain" if a.chain == "full" else f"the `{a.chain}` chain"
    where = f", nginx on CPUs {a.cpus}" if a.cpus else ""
    lines = [f"# Start and reload with {chain} ({a.workers} workers{where})", "",
             f"{result['date']}; {result['machine'].get('cpu', '')}, {os.cpu_count()} CPUs.", "",
             f"    {result['command']}", "",
             "Seconds, median (min–max) of the rounds: `nginx -t`; `start`, from spawning nginx to the first 200 "
             "through the chain; `reload`, from SIGHUP to the first 200 from a new worker.", "",
             "| variant | nginx -t | start | reload |", "|---|---|---|---|"]
    for v, s in summary.items():
        lines.append(f"| {v} | {fmt(s['nginx_t'])} | {fmt(s['start'])} | {fmt(s['reload'])} |")
    (out / f"{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
