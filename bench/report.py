"""The gateway report (bench/gateway.py): markdown with ratio tables per comparison group and host
pair, one chart (SVG, matplotlib) per table, the machine and the versions."""
from __future__ import annotations

import pathlib
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VS_PROXY = "vs proxy-only"
VS_NATIVE = "vs Envoy's native filters"
VS_ENVOY = "nginx vs Envoy"
VS_OURS = "Kong's ngx_wasm_module vs Tollgate's nginx module"
VS_FLOOR = "vs the Wasm floor"
GROUPS = [VS_PROXY, VS_NATIVE, VS_FLOOR, VS_ENVOY, VS_OURS]

plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "tollgate-bench", "font.size": 8})


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def combos(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted({(r["workers"], r["connections"]) for r in rows})


def category(r: dict) -> str:
    what = f"{r['numerator']} / {r['denominator']}" if r["group"] in (VS_NATIVE, VS_FLOOR) else r["numerator"]
    return f"{r['scenario']}: {what}"


def fmt(median: float | None, lo: float | None, hi: float | None) -> str:
    if median is None:
        return "-"
    return f"**{median:.2f}x** [{lo:.2f}, {hi:.2f}]"


def chart(rows: list[dict], title: str, path: pathlib.Path) -> None:
    """Horizontal bars: one row per (scenario, variant), one bar per (workers, connections);
    left the requests/s ratio, right the gateway CPU time per request ratio; whiskers min and max."""
    cats = list(dict.fromkeys(category(r) for r in rows))
    cs = combos(rows)
    height = 0.8 / max(len(cs), 1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 1.2 + 0.35 * len(cats) * max(len(cs), 1) ** 0.5), sharey=True, layout="constrained")
    for ax, (key, lo, hi, xlabel) in zip(axes, [("median", "min", "max", "requests/s ratio (higher is better)"),
                                               ("cpu_median", "cpu_min", "cpu_max", "gateway CPU per request ratio (lower is better)")]):
        for i, (w, c) in enumerate(cs):
            ys, xs, err = [], [], [[], []]
            for j, cat in enumerate(cats):
                r = next((r for r in rows if category(r) == cat and (r["workers"], r["connections"]) == (w, c)), None)
                if r is None or r.get(key) is None:
                    continue
                ys.append(j - 0.4 + height * (i + 0.5))
                xs.append(r[key])
                err[0].append(r[key] - r[lo])
                err[1].append(r[hi] - r[key])
            ax.barh(ys, xs, height=height, xerr=err, capsize=1.5, label=f"{w} worker{'s' if w > 1 else ''}, {c} conn{'s' if c > 1 else ''}",
                    error_kw={"elinewidth": 0.6})
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", linewidth=0.3)
    axes[0].set_yticks(range(len(cats)), cats)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=7)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def pivot(rows: list[dict], key: str, lo: str, hi: str) -> list[str]:
    cs = combos(rows)
    lines = ["| scenario: variant | " + " | ".join(f"{w}w {c}c" for w, c in cs) + " |", "|---|" + "---|" * len(cs)]
    for cat in dict.fromkeys(category(r) for r in rows):
        cells = []
        for w, c in cs:
            r = next((r for r in rows if category(r) == cat and (r["workers"], r["connections"]) == (w, c)), None)
            cells.append(fmt(r[key], r[lo], r[hi]) if r is not None else "")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict, comparisons: list, files_dir: pathlib.Path) -> str:
    m = results["machine"]
    workers = results["workers"] if isinstance(results["workers"], list) else [results["workers"]]
    versions = [f"Envoy {m['envoy']}"] + ([f"nginx {m['nginx']} (wasmtime {m.get('wasmtime', '?')})"] if "nginx" in m else []) + [f"k6 {m.get('k6', '?')}", f"rustc {m['rustc']}"]
    lines = [f"# Gateway benchmark{' (SMOKE: figures meaningless)' if results['smoke'] else ''}", "",
             f"- Date: {results['date']}",
             f"- Machine: {m['cores']} cores, {m['cpu']}, Linux {m['kernel']}",
             f"- Versions: {', '.join(versions)}",
             f"- Hosts: {', '.join(results['hosts'])}"
             + "".join(f"; skipped {h}: {why}" for h, why in results.get("skipped_hosts", {}).items()),
             f"- Load: k6 (bench/k6/gateway.js), {', '.join(map(str, results['connections']))} connections (VUs); "
             f"{' and '.join(map(str, workers))} worker(s); {results['rounds']} interleaved round(s) of {results['seconds']:g} s per cell",
             "- Pinning: 1-worker gateways on core 0, k6 and the upstreams on core 1; 2-worker gateways unpinned",
             "", "Ratios are the median over rounds of same-round ratios, [min, max]. Requests/s: higher is better; "
             "gateway CPU time per request (utime+stime of the gateway's processes from /proc): lower is better, "
             "and steadier here since k6 shares the machine. `1w 8c`: 1 worker, 8 connections.", ""]
    charts_dir = files_dir / "charts"
    for old in charts_dir.glob("*.svg"):  # charts of a previous run's hosts or groups
        old.unlink()
    order = {sc: i for i, sc in enumerate(dict.fromkeys(r["scenario"] for r in results["raw"]))}  # as measured
    ratios = sorted(results["ratios"], key=lambda r: order.get(r["scenario"], len(order)))  # stable: variants keep their order
    for group in GROUPS:
        rows = [r for r in ratios if r["group"] == group]
        if not rows:
            continue
        lines += [f"## {group}", ""]
        for host in dict.fromkeys(r["host"] for r in rows):
            hrows = [r for r in rows if r["host"] == host]
            nh, dh = hrows[0]["numerator_host"], hrows[0]["denominator_host"]
            where = nh if nh == dh else f"{nh} / {dh}" if group in (VS_ENVOY, VS_OURS) else f"ours on {nh} / native on {dh}"
            name = f"{slug(group)}-{slug(host)}.svg"
            chart(hrows, f"{group}: {where}", charts_dir / name)
            rel = f"{files_dir.name}/charts/{name}"
            lines += [f"### {where}: requests/s", ""] + pivot(hrows, "median", "min", "max")
            lines += ["", f"### {where}: gateway CPU time per request", ""] + pivot(hrows, "cpu_median", "cpu_min", "cpu_max")
            lines += ["", f"![{group}: {where}]({rel})", ""]
    lines += ["## Medians per cell", "", "| host | scenario | variant | workers | conns | req/s | p50 µs | p99 µs | gateway CPU µs/req | checks |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["host"], r["scenario"], r["variant"], r["workers"], r["connections"])
    for cell in sorted({key(r) for r in results["raw"]}):
        rows = [r for r in results["raw"] if key(r) == cell]
        md = lambda k: statistics.median(r[k] for r in rows)
        checks = "ok" if not any(r.get("unexpected_status") for r in rows) else "FAILED"
        lines.append(f"| {' | '.join(map(str, cell))} | {md('rps'):.0f} | {md('p50_us'):.0f} | {md('p99_us'):.0f} | {md('cpu_us_per_request'):.1f} | {checks} |")
    bad = [r for r in results["raw"] if r.get("unexpected_status")]
    lines += ["", f"Raw k6 summaries: `{files_dir.name}/k6/<host>/w<workers>-c<connections>/<scenario>--<variant>.json` "
              f"(one entry per round); every measurement: `{files_dir.name}.json`."]
    if bad:
        lines += ["", f"WARNING: {len(bad)} measurements failed k6 checks or thresholds (unexpected statuses, errors or latency)."]
    return "\n".join(lines) + "\n"
