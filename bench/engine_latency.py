"""What the global limits' engine costs on its own: ShouldRateLimit latency from the direct gRPC
client (tests/e2e/ratelimit_engine.py) at 1, 8 and 32 concurrent streams on one HTTP/2
connection (as one gateway worker's connection to the service), and the engine's CPU per call.

Two variants, interleaved per round (order rotated), each cell `--seconds` long:
  - "service + Redis": a 1-hit charge on one shared descriptor of the `tollgate` domain with a
    limit override that is never reached (the allow path: one INCRBY + EXPIRE pipeline);
  - "service only": the same call for a domain the engine is not configured with, which it
    answers without a limit and without touching Redis (config_impl.go, GetLimit).
The Python client's own cost (grpcio, threads under the GIL) is in both; their difference is
what Redis adds. CPU time is utime+stime of the service and of redis-server from /proc, per
call. Writes results/engine_latency.{json,md} (--smoke: a second per cell, *.smoke.*).

Usage: .venv/bin/python bench/engine_latency.py [--smoke] [--rounds 3] [--seconds 5] [--streams 1,8,32]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))

import grpc  # noqa: E402

from ratelimit_engine import Code, RatelimitEngine, RlsClient, Unit, descriptor  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15), in seconds."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_cell(client: RlsClient, domain: str, streams: int, seconds: float, pids: dict[str, int]) -> dict:
    """`streams` threads calling back to back on one channel for `seconds`: latencies (ms),
    calls/s, errors, the engine's CPU per call (µs)."""
    request = [descriptor({"bench": "engine_latency"}, 4_000_000_000, Unit.HOUR, hits_addend=1)]
    latencies: list[list[float]] = [[] for _ in range(streams)]
    errors = [0] * streams
    stop = threading.Event()

    def worker(i: int) -> None:
        own = latencies[i]
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = client.should_rate_limit(request, domain=domain, timeout=2)
                if r.overall_code != Code.OK:
                    errors[i] += 1
            except grpc.RpcError:
                errors[i] += 1
                continue
            own.append((time.perf_counter() - t0) * 1000)

    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    values = sorted(v for own in latencies for v in own)
    calls = len(values)
    return {
        "calls": calls, "errors": sum(errors), "calls_per_s": calls / elapsed,
        "p50_ms": percentile(values, 0.50), "p90_ms": percentile(values, 0.90), "p99_ms": percentile(values, 0.99),
        "cpu_us_per_call": {name: (c / calls * 1e6 if calls else float("nan")) for name, c in cpu.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one round, a second per cell")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--streams", default="1,8,32")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds = 1, 1
    streams_list = [int(s) for s in args.streams.split(",")]
    variants = {"service + Redis": "tollgate", "service only": "not-configured"}
    cells: dict[str, dict[int, list[dict]]] = {v: {s: [] for s in streams_list} for v in variants}

    load_before = os.getloadavg()
    with RatelimitEngine() as engine, RlsClient(engine.grpc_address) as client:
        pids = {"service": engine.service.pid, "redis": engine.redis.pid}
        run_cell(client, "tollgate", 4, 0.5, pids)  # warm-up: connections, pool
        for rnd in range(args.rounds):
            order = list(variants)[rnd % 2:] + list(variants)[:rnd % 2]
            for streams in streams_list:
                for name in order:
                    cell = run_cell(client, variants[name], streams, args.seconds, pids)
                    cells[name][streams].append(cell)
                    print(f"round {rnd + 1} {name:16} {streams:2} streams: {cell['calls_per_s']:7.0f} calls/s "
                          f"p50 {cell['p50_ms']:.3f} ms p99 {cell['p99_ms']:.3f} ms errors {cell['errors']}",
                          file=sys.stderr)

    load_after = os.getloadavg()
    suffix = ".smoke" if args.smoke else ""
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"engine_latency{suffix}.json").write_text(json.dumps(
        {"rounds": args.rounds, "seconds": args.seconds, "cpus": os.cpu_count(),
         "loadavg_before": load_before, "loadavg_after": load_after, "cells": cells}, indent=1, default=str))

    def med(name: str, streams: int, key: str, sub: str | None = None) -> tuple[float, float, float]:
        vals = [c[key][sub] if sub else c[key] for c in cells[name][streams]]
        return statistics.median(vals), min(vals), max(vals)

    def fmt(t: tuple[float, float, float], digits: int = 3) -> str:
        return f"{t[0]:.{digits}f} [{t[1]:.{digits}f}, {t[2]:.{digits}f}]"

    lines = [
        "# ShouldRateLimit from the direct gRPC client: the engine on its own",
        "",
        f"`bench/engine_latency.py{' --smoke' if args.smoke else ''}`: {args.rounds} interleaved rounds x "
        f"{args.seconds:g} s per cell; medians over rounds [min, max]. One HTTP/2 connection, N "
        "concurrent streams (threads of grpcio, under Python's GIL: the client's cost is in every "
        "number). envoyproxy/ratelimit at 3fb702589d36 and Redis 7.0 (scripts/ratelimit.sh) on loopback, "
        f"same machine as the client ({os.cpu_count()} CPUs; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after: other work on the machine shows in the p99s).",
        "",
        "| streams | variant | calls/s | p50 ms | p99 ms | service CPU µs/call | Redis CPU µs/call | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for streams in streams_list:
        for name in variants:
            errors = sum(c["errors"] for c in cells[name][streams])
            lines.append(
                f"| {streams} | {name} | {fmt(med(name, streams, 'calls_per_s'), 0)} | {fmt(med(name, streams, 'p50_ms'))} "
                f"| {fmt(med(name, streams, 'p99_ms'))} | {fmt(med(name, streams, 'cpu_us_per_call', 'service'), 1)} "
                f"| {fmt(med(name, streams, 'cpu_us_per_call', 'redis'), 1)} | {errors} |")
    lines += ["", "What Redis adds (service + Redis minus service only, medians):", ""]
    for streams in streams_list:
        d50 = med("service + Redis", streams, "p50_ms")[0] - med("service only", streams, "p50_ms")[0]
        d99 = med("service + Redis", streams, "p99_ms")[0] - med("service only", streams, "p99_ms")[0]
        lines.append(f"- {streams} streams: p50 {d50 * 1000:+.0f} µs, p99 {d99 * 1000:+.0f} µs")
    (out / f"engine_latency{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
