"""glibc nginx vs musl nginx with the full filter chain, in one interleaved run (issue 9).

The filters are the same .wasm bytes on both; what differs is the host: nginx 1.22.1 and the
nginx-compat module (with wasmtime) built against glibc (Debian's stock nginx,
scripts/build-nginx-module.sh) or against musl (nginx from Debian's source with musl-gcc, and the
module for x86_64-unknown-linux-musl, scripts/build-nginx-musl.sh: the build of the Alpine image,
without Docker). Two hosts of the runner, every gateway in the same rounds:

| host | nginx binary | module |
|---|---|---|
| nginx-glibc | /usr/sbin/nginx (Debian) | target/nginx/ngx_http_tollgate_wasm_module.so |
| nginx-musl | target/nginx-musl/install/sbin/nginx | target/nginx-musl/ngx_http_tollgate_wasm_module.so |

Variants on each host: proxy-only, and tollgate-full, bench/gateway.py's full chain (metrics,
jwt-auth, rate-limit, cost, sticky-upstream over three upstreams). One scenario for both, k6's
`stack-full` (bench/k6/gateway.js: POST /v1/chat/completions with a token, an API key, a tenant
and a sticky cookie), so that proxy-only carries exactly the same traffic.

The report gives, besides the runner's ratios (musl / glibc for each variant; tollgate-full /
proxy-only on each host), where a difference comes from, from the gateway's CPU time per request
(medians of same-round values, [min, max]):
  filters' share on a host  = CPU/req(tollgate-full) - CPU/req(proxy-only)
  musl - glibc, whole chain = host part + filters part, where
    host part    = CPU/req(proxy-only, musl) - CPU/req(proxy-only, glibc)   (nginx and libc)
    filters part = filters' share(musl) - filters' share(glibc)             (module, wasmtime, libc
                                                                              calls made for the filters)

    scripts/bench.sh libc              # 3 rounds x 5 s per cell, 8 and 32 connections, 1 and 2 workers (~10 min)
    scripts/bench.sh libc --smoke      # a second per cell
The nginx builds are made first when missing (both scripts are idempotent; the musl one takes
minutes cold).
"""
from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys

import cost
import jwt_auth
import lab
import metrics
import rate_limit
import runner
import sticky_upstream
from lab import ROOT, GatewaySpec

GLIBC = ("nginx-glibc", pathlib.Path("/usr/sbin/nginx"), ROOT / "target" / "nginx" / "ngx_http_tollgate_wasm_module.so",
         ROOT / "scripts" / "build-nginx-module.sh")
MUSL = ("nginx-musl", ROOT / "target" / "nginx-musl" / "install" / "sbin" / "nginx",
        ROOT / "target" / "nginx-musl" / "ngx_http_tollgate_wasm_module.so", ROOT / "scripts" / "build-nginx-musl.sh")
SCENARIO = "stack-full"


def nginx_host(name: str, binary: pathlib.Path, module: pathlib.Path, build: pathlib.Path) -> type:
    """A runner host: the lab's NginxHost on this nginx binary and module."""
    return type(f"{name.replace('-', '_')}_host", (lab.NginxHost,),
                {"name": name, "BINARY": binary, "MODULE": module, "BUILD": str(build.relative_to(ROOT))})


def version(binary: pathlib.Path) -> str:
    r = subprocess.run([str(binary), "-v"], capture_output=True, text=True)
    interp = subprocess.run(["readelf", "-l", str(binary)], capture_output=True, text=True).stdout
    loader = next((l.split(":", 1)[1].strip(" ]") for l in interp.splitlines() if "program interpreter" in l), "?")
    return f"{(r.stderr or r.stdout).strip()} ({loader})"


def attribution(raw: list[dict]) -> list[dict]:
    """Per (connections, workers): the CPU/request split described in the module's docstring,
    each a median over rounds of same-round values, with min and max."""
    cpu = {(r["host"], r["variant"], r["connections"], r["workers"], r["round"]): r["cpu_us_per_request"] for r in raw}
    out = []
    for conns, w in sorted({(r["connections"], r["workers"]) for r in raw}):
        series: dict[str, list[float]] = {}
        for rnd in sorted({r["round"] for r in raw}):
            get = lambda h, v: cpu.get((h, v, conns, w, rnd))
            vals = {(h, v): get(h, v) for h in (GLIBC[0], MUSL[0]) for v in ("proxy-only", "tollgate-full")}
            if None in vals.values():
                continue
            share = {h: vals[(h, "tollgate-full")] - vals[(h, "proxy-only")] for h in (GLIBC[0], MUSL[0])}
            for k, v in {
                "glibc proxy-only": vals[(GLIBC[0], "proxy-only")], "glibc full": vals[(GLIBC[0], "tollgate-full")],
                "glibc filters' share": share[GLIBC[0]],
                "musl proxy-only": vals[(MUSL[0], "proxy-only")], "musl full": vals[(MUSL[0], "tollgate-full")],
                "musl filters' share": share[MUSL[0]],
                "musl - glibc, whole chain": vals[(MUSL[0], "tollgate-full")] - vals[(GLIBC[0], "tollgate-full")],
                "of which host (proxy-only)": vals[(MUSL[0], "proxy-only")] - vals[(GLIBC[0], "proxy-only")],
                "of which filters": share[MUSL[0]] - share[GLIBC[0]],
            }.items():
                series.setdefault(k, []).append(v)
        if series:
            out.append({"connections": conns, "workers": w, "rounds": len(next(iter(series.values()))),
                        "values": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in series.items()}})
    return out


def report(results: dict, comparisons: list, files_dir: pathlib.Path) -> str:
    lines = [runner.markdown(results, comparisons), "## Where the difference comes from (gateway CPU µs per request)", "",
             f"Binaries: {GLIBC[0]} = {version(GLIBC[1])}; {MUSL[0]} = {version(MUSL[1])}. "
             "Medians of same-round values [min, max]; negative = musl cheaper.", ""]
    for cell in attribution(results["raw"]):
        v = cell["values"]
        lines += [f"### {cell['connections']} connections, {cell['workers']} worker(s), {cell['rounds']} round(s)", "",
                  "| quantity | µs/request | [min, max] |", "|---|---|---|"]
        for k, s in v.items():
            lines.append(f"| {k} | {s['median']:.1f} | [{s['min']:.1f}, {s['max']:.1f}] |")
        total = v["musl - glibc, whole chain"]["median"]
        if abs(total) >= 0.05:
            lines += ["", f"Of the whole chain's difference ({total:+.1f} µs/req): host {v['of which host (proxy-only)']['median']:+.1f}, "
                          f"filters {v['of which filters']['median']:+.1f} (medians; the parts' medians need not add up exactly)."]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    opts = runner.options(connections="8,32", workers="1,2", smoke_workers="1")
    for _, _, _, build in (GLIBC, MUSL):  # idempotent; quick once built
        r = subprocess.run([str(build)], cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"{build.relative_to(ROOT)} failed")
    subprocess.run([str(ROOT / "scripts" / "k6.sh")], check=True, capture_output=True)
    for h in (GLIBC, MUSL):
        lab.HOSTS[h[0]] = nginx_host(*h)

    keys = jwt_auth.make_keys(ttl=86400)
    full = [metrics.tollgate(True), jwt_auth.tollgate(keys, False), rate_limit.tollgate(False, True), cost.tollgate(True),
            sticky_upstream.tollgate()]
    spec = lambda filters, up, **kw: GatewaySpec(filters, up, stats_config=metrics.STATS_CONFIG, **kw)
    variants = [
        runner.Variant("proxy-only", lambda up: spec([], {"blue": up["blue"]})),
        runner.Variant("tollgate-full", lambda up: spec(full, sticky_upstream.tollgate_upstreams(up), route_header=sticky_upstream.ROUTE_HEADER)),
    ]
    scenarios = [runner.Scenario(SCENARIO, env={"TOKEN_HS256": keys.hs256, "STICKY_UPSTREAM": "blue",
                                                "STICKY_COOKIE": sticky_upstream.sticky_cookie(None)})]
    comparisons = [
        runner.Comparison("tollgate-full", "tollgate-full", label="full chain: musl / glibc", numerator_host=MUSL[0], denominator_host=GLIBC[0]),
        runner.Comparison("proxy-only", "proxy-only", label="proxy-only: musl / glibc", numerator_host=MUSL[0], denominator_host=GLIBC[0]),
        runner.Comparison("tollgate-full", "proxy-only", label="full chain / proxy-only"),  # on each host
    ]
    runner.run("libc", variants, scenarios, comparisons=comparisons, load="k6", upstream_names=sticky_upstream.UPSTREAMS,
               hosts=[GLIBC[0], MUSL[0]], report=report, **opts)


if __name__ == "__main__":
    sys.exit(main())
