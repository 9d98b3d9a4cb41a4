"""The benchmarks' smoke mode (a second per cell): the scripts and the runner cannot rot."""
import json
import subprocess
import sys

import pytest

from lab import ROOT, selected_hosts

# Runs the benchmarks (load on both cores): run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = pytest.mark.serial

BENCHES = ["jwt_auth", "rate_limit", "sticky_upstream", "cost", "metrics", "libc"]


def report_hosts() -> list[str]:
    """The gateway report compares Envoy and glibc nginx (the musl nginx has bench/libc.py)."""
    return [h for h in selected_hosts() if h in ("envoy", "nginx")]


@pytest.mark.parametrize("name", BENCHES)
def test_benchmark_smoke(name):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((ROOT / "bench" / "results" / f"{name}.smoke.json").read_text())
    assert results["raw"] and results["ratios"]
    bad = [row for row in results["raw"] if row.get("unexpected_status")]
    assert not bad, bad
    assert all(row["requests"] > 0 and row["cpu_us_per_request"] > 0 for row in results["raw"])


def test_startup_smoke():
    """bench/startup.py --smoke: one round of each variant; the warm cache is loaded at every
    configuration read (nginx -t, start, reload: 5 modules each), the cold one compiled and stored."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = json.loads((ROOT / "bench" / "results" / "startup.smoke.json").read_text())["runs"]
    assert [(x["reused"], x["compiled"]) for x in runs["cache-warm"]] == [(15, 0)]
    assert [(x["reused"], x["compiled"]) for x in runs["no-cache"]] == [(0, 0)]
    assert all(x["compiled"] >= 5 for x in runs["cache-cold"])
    assert all(x["start"] > 0 and x["reload"] > 0 for rs in runs.values() for x in rs)


def test_gateway_report_smoke():
    """bench/gateway.py --smoke: every k6 scenario for a second on every selected host (1 worker,
    1 connection), k6's checks and thresholds passed, the report, its charts and the raw k6
    summaries written."""
    k6 = subprocess.run([str(ROOT / "scripts" / "k6.sh")], capture_output=True, text=True, timeout=1200)  # quick when installed
    assert k6.returncode == 0, k6.stderr[-3000:]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gateway.py"), "--smoke", "--hosts", ",".join(report_hosts())],
                       cwd=ROOT / "bench", capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results_dir = ROOT / "bench" / "results"
    results = json.loads((results_dir / "gateway.smoke.json").read_text())
    assert set(report_hosts()) <= set(results["hosts"])
    rows = results["raw"]
    assert {row["scenario"] for row in rows if row["host"] == "envoy"} == {
        "proxy-only", "jwt-valid-hs256", "jwt-valid-rs256", "jwt-reject-wrong-secret", "rate-limit-allow",
        "cost-openai-nonstream-small", "cost-openai-stream", "metrics", "sticky-read", "stack-likely", "stack-full"}
    for row in rows:
        assert row["requests"] > 0 and row["cpu_us_per_request"] > 0, row
        assert row["checks_passed"] > 0 and row["checks_failed"] == 0 and row["thresholds_ok"], row
        assert not row.get("unexpected_status"), row
        summary = json.loads((results_dir / row["k6_summary"]).read_text())
        assert summary["rounds"][0]["summary"]["metrics"][f"checks{{scenario:{row['scenario']}}}"]["values"]["fails"] == 0
    groups = {ratio["group"] for ratio in results["ratios"]}
    assert {"vs proxy-only", "vs Envoy's native filters"} <= groups
    if "nginx" in report_hosts():  # the same variants in nginx, compared with Envoy
        assert {row["scenario"] for row in rows if row["host"] == "nginx"} >= {"proxy-only", "stack-likely", "stack-full"}
        assert any(ratio["group"] == "nginx vs Envoy" for ratio in results["ratios"]), groups
    report = (results_dir / "gateway.smoke.md").read_text()
    charts = sorted((results_dir / "gateway.smoke" / "charts").glob("*.svg"))
    assert len(charts) >= 2 and all(c.stat().st_size > 1000 for c in charts)
    for c in charts:
        assert f"gateway.smoke/charts/{c.name}" in report
    assert "k6 v1.8.1" in report and "cores" in report



def install(*scripts: str) -> None:
    """Runs scripts/<script> for each: k6.sh (k6), ratelimit.sh (the global limits' engine); quick when installed."""
    for script in scripts:
        r = subprocess.run([str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]


def test_global_limits_smoke():
    """bench/global_limits.py --smoke: local and global mode (the rate limit service on Redis) on
    every selected host (Envoy, nginx), a second per cell at 1 connection, 2 workers. Every
    answer is a 200, and with `on_error: deny` a 200 in global mode is the service's verdict (a
    failed call would be a 503); the engine's CPU was measured beside the gateway's, the
    global / local table and the direct client's figures are in the report."""
    install("k6.sh", "ratelimit.sh")
    hosts = report_hosts()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "global_limits.py"), "--smoke", "--hosts", ",".join(hosts)],
                       cwd=ROOT / "bench", capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((ROOT / "bench" / "results" / "global_limits.smoke.json").read_text())
    assert results["hosts"] == hosts and not results["skipped_hosts"], results["skipped_hosts"]
    rows = results["raw"]
    variants = {"rate-limit-local", "rate-limit-global", "likely-local", "likely-global"}
    for host in hosts:  # and on Envoy, its own global rate limit filter on the same service
        expected = variants | ({"native-ratelimit-global"} if host == "envoy" else set())
        assert {row["variant"] for row in rows if row["host"] == host} == expected, host
    for row in rows:
        assert row["requests"] > 0 and row["cpu_us_per_request"] > 0, row
        assert row["non_2xx_3xx"] == 0 and row["checks_failed"] == 0 and not row.get("unexpected_status"), row
        assert set(row["side_cpu_us_per_request"]) == {"ratelimit", "redis"}, row
        if row["variant"].endswith("-global"):  # the service answered every request: it used CPU
            assert row["side_cpu_us_per_request"]["ratelimit"] > 0, row
    pairs = {(d["host"], d["numerator"], d["denominator"]) for d in results["global_vs_local"] if d["rps_ratio"] and d["added_p99_us"]}
    assert pairs >= {(h, v + "-global", v + "-local") for h in hosts for v in ("rate-limit", "likely")}, pairs
    direct = results["direct_client"]["cells"]["1"]
    assert all(c["calls"] > 0 and c["errors"] == 0 for cells in direct.values() for c in cells), direct
    report = (ROOT / "bench" / "results" / "global_limits.smoke.md").read_text()
    assert "## Global / local, per request" in report and "## The engine on its own" in report


def test_engine_latency_smoke():
    """bench/engine_latency.py --smoke: ShouldRateLimit from the direct gRPC client, a second per
    cell at 1, 8 and 32 streams: calls answered without errors, and Redis worked only for the
    configured domain's calls (the "service only" domain is answered without it)."""
    install("ratelimit.sh")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_latency.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((ROOT / "bench" / "results" / "engine_latency.smoke.json").read_text())
    cells = results["cells"]
    assert set(cells) == {"service + Redis", "service only"}
    for variant, by_streams in cells.items():
        assert set(by_streams) == {"1", "8", "32"}, by_streams
        for streams, runs in by_streams.items():
            assert runs and all(c["calls"] > 0 and c["errors"] == 0 and c["p50_ms"] > 0 for c in runs), (variant, streams, runs)
    redis_us = {v: sum(c["cpu_us_per_call"]["redis"] * c["calls"] for runs in s.values() for c in runs) for v, s in cells.items()}
    assert redis_us["service + Redis"] > redis_us["service only"], redis_us
    assert "What Redis adds" in (ROOT / "bench" / "results" / "engine_latency.smoke.md").read_text()

def test_instructions_smoke():
    """bench/instructions.py --smoke: nginx under callgrind (3 warm-up and 5 measured requests,
    proxy-only and floor-1; ~20 s): the dumps parse, callgrind saw every request, the wasm floor
    costs more than proxy-only, its layers include wasm code and the perf map names its filter."""
    apt = subprocess.run([str(ROOT / "scripts" / "apt.sh"), "valgrind"], capture_output=True, text=True, timeout=600)
    assert apt.returncode == 0, apt.stderr[-3000:]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "instructions.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((ROOT / "bench" / "results" / "instructions.smoke.json").read_text())
    assert not results["problems"], results["problems"]
    cells = {c["variant"]: c for c in results["cells"]}
    assert set(cells) == {"proxy-only", "floor-1"}
    assert 0 < cells["proxy-only"]["per_request"] < cells["floor-1"]["per_request"]
    assert cells["floor-1"]["calls_per_request"]["guest entries"] > 0 and cells["floor-1"]["layers_per_request"]["wasm JIT"] > 0
    # The wasm layer by filter (the host's perf map): all of it is the floor's own code.
    by_filter = cells["floor-1"]["wasm_by_filter_per_request"]
    assert max(by_filter, key=by_filter.get) == "wasm-floor", by_filter
    assert abs(sum(by_filter.values()) - cells["floor-1"]["layers_per_request"]["wasm JIT"]) < 1, by_filter
    assert [m["label"] for m in results["modules"]] == ["built"]
    assert "valgrind" in (ROOT / "bench" / "results" / "instructions.smoke.md").read_text()


def test_envoy_profile_classes():
    """bench/envoy_profile.py's classes, on `perf script -F ip,dso` text: a sample whose own
    frame is V8's compiled wasm, one in Envoy under a wasm frame (a host call), and one with
    no wasm on its stack."""
    sys.path.insert(0, str(ROOT / "bench"))
    import envoy_profile

    script = "\n".join([
        "\t    72a51d4c07c [unknown] (/tmp/perf-9439.map)",
        "\t        2f7f359 [unknown] (/x/envoy/_bin/envoy)",
        "",
        "\t        163961 __memcmp_evex_movbe (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        "\t        2f88665 [unknown] (/x/envoy/_bin/envoy)",
        "\t    72a5292355b [unknown] (/tmp/perf-9439.map)",
        "\t        2fac060 [unknown] (/x/envoy/_bin/envoy)",
        "",
        "\tffffffff82010855 tcp_sendmsg_locked ([kernel.kallsyms])",
        "\t        10aba4 __send (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        "\t        2fac060 [unknown] (/x/envoy/_bin/envoy)",
        "",
    ])
    assert envoy_profile.classify(script) == {"wasm code": 1, "host calls": 1, "rest: kernel": 1}


def test_envoy_profile_smoke():
    """bench/envoy_profile.py --smoke: perf records each Envoy variant for a second; only our
    stack has samples in wasm code and in host calls, and the report is written."""
    if "envoy" not in selected_hosts():
        pytest.skip("Envoy is not among TOLLGATE_HOSTS")
    apt = subprocess.run([str(ROOT / "scripts" / "apt.sh"), "linux-perf"], capture_output=True, text=True, timeout=600)
    assert apt.returncode == 0, apt.stderr[-3000:]
    k6 = subprocess.run([str(ROOT / "scripts" / "k6.sh")], capture_output=True, text=True, timeout=1200)
    assert k6.returncode == 0, k6.stderr[-3000:]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "envoy_profile.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((ROOT / "bench" / "results" / "envoy_profile.smoke.json").read_text())
    assert set(rows) == {"proxy-only", "tollgate-likely", "native-likely"}
    ours, native = rows["tollgate-likely"][0], rows["native-likely"][0]
    assert ours["requests"] > 0 and native["requests"] > 0
    assert ours["us_per_request"]["wasm code"] > 0 and ours["us_per_request"]["host calls"] > 0
    assert native["us_per_request"]["wasm code"] == 0 and native["us_per_request"]["host calls"] == 0
    assert (ROOT / "bench" / "results" / "envoy_profile.smoke.md").read_text().startswith("# Envoy")
