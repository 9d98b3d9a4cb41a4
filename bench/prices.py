"""The cost filter with a real price table (issue 22): what LiteLLM's whole file (litellm 1.109.1,
3.2 MB, 4,553 entries, 3,676 priced) costs against a 3-model table, on every host.

Per (host, table), interleaved over `--rounds` rounds (each round starts every gateway in turn,
in a rotated order, on this shared machine):
- parse time: the filter's own log line at `on_configure` ("configuration read in X ms", the
  host's clock around Config::parse, one line per VM: nginx's master validation and each
  worker, Envoy's main-thread and worker VMs);
- memory per worker: nginx, the RSS of each worker process after `--requests` priced requests;
  Envoy (one process, one VM per worker thread and one on the main thread), the process RSS
  difference to the 3-model gateway of the same round divided by its VMs (workers + 1);
- both gateways serve priced completions (checked: the spend of the bench tenant grows).

The per-request instructions of the two tables are callgrind's (`scripts/bench.sh instructions
--variants cost-3,cost-litellm`, bench/instructions.py): exact, where wall time on this machine
is not.

    .venv/bin/python bench/prices.py                       # envoy,nginx,nginx-musl, 2 workers, 3 rounds
    .venv/bin/python bench/prices.py --hosts nginx --rounds 1

Output: bench/results/prices.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
import uuid

import requests

import runner  # also puts the repository root (lab) and tests/e2e on sys.path
import lab
import litellm
from lab import DemoUpstream, FilterSpec, GatewaySpec

BENCH = runner.BENCH
SMALL = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07},
         "gpt-4o": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05},
         "claude-sonnet-4-5": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05}}
PARSED = re.compile(r"cost: prices from the configuration: (\d+) models loaded.*configuration read in ([0-9.]+) ms")


def config(prices: dict) -> dict:
    return {"ledger": "bench", "prices": prices, "tenant": {"unverified_header": "x-tenant"}, "spend_headers": True}


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def worker_pids(g) -> list[int]:
    root = runner.gateway_pids(g)[0]
    out = subprocess.run(["pgrep", "-P", str(root)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def measure(host_name: str, table: str, prices: dict, upstream: DemoUpstream, workdir, workers: int, n: int) -> dict:
    host = lab.HOSTS[host_name](workdir)
    spec = GatewaySpec(filters=[FilterSpec("cost", config(prices))], upstreams={"upstream": upstream.port}, workers=workers)
    g = host.start(spec, log_level="info")  # the filter logs its parse time at info
    try:
        tenant = uuid.uuid4().hex
        h = {"content-type": "application/json", "x-tenant": tenant, "x-mock-prompt-tokens": "120", "x-mock-completion-tokens": "40"}
        for _ in range(n):
            r = requests.post(g.url + "/v1/chat/completions", data=json.dumps({"model": "gpt-4o-mini"}), headers=h, timeout=30)
            assert r.status_code == 200, r.text
        spent = int(requests.get(g.url + "/healthz", headers={"x-tenant": tenant}, timeout=10).headers["x-tollgate-spend-total-nano-usd"])
        assert spent == n * (120 * 150 + 40 * 600), spent
        deadline = time.monotonic() + 30
        while True:
            parses = [(int(m.group(1)), float(m.group(2))) for m in PARSED.finditer(g.log.read_text(errors="replace"))]
            if len(parses) >= workers or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if host_name == "envoy":
            rss = [rss_kib(runner.gateway_pids(g)[0])]
        else:
            rss = [rss_kib(p) for p in worker_pids(g)]
        return {"host": host_name, "table": table, "models": parses[0][0] if parses else 0,
                "parse_ms": [ms for _, ms in parses], "rss_kib": rss}
    finally:
        g.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="envoy,nginx,nginx-musl")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args()
    hosts = [h for h in args.hosts.split(",") if h and not runner.host_unavailable(h)]
    big = json.loads(litellm.price_file().read_bytes())
    tables = {"3 models": SMALL, f"litellm {litellm.VERSION}": big}
    workdir = BENCH / "results" / "tmp" / "prices"
    workdir.mkdir(parents=True, exist_ok=True)
    upstream = DemoUpstream("bench-prices", workdir)
    raw = []
    try:
        cells = [(h, t) for h in hosts for t in tables]
        for r in range(args.rounds):
            for h, t in cells[r % len(cells):] + cells[:r % len(cells)]:
                m = measure(h, t, tables[t], upstream, workdir, args.workers, args.requests)
                m["round"] = r
                print(json.dumps(m), flush=True)
                raw.append(m)
    finally:
        upstream.stop()
    rows = []
    for h in hosts:
        small = [m for m in raw if m["host"] == h and m["table"] == "3 models"]
        for t in tables:
            ms = [m for m in raw if m["host"] == h and m["table"] == t]
            parse = [x for m in ms for x in m["parse_ms"]]
            if h == "envoy":
                vms = args.workers + 1
                base = {m["round"]: m["rss_kib"][0] for m in small}
                per_worker = [(m["rss_kib"][0] - base.get(m["round"], m["rss_kib"][0])) / vms for m in ms]
                rss_note = f"process RSS - the 3-model gateway's, / {vms} VMs"
                total = [m["rss_kib"][0] for m in ms]
            else:
                per_worker = [x for m in ms for x in m["rss_kib"]]
                rss_note = "worker RSS"
                total = per_worker
            rows.append({"host": h, "table": t, "models": ms[0]["models"] if ms else 0,
                         "parse_ms": summary(parse), "rss_kib": summary(total),
                         "per_worker_kib": summary(per_worker), "rss_note": rss_note})
    results = {"machine": runner.machine(hosts=hosts), "workers": args.workers, "rounds": args.rounds,
               "requests": args.requests, "rows": rows, "raw": raw}
    (BENCH / "results" / "prices.json").write_text(json.dumps(results, indent=2) + "\n")
    (BENCH / "results" / "prices.md").write_text(markdown(results))
    print(markdown(results))


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}


def fmt(s: dict, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    if not s:
        return "-"
    return f"{s['median'] / scale:.{digits}f} {unit} ({s['min'] / scale:.{digits}f}-{s['max'] / scale:.{digits}f})"


def markdown(results: dict) -> str:
    lines = ["# cost: LiteLLM's whole price file against a 3-model table",
             "",
             f"`.venv/bin/python bench/prices.py` ({results['workers']} workers, {results['rounds']} interleaved rounds, "
             f"{results['requests']} priced completions per gateway). Median (min-max).",
             "",
             "| host | table | models priced | parse of the configuration (per VM) | RSS | memory per worker |",
             "|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['host']} | {r['table']} | {r['models']} | {fmt(r['parse_ms'], 'ms')} | "
                     f"{fmt(r['rss_kib'], 'MiB', 1024)} | {fmt(r['per_worker_kib'], 'MiB', 1024)} ({r['rss_note']}) |")
    m = results["machine"]
    lines += ["", f"Machine: {m.get('cpu')} ({m.get('cores')} cores), Envoy {m.get('envoy')}, nginx {m.get('nginx', '-')}, "
              f"wasmtime {m.get('wasmtime', '-')}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
