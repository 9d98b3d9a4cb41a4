"""The long fuzz run: every target of fuzz/ for at least 10 million executions, one after the
other, niced (the machine has 2 shared cores), with libFuzzer's final figures per target in
bench/results/fuzz.{json,md}.

Each target starts from its seeds (fuzz/corpus/<target>/) and the corpus earlier runs grew
(target/fuzz/corpus/<target>/, where new inputs go); a failure stops the run with the input in
target/fuzz/artifacts/<target>/ (scripts/fuzz.sh explains how to reproduce it).

    scripts/bench.sh fuzz                         # every target, 10 000 000 executions each
    scripts/bench.sh fuzz --runs 1000000 --targets path_normalize,route_match
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FUZZ = ROOT / "scripts" / "fuzz.sh"


def targets() -> list[str]:
    return subprocess.run([str(FUZZ), "list"], capture_output=True, text=True, check=True).stdout.split()


def run(target: str, runs: int) -> dict:
    """One target for `runs` executions; libFuzzer's final stats and the coverage it reached."""
    t0 = time.monotonic()
    p = subprocess.run(["nice", "-n", "10", str(FUZZ), "run", target, f"-runs={runs}", "-print_final_stats=1"],
                       capture_output=True, text=True)
    seconds = time.monotonic() - t0
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.stderr.write(log[-4000:])
        raise SystemExit(f"fuzz target {target} failed (exit {p.returncode}): see target/fuzz/artifacts/{target}/")
    stats = {k: int(v) for k, v in re.findall(r"^stat::(\w+):\s+(\d+)", log, re.M)}
    done = re.findall(r"^#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)", log, re.M)
    executions, cov, ft, corpus, corpus_size = done[-1] if done else (stats.get("number_of_executed_units", 0), 0, 0, 0, "")
    return {
        "target": target,
        "executions": int(stats.get("number_of_executed_units", executions)),
        "seconds": round(seconds, 1),
        # libFuzzer's own average is over whole seconds (0 for short runs): executions / wall time.
        "exec_per_second": round(int(stats.get("number_of_executed_units", executions)) / max(seconds, 0.001)),
        "new_units_added": stats.get("new_units_added"),
        "coverage_edges": int(cov),
        "features": int(ft),
        "corpus_entries": int(corpus),
        "corpus_size": corpus_size,
        "peak_rss_mb": stats.get("peak_rss_mb"),
    }


def markdown(results: dict) -> str:
    lines = [
        "# Fuzzing: the long run",
        "",
        f"{results['date']}, {results['machine']}; `nice -n 10 scripts/fuzz.sh run TARGET -runs={results['runs']}` per target,",
        "one after the other (libFuzzer through libfuzzer-sys, SanitizerCoverage, stable Rust, no ASan:",
        "see scripts/fuzz.sh). Every target finished without a failure.",
        "",
        "| target | executions | seconds | exec/s | edges | features | corpus | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["targets"]:
        lines.append(f"| `{r['target']}` | {r['executions']:,} | {r['seconds']:,} | {r['exec_per_second']:,} | "
                     f"{r['coverage_edges']} | {r['features']} | {r['corpus_entries']} ({r['corpus_size']}) | {r['peak_rss_mb']} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000_000)
    ap.add_argument("--targets", default="", help="comma-separated (default: every target)")
    ap.add_argument("--smoke", action="store_true", help="10 000 executions per target, results *.smoke.*")
    args = ap.parse_args()
    runs = 10_000 if args.smoke else args.runs
    chosen = [t for t in args.targets.split(",") if t] or targets()
    subprocess.run([str(FUZZ), "build"], check=True)
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {len(open('/proc/cpuinfo').read().split('processor')) - 1} cores",
        "runs": runs,
        "targets": [],
    }
    for t in chosen:
        print(f"fuzz {t}: {runs:,} executions", flush=True)
        r = run(t, runs)
        print(f"  {r['executions']:,} in {r['seconds']} s ({r['exec_per_second']}/s), {r['coverage_edges']} edges", flush=True)
        results["targets"].append(r)
    name = "fuzz.smoke" if args.smoke else "fuzz"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(results))
    print(f"wrote bench/results/{name}.md")


if __name__ == "__main__":
    main()
