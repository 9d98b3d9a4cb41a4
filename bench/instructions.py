"""Instructions per request of nginx with Tollgate's module (callgrind), per variant and per build
of the module: what the filters cost in the nginx worker, split by layer, repeatable on a shared
noisy machine.

Callgrind counts executed instructions (Ir), so whatever else the machine is doing does not move
the figures: the wasm code, host core, wasmtime and services layers repeat from run to run to
within a few instructions per request. Glue and nginx move a little between nginx starts (glibc's malloc takes different paths
as its heap state differs): a few percent of a small cell such as floor-1, a fraction of a
percent of the full chain. `--repeat K` runs every cell K times and reports the median run and
the spread. The price is speed: valgrind runs nginx ~50x slower, and compiling the filters at
startup takes minutes for the full chain (not counted).

Each cell runs Debian's nginx (`master_process off`, one worker, `error_log warn`) under
`valgrind --tool=callgrind --collect-atstart=no --toggle-collect=ngx_process_events_and_timers
--toggle-collect=tollgate_module::timers::tick_handler` (only the event loop is counted: startup
and the wasm compilation are not; nor are the filters' `on_tick` timers, whose work is per
interval, not per request: under callgrind the N requests take seconds, so metrics' flush, once
a second, would otherwise be charged to them about 50x as often as at real speed), sends W warm-up
requests, zeroes the counters (`callgrind_control -z`), sends N measured requests, dumps
(`callgrind_control -d`) and stops nginx (SIGQUIT). The requests go one after the other over
one keep-alive connection (like one k6 VU), all the same: the gateway report's `stack-full`
request (bench/k6/gateway.js: POST /v1/chat/completions with an HS256 token, x-api-key,
x-tenant, the x-mock-* headers, the sticky cookie pinned to blue and a small JSON body). Every
answer must be 200 from upstream blue.

Variants (configs rendered by lab.nginx_config, with the benchmarks' filter
configurations and the metrics benchmark's stats_config, as bench/gateway.py):

| variant | chain |
|---|---|
| proxy-only | none |
| floor-1 | bench/wasm-floor (a filter that does nothing; its module exports only the stream callback proxy_on_request_headers, as scripts/build.sh trims it) |
| floor-1-all | the same filter untrimmed: every stream callback exported, as the proxy-wasm Rust SDK does |
| floor-5 | the same filter five times in the chain (`proxy_wasm wasm_floor` x5, each with its own configuration: one module, five filters) |
| metrics, jwt-auth, rate-limit, cost, sticky-upstream | each filter alone, configured as in the likely stack but keyed by the headers as sent (nothing verifies them without jwt-auth); jwt-auth with its verified-token cache on |
| likely | issue 20's likely stack, gateway.py's tollgate-likely with jwt-auth's verified-token cache on, as deployed: metrics, jwt-auth (HS256), rate-limit (allows), cost (a small non-streaming completion); the identities are the subject jwt-auth verified |
| likely-uncached | the same with the cache off (every request's token verified: gateway.py's tollgate-likely) |
| likely-dotted | the same, the request's path spelt `/v1/./chat//completions`: the filters' path normalisation takes its slow path and rewrites `:path` (not ordered with the others in the sanity check) |
| full | the likely stack and sticky-upstream (3 upstreams), the cache on |
| full-uncached | the same with the cache off (gateway.py's tollgate-full) |
| cost-3 | only when named: bench/cost.py's cost filter (x-tenant as sent) with a 3-model price table |
| cost-litellm | only when named: the same with LiteLLM's whole price file (tests/e2e/litellm.py, 3.2 MB, 3,676 models priced; nginx reads it with `tollgate_proxy_wasm_file`) |
| cost-tokens | only when named: the cost variant with one token limit for every tenant (`token_limits`, never spent): its read at the request body, its CAS at the booking, its RateLimit fields; compare with cost |

Modules: `--module [LABEL=]PATH`, repeatable (default: the built target/nginx/
ngx_http_tollgate_wasm_module.so, label "built"). Every module is copied first (as
ngx_http_tollgate_wasm_module.so, the name the layer split recognises) and so are the filters'
.wasm files, so that a rebuild during the run changes nothing and every module runs the same
wasm. Ratios are each module / the first one.

Builds of the filters: `--wasm LABEL=DIR`, repeatable (a directory of tollgate_*.wasm, e.g. main's
and this branch's): then the columns are these builds, all run by the first module, and the
ratios are each build / the first one (what a change to the filters costs per request).
Whole builds: `--with-wasm LABEL=DIR` gives the module `--module LABEL=PATH` its own filters
(the others run the built ones), e.g. main's module and filters against this branch's.

Layers (per request; self costs by object and symbol, as /tmp/prof/cgparse.py of the profiling
report): wasm JIT (code with no object: the filters' compiled wasm, with the proxy-wasm SDK and
wasmtime's generated trampolines), host core (tollgate_host), glue (tollgate_module and the ngx
crate), wasmtime, services (tollgate_services), nginx, other (other objects). libc, ld.so and Rust
core/std/alloc/hashbrown code is charged to its callers' layers, in proportion to the
inclusive cost of each call edge (recursively through other such code). The wasm JIT layer is
split by filter too: nginx runs with TOLLGATE_WASM_PERFMAP=1, so the host writes wasmtime's perf
map (/tmp/perf-<pid>.map, kept as perf.map beside the dump), which names every compiled function
and, through the functions' crate names, its filter.

    scripts/bench.sh instructions                            # W=50, N=200, all variants, the built module
    scripts/bench.sh instructions --module before=/tmp/old.so --module after=target/nginx/ngx_http_tollgate_wasm_module.so
    scripts/bench.sh instructions --variants proxy-only,full --warmup 20 --requests 100
    scripts/bench.sh instructions --repeat 3                 # three runs per cell: the median run, and the spread
    scripts/bench.sh instructions --repeat-small 3           # three of proxy-only and the floors only (seconds each)
    scripts/bench.sh instructions --smoke                    # W=3, N=5, proxy-only and floor-1 (~20 s; part of the tests)
    scripts/bench.sh instructions --wasm main=/tmp/main-wasm --wasm branch=target/wasm32-wasip1/release \
        --variants proxy-only,likely,likely-dotted,full      # what the filters' changes cost per request
    scripts/bench.sh instructions --module main=/tmp/main.so --with-wasm main=/tmp/main-wasm \
        --module branch=target/nginx/ngx_http_tollgate_wasm_module.so   # whole builds: module and filters

Output: bench/results/instructions.{md,json} (smoke: instructions.smoke.*; only cost-3 and
cost-litellm: instructions_prices.*; `--name NAME`: NAME.*, so that two runs can go on at once); the callgrind
files stay in bench/results/tmp/instructions/<module>/<variant>/run<k>/callgrind.out.1 for
callgrind_annotate or kcachegrind.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import hashlib
import http.client
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Callable

import runner  # also puts the repository root (lab) and tests/e2e on sys.path
import cost
import jwt_auth
import lab
import metrics
import rate_limit
import sticky_upstream
from lab import DemoUpstream, GatewaySpec

BENCH = runner.BENCH
ROOT = runner.ROOT
MODULE_FILE = "ngx_http_tollgate_wasm_module.so"
# Kong's ngx_wasm_module (scripts/build-kong-module.sh): a module of this file name is run with the
# configuration rendered for it (lab.nginx_config(kong=True)); its own code (C, with Wasmtime
# 26 linked in statically) is the layer "kong module", Wasmtime's functions in it "wasmtime".
KONG_FILE = "ngx_wasmx_module.so"
FILTERS = ["metrics", "jwt-auth", "rate-limit", "cost", "sticky-upstream"]
VARIANTS = ["proxy-only", "floor-1", "floor-1-all", "floor-5", *FILTERS, "likely", "likely-uncached", "likely-dotted",
            "full", "full-uncached", "cost-3", "cost-litellm", "cost-tokens"]
# Variants the sanity check does not order (same chain as another, another request, or a
# comparison of their own).
UNORDERED = {*FILTERS, "likely-uncached", "likely-dotted", "full-uncached", "cost-3", "cost-litellm", "cost-tokens"}
# Issue 34's targets (the per-request tax), per request: (variant, what, the limit). "minus": the
# variant minus proxy-only at most the limit; "ratio": the variant / proxy-only at most the limit;
# a key of CALLS ("host calls", "guest entries"): that count at most the limit.
TARGETS = [("floor-1", "minus", 4000), ("likely", "ratio", 3.0), ("full", "ratio", 3.3),
           ("likely", "host calls", 25), ("likely", "guest entries", 12)]
# Run only when asked for (--variants): the cost filter alone with a 3-model price table and
# with LiteLLM's whole price file (issue 22: the lookup must stay O(1)).
PRICE_VARIANTS = ["cost-3", "cost-litellm"]
# Run only when asked for (--variants), as the price variants.
NAMED_ONLY = [*PRICE_VARIANTS, "cost-tokens"]
DOTTED_PATH = "/v1/./chat//completions"
SMOKE_VARIANTS = ["proxy-only", "floor-1"]
# The cells whose differences are a few thousand instructions, as large as the spread of nginx's
# and glibc's malloc paths between starts: `--repeat-small K` runs them K times (cheap: seconds).
SMALL_VARIANTS = ["proxy-only", "floor-1", "floor-1-all", "floor-5"]
LAYERS = ["wasm JIT", "host core", "glue", "wasmtime", "services", "kong module", "nginx", "other"]
READY_TIMEOUT_S = 1800  # the full chain's compilation under valgrind: ~3 min idle, more when the machine is busy
REQUEST_TIMEOUT_S = 120
CONTROL_TIMEOUT_S = 300
# Function names counted per request (calls), as a sanity check and a view of the boundary crossings.
# The module's timer handler for the filters' `on_tick`: left out of the counts (the docstring).
TICK_HANDLER = "tollgate_module::timers::tick_handler*"
CALLS = {
    "requests seen": "ngx_http_create_request",
    "guest entries": "wasmtime::runtime::func::invoke_wasm_and_catch_traps",
    "host calls": "wasmtime::runtime::func::HostFunc::array_call_trampoline",
}


# --- what runs -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Module:
    """A build of the module under test: its label, where it came from and its snapshot."""

    label: str
    source: pathlib.Path
    path: pathlib.Path  # the copy that nginx loads
    sha256: str = ""
    size: int = 0  # bytes
    wasm_dir: pathlib.Path | None = None  # the filters this build runs (--wasm); None: the snapshot
    kong: bool = False  # Kong's ngx_wasm_module (KONG_FILE), not Tollgate's


@dataclasses.dataclass
class Request:
    """The request every cell sends (N times over one keep-alive connection)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None


def parse_module(arg: str, index: int) -> tuple[str, pathlib.Path]:
    """`LABEL=PATH` or `PATH` (label: the file's stem, or `m<index>`)."""
    label, sep, path = arg.partition("=")
    if not sep or "/" in label:
        label, path = "", arg
    p = pathlib.Path(path)
    if not p.is_absolute():
        p = (pathlib.Path.cwd() / p) if p.exists() else ROOT / p
    return label or (p.stem if p.stem != pathlib.Path(MODULE_FILE).stem else f"m{index}"), p


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_modules(args: list[tuple[str, pathlib.Path]], workdir: pathlib.Path) -> list[Module]:
    """Copies every module into workdir/modules/<label>/ngx_http_tollgate_wasm_module.so (Kong's:
    under its own name, KONG_FILE)."""
    out = []
    for label, src in args:
        if not src.exists():
            raise SystemExit(f"module {src} is missing (the default one: run scripts/build-nginx-module.sh;"
                             " Kong's: scripts/build-kong-module.sh)")
        kong = src.name == KONG_FILE
        dst = workdir / "modules" / label / (KONG_FILE if kong else MODULE_FILE)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        out.append(Module(label, src, dst, sha256(dst), dst.stat().st_size, kong=kong))
    return out


def snapshot_wasm(workdir: pathlib.Path, src: pathlib.Path | None = None, label: str = "wasm") -> dict[str, str]:
    """Copies the filters' .wasm files (from `src`, default lab.paths.WASM_DIR) into
    workdir/<label> and, by default, points the lab at the copies; returns {file name: sha256}."""
    dst = workdir / label
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted((src or lab.paths.WASM_DIR).glob("tollgate_*.wasm"))
    if not files:
        raise SystemExit(f"no filters in {src or lab.paths.WASM_DIR}: run scripts/build.sh")
    for f in files:
        shutil.copy2(f, dst / f.name)
    if src is None:
        lab.paths.WASM_DIR = dst
    return {f.name: sha256(dst / f.name) for f in files}


def variant_spec(name: str, keys: jwt_auth.Keys, ports: dict[str, int]) -> GatewaySpec:
    """The GatewaySpec of a variant (see the module's docstring)."""
    spec = lambda filters, up, **kw: GatewaySpec(filters, up, stats_config=metrics.STATS_CONFIG, **kw)
    blue = {"blue": ports["blue"]}
    floor = runner.wasm_floor
    if name == "proxy-only":
        return spec([], blue)
    if name == "floor-1":
        return spec([floor()], blue)
    if name == "floor-1-all":
        return spec([floor(True)], blue)
    if name == "floor-5":
        # Five plugin configurations (the filter ignores its configuration): the module runs
        # one filter once per request however often the same configuration stands in a chain.
        return spec([dataclasses.replace(floor(), config={"instance": i}) for i in range(5)], blue)
    sticky = lambda chain: spec(chain, sticky_upstream.tollgate_upstreams(ports), route_header=sticky_upstream.ROUTE_HEADER)
    alone = {"metrics": metrics.tollgate(), "jwt-auth": jwt_auth.tollgate(keys, True), "rate-limit": rate_limit.tollgate(False),
             "cost": cost.tollgate()}
    if name in alone:
        return spec([alone[name]], blue)
    if name == "sticky-upstream":
        return sticky([sticky_upstream.tollgate()])
    # As gateway.py's stacks: the identities are the subject jwt-auth verified.
    cached = not name.endswith("-uncached")
    likely = [metrics.tollgate(True), jwt_auth.tollgate(keys, cached), rate_limit.tollgate(False, True), cost.tollgate(True)]
    if name in ("likely", "likely-uncached", "likely-dotted"):
        return spec(likely, blue)
    if name in ("full", "full-uncached"):
        return sticky(likely + [sticky_upstream.tollgate()])
    if name == "cost-tokens":
        base = cost.tollgate()
        limits = {"default": [{"name": "tpm", "tokens": 10**18, "per": "minute"}]}
        return spec([lab.FilterSpec("cost", {**base.config, "token_limits": limits})], blue)
    if name in PRICE_VARIANTS:
        import litellm  # tests/e2e/litellm.py: the pinned file, fetched from PyPI once
        base = cost.tollgate(False)
        prices = (json.loads(litellm.price_file().read_bytes()) if name == "cost-litellm"
                  else {**base.config["prices"],
                        "gpt-4o": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05},
                        "claude-sonnet-4-5": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05}})
        return spec([lab.FilterSpec("cost", {**base.config, "prices": prices})], blue)
    raise SystemExit(f"unknown variant {name}; known: {VARIANTS}")


def stack_full_request(keys: jwt_auth.Keys, path: str = "/v1/chat/completions") -> Request:
    """bench/k6/gateway.js's `stack-full` request, with the token and cookie bench/gateway.py gives it."""
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}, separators=(",", ":"))
    headers = {"content-type": "application/json", "x-tenant": "bench-tenant",
               "x-mock-prompt-tokens": "120", "x-mock-completion-tokens": "40", "x-mock-cached-tokens": "20",
               "authorization": f"Bearer {keys.hs256}", "x-api-key": "bench-client",
               "cookie": sticky_upstream.sticky_cookie(None), "user-agent": "tollgate-bench-k6"}
    return Request("POST", path, headers, body.encode())


# --- one cell: nginx under callgrind --------------------------------------------------------------

def render_config(spec: GatewaySpec, module: Module, prefix: pathlib.Path, listen: int, admin: int) -> pathlib.Path:
    """The lab's nginx.conf for `spec`, with `master_process off` (the worker is the process
    valgrind runs)."""
    conf = lab.nginx_config(spec, prefix, listen, admin, prefix / "error.log", "warn", module.path, kong=module.kong)
    if "master_process on;" not in conf:
        raise RuntimeError("lab.nginx_config no longer sets `master_process on;`: update render_config")
    path = prefix / "nginx.conf"
    path.write_text(conf.replace("master_process on;", "master_process off;"))
    return path


def wait_ready(admin: int, proc: subprocess.Popen, log: pathlib.Path, timeout: float) -> float:
    """Polls the admin server's /ready until it answers; returns the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx under valgrind exited with {proc.returncode}: {lab.tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=30) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"nginx not ready after {timeout:.0f} s: {lab.tail(log)}")


def send(port: int, request: Request, count: int) -> list[str]:
    """Sends `request` `count` times over one keep-alive connection; returns what was unexpected
    (not 200 from upstream blue)."""
    bad = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        for _ in range(count):
            conn.request(request.method, request.path, body=request.body, headers=request.headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200 or r.getheader("x-upstream-name") != "blue":
                bad.append(f"{r.status} from {r.getheader('x-upstream-name')}")
    finally:
        conn.close()
    return bad


def callgrind_control(option: str, pid: int) -> None:
    """`callgrind_control OPTION PID` (-z: zero the counters, -d: dump them)."""
    r = subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S)
    if r.returncode != 0 or "OK" not in r.stdout:
        raise RuntimeError(f"callgrind_control {option} {pid} failed: {r.stdout}{r.stderr}")


def stop(proc: subprocess.Popen, sig: int = signal.SIGQUIT, timeout: float = 300) -> None:
    """Stops nginx (SIGQUIT: graceful; valgrind then writes its final dump), killing it if it hangs."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run_cell(module: Module, variant: str, spec: GatewaySpec, request: Request, warmup: int, n: int,
             prefix: pathlib.Path) -> tuple[pathlib.Path, float]:
    """One run of a (module, variant) cell under callgrind, in directory `prefix`; returns the dump
    of the N measured requests and the seconds nginx took to answer (startup, with the wasm
    compilation)."""
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    listen, admin = lab.free_port(), lab.free_port()
    conf = render_config(spec, module, prefix, listen, admin)
    out = prefix / "callgrind.out"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
            "--toggle-collect=ngx_process_events_and_timers", f"--toggle-collect={TICK_HANDLER}",
            "--dump-instr=yes", "--vgdb=yes",
            lab.NGINX_BINARY, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    log = prefix / "valgrind.log"
    # The host writes /tmp/perf-<pid>.map (wasm function names and addresses): wasm_by_filter.
    env = {**os.environ, PERF_MAP_ENV: "1"}
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=prefix, start_new_session=True, env=env)
    try:
        ready = wait_ready(admin, proc, log, READY_TIMEOUT_S)
        print(f"  {module.label} {variant}: ready after {ready:.0f} s", flush=True)
        bad = send(listen, request, warmup)
        callgrind_control("-z", proc.pid)
        bad += send(listen, request, n)
        callgrind_control("-d", proc.pid)
        if bad:
            raise RuntimeError(f"{module.label} {variant}: {len(bad)} unexpected answers, e.g. {bad[:3]}")
    finally:
        stop(proc)
        perf_map = pathlib.Path(f"/tmp/perf-{proc.pid}.map")  # valgrind runs nginx in its own process
        if perf_map.exists():
            shutil.move(perf_map, prefix / "perf.map")
    dump = out.parent / (out.name + ".1")
    if not dump.exists():
        raise RuntimeError(f"no callgrind dump {dump}: {lab.tail(log)}")
    return dump, ready


# --- the callgrind file: self costs, call edges, layers -------------------------------------------

PERF_MAP_ENV = "TOLLGATE_WASM_PERFMAP"  # nginx-compat/host/src/engine.rs

Fn = tuple[str, str]  # (object, function)


@dataclasses.dataclass
class Profile:
    """A parsed callgrind dump (event Ir): self cost per function, inclusive cost and call count
    per call edge."""

    self_cost: collections.Counter[Fn]
    edges: collections.Counter[tuple[Fn, Fn]]
    calls: collections.Counter[str]  # calls per callee function name, over all callers

    @property
    def total(self) -> int:
        """Instructions in the dump (= its `totals:` line)."""
        return sum(self.self_cost.values())


def parse_callgrind(path: pathlib.Path) -> Profile:
    """Parses a callgrind output file (name compression, `calls=` lines followed by the call's
    inclusive cost line; the cost is the first event after the positions)."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    self_cost: collections.Counter[Fn] = collections.Counter()
    edges: collections.Counter[tuple[Fn, Fn]] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    ob = fn = cfn = ""
    cob: str | None = None
    npos, pending = 2, False

    def name(table: str, value: str) -> str:
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not m:
            return value
        if m.group(2) is not None:
            names[table][m.group(1)] = m.group(2)
        return names[table].get(m.group(1), "?" + m.group(1))

    with open(path, errors="replace") as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":  # a cost line: positions, then events
                toks = line.split()
                ir = int(toks[npos]) if len(toks) > npos else 0
                if pending:
                    edges[((ob, fn), (cob if cob is not None else ob, cfn))] += ir
                    pending, cob = False, None
                else:
                    self_cost[(ob, fn)] += ir
            elif line.startswith("fn="):
                fn = name("fn", line[3:].rstrip("\n"))
            elif line.startswith("ob="):
                ob = name("ob", line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                cfn = name("fn", line[4:].rstrip("\n"))
            elif line.startswith("cob="):
                cob = name("ob", line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                calls[cfn] += int(line[6:].split()[0])
                pending = True
            elif line.startswith("positions:"):
                npos = len(line.split()) - 1
    return Profile(self_cost, edges, calls)


GLUE = r"tollgate_module::|NgxProps|VmHost|WorkerHost|ngx::"
HOST = r"tollgate_host::"
GENERIC = "generic"  # libc, ld.so, Rust core/std/alloc/...: charged to callers


def classify(ob: str, fn: str) -> str:
    """The layer of a function from its object and (demangled) name; GENERIC for code charged to
    its callers."""
    if ob == "???" or (fn.startswith("0x") and "nginx" not in ob and ".so" not in ob):
        return "wasm JIT"
    if ob.endswith("/nginx"):
        return "nginx"
    if "libc.so" in ob or "ld-linux" in ob:
        return GENERIC
    if KONG_FILE in ob:  # its C code is ngx_*; Wasmtime's C API and crates; the rest (Rust std...) generic
        if fn.startswith("ngx_"):
            return "kong module"
        return "wasmtime" if re.match(r"<?(wasmtime|cranelift|wasm_)", fn) else GENERIC
    if MODULE_FILE not in ob:
        return "other"
    m = re.match(r"core::ptr::drop_in_place<(.*)>$", fn)
    f = m.group(1) if m else fn
    mm = re.match(r"<(.*) as (.*)>::", f)
    if mm:  # <X as Y>::m: the trait's crate if it is ours or wasmtime's, else X's
        f = mm.group(2) if re.match(r"(wasmtime|tollgate)", mm.group(2)) else mm.group(1)
    if re.search(GLUE, f):
        return "glue"
    if re.search(HOST, f):
        return "host core"
    if f.startswith("tollgate_services::"):
        return "services"
    if re.match(r"(wasmtime|cranelift)", f):
        return "wasmtime"
    return GENERIC


def layers(p: Profile) -> dict[str, float]:
    """Instructions per layer (summing to p.total): generic code's self cost split over its callers'
    layers by the inclusive cost of each call edge, recursively; cycles and callers-less generic
    code go to "other"."""
    callers: dict[Fn, list[tuple[Fn, int]]] = collections.defaultdict(list)
    for (a, b), w in p.edges.items():
        if a != b:
            callers[b].append((a, w))
    memo: dict[Fn, dict[str, float]] = {}

    def share(f: Fn, stack: frozenset[Fn] = frozenset()) -> dict[str, float]:
        if f in memo:
            return memo[f]
        layer = classify(*f)
        if layer != GENERIC:
            return {layer: 1.0}
        if f in stack:
            return {"other": 1.0}
        cs = callers.get(f, [])
        total = sum(w for _, w in cs)
        if total == 0:
            out = {"other": 1.0}
        else:
            acc: collections.Counter[str] = collections.Counter()
            for a, w in cs:
                for k, v in share(a, stack | {f}).items():
                    acc[k] += v * w / total
            out = dict(acc)
        memo[f] = out
        return out

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    by_layer: collections.Counter[str] = collections.Counter({k: 0 for k in LAYERS})
    for f, s in p.self_cost.items():
        for k, v in share(f).items():
            by_layer[k] += s * v
    return dict(by_layer)


def raw_objects(p: Profile) -> dict[str, int]:
    """Self cost by layer before charging generic code to callers, generic split into libc+ld.so
    and Rust std (instructions)."""
    out: collections.Counter[str] = collections.Counter()
    for (ob, fn), s in p.self_cost.items():
        layer = classify(ob, fn)
        out[layer if layer != GENERIC else ("libc" if ("libc.so" in ob or "ld-linux" in ob) else "rust std")] += s
    return dict(out)


def filter_of(names: list[str]) -> str:
    """The filter a compiled module belongs to, from its functions' (mangled) names: the most
    frequent `tollgate_<crate>` other than the shared `common`; "unnamed" for code without
    such names (nginx-compat's generated callbacks' adapters, host/src/combined_calls.rs, when
    mapped below every filter)."""
    crates = collections.Counter(m.group(1) for n in names for m in re.finditer(r"tollgate_([a-z]+(?:_[a-z]+)*)", n)
                                 if m.group(1) != "common")
    return crates.most_common(1)[0][0].replace("_", "-") if crates else "unnamed"


def wasm_by_filter(p: Profile, perf_map: pathlib.Path) -> dict[str, int]:
    """The wasm JIT layer's self cost by filter, from wasmtime's perf map (`address size name`
    per compiled function). A module's functions are contiguous, the first named
    `__wasm_call_ctors` (wasi-libc's), so a function belongs to the last such start below it.
    Code the map does not name (wasmtime's shared stubs) is "unmapped"."""
    entries = []
    for line in perf_map.read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            entries.append((int(parts[0], 16), int(parts[1], 16), parts[2]))
    entries.sort()
    starts = [e[0] for e in entries]
    module_starts = [e[0] for e in entries if e[2] == "__wasm_call_ctors"]
    names: dict[int, list[str]] = collections.defaultdict(list)
    for a, _, name in entries:
        names[bisect.bisect_right(module_starts, a)].append(name)
    label = {k: filter_of(v) for k, v in names.items()}
    out: collections.Counter[str] = collections.Counter()
    for (ob, fn), cost in p.self_cost.items():
        if classify(ob, fn) != "wasm JIT":
            continue
        m = re.match(r"0x([0-9a-fA-F]+)", fn)
        addr = int(m.group(1), 16) if m else -1
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and entries[i][0] <= addr < entries[i][0] + entries[i][1]:
            out[label[bisect.bisect_right(module_starts, entries[i][0])]] += cost
        else:
            out["unmapped"] += cost
    return dict(out)


def analyse(dump: pathlib.Path, n: int) -> dict:
    """Per-request figures of one dump of `n` requests."""
    p = parse_callgrind(dump)
    perf_map = dump.parent / "perf.map"
    by_filter = wasm_by_filter(p, perf_map) if perf_map.exists() else {}
    return {"instructions": p.total, "per_request": p.total / n,
            "layers_per_request": {k: v / n for k, v in layers(p).items()},
            "wasm_by_filter_per_request": {k: v / n for k, v in sorted(by_filter.items())},
            "self_per_request": {k: v / n for k, v in raw_objects(p).items()},
            "calls_per_request": {k: p.calls.get(fn, 0) / n for k, fn in CALLS.items()},
            "dump": str(dump.relative_to(BENCH / "results") if dump.is_relative_to(BENCH / "results") else dump)}


# --- the whole run --------------------------------------------------------------------------------

def options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", action="append", default=[], metavar="[LABEL=]PATH",
                    help=f"a build of the module (repeatable; default: built={lab.NGINX_MODULE.relative_to(ROOT)})")
    ap.add_argument("--wasm", action="append", default=[], metavar="LABEL=DIR",
                    help="a build of the filters (repeatable): compare builds, run by the first module")
    ap.add_argument("--with-wasm", action="append", default=[], metavar="LABEL=DIR",
                    help="the filters the module LABEL runs (repeatable; with --module): compare whole builds, "
                         "module and filters, e.g. main's against this branch's")
    ap.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up requests (default 50; smoke 3)")
    ap.add_argument("--requests", type=int, default=None, help="measured requests (default 200; smoke 5)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (each from a fresh nginx); the report gives the median run and the spread")
    ap.add_argument("--repeat-small", type=int, default=1,
                    help=f"runs per cell of {','.join(SMALL_VARIANTS)} (at least --repeat): the floor's target "
                         "(+4,000) is within their spread from one nginx start to the next")
    ap.add_argument("--smoke", action="store_true", help="W=3, N=5, proxy-only and floor-1: checks that it runs")
    ap.add_argument("--name", default=None, help="the report's and the work directory's name (default: instructions, "
                    "instructions.smoke or instructions_prices): runs with different names can go on side by side")
    a = ap.parse_args()
    a.warmup = a.warmup if a.warmup is not None else (3 if a.smoke else 50)
    a.requests = a.requests if a.requests is not None else (5 if a.smoke else 200)
    a.variants = a.variants.split(",") if a.variants else (
        SMOKE_VARIANTS if a.smoke else [v for v in VARIANTS if v not in NAMED_ONLY])
    unknown = set(a.variants) - set(VARIANTS)
    if unknown or a.warmup < 0 or a.requests < 1 or a.repeat < 1 or a.repeat_small < 1:
        ap.error(f"unknown variants {sorted(unknown)}" if unknown else
                 "--warmup >= 0, --requests >= 1, --repeat >= 1, --repeat-small >= 1")
    a.variants = [v for v in VARIANTS if v in a.variants]  # cheapest first: the sanity order
    return a


def machine() -> dict:
    """CPU, cores and the versions of what is measured and measures."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lock = ROOT / "nginx-compat" / "Cargo.lock"
    found = re.search(r'name = "wasmtime"\nversion = "([^"]+)"', lock.read_text()) if lock.exists() else None
    v = runner.tool_version
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": os.uname().release,
            "nginx": v([lab.NGINX_BINARY, "-v"], lambda t: t.strip().rsplit("/", 1)[-1]),
            "valgrind": v(["valgrind", "--version"], lambda t: t.strip().removeprefix("valgrind-")),
            "rustc": v(["rustc", "--version"], lambda t: " ".join(t.split()[1:])),
            "wasmtime (nginx-compat/Cargo.lock)": found.group(1) if found else "?"}


def check(cells: list[dict], n: int) -> list[str]:
    """Sanity problems: in any run, requests counted by callgrind != N, wasm code in proxy-only or
    none in a filter variant, layers not adding up; medians out of order (proxy-only < floor-1 <
    floor-5 < full)."""
    problems = []
    for c, run in ((c, run) for c in cells for run in c["runs"]):
        where = f"{c['module']} {c['variant']} ({run['dump']})"
        seen = run["calls_per_request"]["requests seen"]
        if abs(seen - 1) > 1e-9:
            problems.append(f"{where}: callgrind saw {seen * n:.0f} requests, not {n}")
        jit = run["layers_per_request"]["wasm JIT"]
        if (c["variant"] == "proxy-only" and jit > 0.01 * run["per_request"]) or (c["variant"] != "proxy-only" and jit <= 0):
            problems.append(f"{where}: {jit:.0f} wasm JIT instructions per request")
        if abs(sum(run["layers_per_request"].values()) - run["per_request"]) > 1:
            problems.append(f"{where}: the layers do not add up to the total")
    for label in dict.fromkeys(c["module"] for c in cells):
        row = [c for c in cells if c["module"] == label and c["variant"] not in UNORDERED]  # in VARIANTS order
        for a, b in zip(row, row[1:]):
            if not a["per_request"] < b["per_request"]:
                problems.append(f"{label}: {b['variant']} ({b['per_request']:.0f}) not above {a['variant']} ({a['per_request']:.0f})")
    return problems


def cell(cells: list[dict], module: str, variant: str) -> dict | None:
    return next((c for c in cells if c["module"] == module and c["variant"] == variant), None)


def comparisons(cells: list[dict], labels: list[str], variants: list[str]) -> tuple[list[dict], list[dict]]:
    """(each module / the first, per variant; each variant minus proxy-only, per module), in
    instructions per request."""
    ratios, minus = [], []
    for v in variants:
        base = cell(cells, labels[0], v)
        for m in labels[1:]:
            c = cell(cells, m, v)
            if base and c:
                ratios.append({"variant": v, "numerator": m, "denominator": labels[0], "ratio": c["per_request"] / base["per_request"],
                               "difference_per_request": c["per_request"] - base["per_request"],
                               "layers_difference_per_request": {k: c["layers_per_request"][k] - base["layers_per_request"][k] for k in LAYERS}})
    for m in labels:
        po = cell(cells, m, "proxy-only")
        for v in variants:
            c = cell(cells, m, v)
            if po and c and v != "proxy-only":
                minus.append({"module": m, "variant": v, "minus_proxy_only_per_request": c["per_request"] - po["per_request"],
                              "layers_minus_proxy_only_per_request": {k: c["layers_per_request"][k] - po["layers_per_request"][k] for k in LAYERS}})
    return ratios, minus


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def markdown(res: dict) -> str:
    """The report: totals, ratios and minus proxy-only; the layer split per module; the changes
    by layer between modules."""
    m, cells, labels, variants = res["machine"], res["cells"], [x["label"] for x in res["modules"]], res["variants"]
    get = lambda mod, v: cell(cells, mod, v)
    minus = {(x["module"], x["variant"]): x["minus_proxy_only_per_request"] for x in res["minus_proxy_only"]}
    ratio = {(x["numerator"], x["variant"]): x["ratio"] for x in res["ratios"]}
    lines = ["# Instructions per request (callgrind)" + (" — SMOKE: counts too small to mean much" if res["smoke"] else ""), "",
             f"{res['date']}; {m['cores']} cores ({m['cpu']}), kernel {m['kernel']}; nginx {m['nginx']} (Debian), "
             f"valgrind {m['valgrind']}, rustc {m['rustc']}, wasmtime {m['wasmtime (nginx-compat/Cargo.lock)']} (nginx-compat/Cargo.lock).", "",
             f"    {res['command']}", "",
             f"Per cell: nginx (`master_process off`, one worker) under callgrind, counting only inside "
             f"`ngx_process_events_and_timers` and outside the filters' tick timers (`{TICK_HANDLER}`: per interval, not per "
             f"request); {res['warmup']} warm-up requests, `callgrind_control -z`, {res['requests']} measured "
             "requests (the `stack-full` request over one keep-alive connection, every answer 200 from blue), `callgrind_control -d`, "
             "SIGQUIT. Instructions are user-space instructions of the nginx process (no kernel, no cache or IPC effects: see "
             "the gateway report for time).", "",
             "Callgrind counts instructions, so the load on this shared machine does not move the counts, and the wasm JIT, "
             "host core, wasmtime and services layers repeat from run to run to within a few instructions per request. Glue (which carries most malloc/free) "
             "and nginx do not quite: glibc's malloc takes different paths from one nginx start to the next (its heap state "
             "differs), which moves the small cells by a few percent. "
             + (f"{res['repeat']} runs per cell, each from a fresh nginx: the tables give the median run, the spread is below "
                "(within this one invocation: separate invocations, with new keys, tokens and ports, have differed more)."
                if res["repeat"] > 1 else
                f"One run per cell, {res.get('repeat_small', 1)} for {', '.join(SMALL_VARIANTS)} (the median run; the spread is below)."
                if res.get("repeat_small", 1) > 1 else "One run per cell (`--repeat 3` shows the spread)."), "",
             ("Builds (module and filters): " + "; ".join(
                 f"**{x['label']}** = module `{x['source']}` (sha256 {x['sha256'][:12]}…), filters `{x['wasm_dir'] or res['wasm_dir']}`"
                 for x in res["modules"]) + ". Filters: "
                 + ", ".join(f"{k} ({v[:12]}…)" for k, v in res["wasm"].items()) + ", copied at the start."
                 if len({x['sha256'] for x in res["modules"]}) > 1 and any(x.get("wasm_dir") for x in res["modules"]) else
             ("Filter builds: " + "; ".join(f"**{x['label']}** = `{x['source']}`" for x in res["modules"])
                 + f", run by the module {res['modules'][0]['sha256'][:12]}…. Filters: "
                 + ", ".join(f"{k} ({v[:12]}…)" for k, v in res["wasm"].items() if "/" in k) + ", copied at the start."
                 if any(x.get("wasm_dir") for x in res["modules"]) else
                 "Modules: " + "; ".join(f"**{x['label']}** = `{x['source']}` (sha256 {x['sha256'][:12]}…)" for x in res["modules"]) + ". "
                 "Filters: " + ", ".join(f"{k} ({v[:12]}…)" for k, v in res["wasm"].items()) + ", copied from "
                 f"`{res['wasm_dir']}` at the start, the same for every module.")), "",
             "## Instructions per request", "",
             "| variant | " + " | ".join(labels) + "".join(f" | {x}/{labels[0]}" for x in labels[1:])
             + "".join(f" | {x} − proxy-only" for x in labels) + "".join(f" | {x}/{labels[0]} (− proxy-only)" for x in labels[1:]) + " |",
             "|---" * (4 * len(labels) - 1) + "|"]  # variant, totals, ratios, minus proxy-only, their ratios
    for v in variants:
        row = [fmt(get(x, v)["per_request"] if get(x, v) else None) for x in labels]
        row += [f"**{ratio[(x, v)]:.3f}**" if (x, v) in ratio else "–" for x in labels[1:]]
        row += [fmt(minus.get((x, v))) if v != "proxy-only" else "0" for x in labels]
        row += [f"{minus[(x, v)] / minus[(labels[0], v)]:.3f}" if minus.get((x, v)) and minus.get((labels[0], v)) else "–" for x in labels[1:]]
        lines.append(f"| {v} | " + " | ".join(row) + " |")
    target_rows = [(v, what, limit) for v, what, limit in TARGETS if v in variants and "proxy-only" in variants]
    if target_rows:
        lines += ["", "## Issue 34's targets (nginx, one worker)", "",
                  "| variant | target | " + " | ".join(labels) + " |", "|---" * (len(labels) + 2) + "|"]
        for v, what, limit in target_rows:
            def reached(x):
                c, base = get(x, v), get(x, "proxy-only")
                if not c or not base:
                    return "–"
                if what == "minus":
                    got = c["per_request"] - base["per_request"]
                    return f"{fmt(got)} ({'met' if got <= limit else 'missed'})"
                if what in CALLS:
                    got = c.get("calls_per_request", {}).get(what)
                    # Two decimals: a tick's entry now and then (the metrics flush) puts an
                    # average just over a whole number, which ".0f" showed as the target itself.
                    return "–" if got is None else f"{got:.2f} ({'met' if got <= limit else 'missed'})"
                got = c["per_request"] / base["per_request"]
                return f"{got:.2f}x ({'met' if got <= limit else 'missed'})"
            goal = (f"at most +{fmt(limit)} over proxy-only" if what == "minus" else
                    f"at most {limit} {what} per request" if what in CALLS else f"at most {limit}x proxy-only")
            lines.append(f"| {v} | {goal} | " + " | ".join(reached(x) for x in labels) + " |")
    spread_variants = [v for v in variants if runs_of(v, res["repeat"], res.get("repeat_small", 1)) > 1]
    if spread_variants:
        lines += ["", "## Spread over the runs (instructions per request, sorted; max/min − 1)", "",
                  "| variant | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        for v in spread_variants:
            runs = lambda c: " / ".join(fmt(r["per_request"]) for r in sorted(c["runs"], key=lambda r: r["per_request"]))
            spread = lambda c: f" ({c['per_request_max'] / c['per_request_min'] - 1:.1%})"
            lines.append(f"| {v} | " + " | ".join(runs(get(x, v)) + spread(get(x, v)) if get(x, v) else "–" for x in labels) + " |")
    lines += ["", "## By layer (instructions per request)", "",
              "libc, ld.so and Rust core/std/alloc/hashbrown code is charged to its callers' layers (by the inclusive cost "
              "of each call edge). wasm JIT = the filters' compiled code (with the proxy-wasm SDK and wasmtime's generated "
              "trampolines); host core = tollgate_host; glue = tollgate_module (and the ngx crate); services = "
              "tollgate_services; other = other objects, and generic code with no caller in the dump. Guest entries = calls into wasm "
              "(`invoke_wasm_and_catch_traps`, nested guest malloc included); host calls = wasm → host calls.", ""]
    head = "| variant | total | " + " | ".join(LAYERS) + " | guest entries | host calls |"
    for x in labels:
        lines += [f"### {x}", "", head, "|---" * (len(LAYERS) + 4) + "|"]
        for v in variants:
            c = get(x, v)
            if c:
                lay, calls = c["layers_per_request"], c["calls_per_request"]
                lines.append(f"| {v} | {fmt(c['per_request'])} | " + " | ".join(fmt(lay[k]) for k in LAYERS)
                             + f" | {calls['guest entries']:.1f} | {calls['host calls']:.1f} |")
        lines.append("")
    for x in labels[1:]:
        lines += [f"### {x} − {labels[0]}, by layer", "", "| variant | total | " + " | ".join(LAYERS) + " |", "|---" * (len(LAYERS) + 2) + "|"]
        for r in (r for r in res["ratios"] if r["numerator"] == x):
            d = r["layers_difference_per_request"]
            lines.append(f"| {r['variant']} | {r['difference_per_request']:+,.0f} | " + " | ".join(f"{d[k]:+,.0f}" for k in LAYERS) + " |")
        lines.append("")
    filters = sorted({f for c in cells for f in c.get("wasm_by_filter_per_request", {})})
    if filters:
        lines += ["## The wasm JIT layer by filter (instructions per request)", "",
                  "Each filter's compiled code (its SDK, allocator and wasmtime trampolines included), from the perf map "
                  f"the host writes when `{PERF_MAP_ENV}` is set; a filter twice in a chain is counted once, both instances "
                  "together.", "", "| build | variant | " + " | ".join(filters) + " |", "|---" * (len(filters) + 2) + "|"]
        for x in labels:
            for v in variants:
                c = get(x, v)
                if c and c.get("wasm_by_filter_per_request"):
                    w = c["wasm_by_filter_per_request"]
                    lines.append(f"| {x} | {v} | " + " | ".join(fmt(w.get(f)) for f in filters) + " |")
        lines.append("")
    lines += ["## Minus proxy-only, by layer", "", "| module | variant | total | " + " | ".join(LAYERS) + " |", "|---" * (len(LAYERS) + 3) + "|"]
    for r in res["minus_proxy_only"]:
        d = r["layers_minus_proxy_only_per_request"]
        lines.append(f"| {r['module']} | {r['variant']} | {r['minus_proxy_only_per_request']:+,.0f} | " + " | ".join(f"{d[k]:+,.0f}" for k in LAYERS) + " |")
    lines += ["", f"Wall time: {res['seconds']:.0f} s; until nginx answered under valgrind (startup, the wasm compilation): "
              + ", ".join(f"{c['module']} {c['variant']} {c['ready_seconds']:.0f} s" for c in cells) + " (median runs). "
              f"Callgrind files: `{res['workdir']}/<module>/<variant>/run<k>/callgrind.out.1` (git-ignored; callgrind_annotate, kcachegrind)."]
    if res["problems"]:
        lines += ["", "**Sanity check failed:**", ""] + [f"- {p}" for p in res["problems"]]
    return "\n".join(lines) + "\n"


def median_cell(module: str, variant: str, runs: list[dict]) -> dict:
    """A cell: its median run (by instructions per request; the lower one of an even count) with
    every run under "runs"."""
    ordered = sorted(runs, key=lambda r: r["per_request"])
    return {"module": module, "variant": variant, **ordered[(len(ordered) - 1) // 2], "runs": runs,
            "per_request_min": ordered[0]["per_request"], "per_request_max": ordered[-1]["per_request"]}


def runs_of(variant: str, repeat: int, repeat_small: int) -> int:
    """Runs of a cell: `repeat`, or `repeat_small` for SMALL_VARIANTS when it is more."""
    return max(repeat, repeat_small) if variant in SMALL_VARIANTS else repeat


def measure_all(modules: list[Module], variants: list[str], warmup: int, n: int, repeat: int,
                workdir: pathlib.Path, repeat_small: int = 1) -> list[dict]:
    """Every (module, variant) cell `runs_of` times (each round runs every cell still due in
    turn), with the three demo upstreams up; returns the cells (median runs)."""
    keys = jwt_auth.make_keys(ttl=86400 * 7)
    default_wasm = lab.paths.WASM_DIR  # the snapshot of the built filters (snapshot_wasm)
    requests = {v: stack_full_request(keys, DOTTED_PATH if v == "likely-dotted" else "/v1/chat/completions") for v in variants}
    upstreams: dict[str, DemoUpstream] = {}
    runs: dict[tuple[str, str], list[dict]] = {(m.label, v): [] for m in modules for v in variants}
    try:
        for name in sticky_upstream.UPSTREAMS:
            upstreams[name] = DemoUpstream(name, workdir)
        ports = {k: u.port for k, u in upstreams.items()}
        for r in range(max(runs_of(v, repeat, repeat_small) for v in variants)):
            for module in modules:
                for v in variants:
                    if r >= runs_of(v, repeat, repeat_small):
                        continue
                    t0 = time.monotonic()
                    prefix = workdir / module.label / v / f"run{r + 1}"
                    lab.paths.WASM_DIR = module.wasm_dir or default_wasm
                    dump, ready = run_cell(module, v, variant_spec(v, keys, ports), requests[v], warmup, n, prefix)
                    row = {**analyse(dump, n), "ready_seconds": ready, "cell_seconds": time.monotonic() - t0}
                    runs[(module.label, v)].append(row)
                    print(f"  run {r + 1}: {module.label} {v}: {row['per_request']:,.0f} instructions per request "
                          f"({row['cell_seconds']:.0f} s)", flush=True)
    finally:
        for u in upstreams.values():
            u.stop()
    return [median_cell(m, v, rs) for (m, v), rs in runs.items()]


def main() -> int:
    a = options()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: scripts/apt.sh valgrind")
    name = a.name or ("instructions.smoke" if a.smoke else (
        "instructions_prices" if set(a.variants) <= set(PRICE_VARIANTS) else "instructions"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SystemExit(f"--name {name!r}: letters, digits, '_', '.', '-' only")
    workdir = BENCH / "results" / "tmp" / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    t0 = time.monotonic()
    wasm_dir = lab.paths.WASM_DIR
    module_args = [parse_module(m, i) for i, m in enumerate(a.module)] or [("built", lab.NGINX_MODULE)]
    if len({l for l, _ in module_args}) != len(module_args):
        raise SystemExit("two modules with the same label: use --module LABEL=PATH")
    modules = snapshot_modules(module_args, workdir)
    wasm = snapshot_wasm(workdir)
    if a.wasm:
        # One column per build of the filters, each run by the first module.
        builds = []
        for i, arg in enumerate(a.wasm):
            label, src = parse_module(arg, i)
            wasm.update({f"{label}/{k}": v for k, v in snapshot_wasm(workdir, src, f"wasm-{label}").items()})
            builds.append(dataclasses.replace(modules[0], label=label, source=src, wasm_dir=workdir / f"wasm-{label}"))
        if len({b.label for b in builds}) != len(builds):
            raise SystemExit("two builds with the same label: use --wasm LABEL=DIR")
        modules = builds
    for i, arg in enumerate(a.with_wasm):
        label, src = parse_module(arg, i)
        match = [j for j, m in enumerate(modules) if m.label == label]
        if a.wasm or not match:
            raise SystemExit(f"--with-wasm {arg}: names a --module label (and goes without --wasm)")
        wasm.update({f"{label}/{k}": v for k, v in snapshot_wasm(workdir, src, f"wasm-{label}").items()})
        modules[match[0]] = dataclasses.replace(modules[match[0]], wasm_dir=workdir / f"wasm-{label}")
    print(f"modules: {', '.join(f'{m.label}={m.source}' for m in modules)}; variants {a.variants}; W={a.warmup} N={a.requests}", flush=True)
    cells = measure_all(modules, a.variants, a.warmup, a.requests, a.repeat, workdir, a.repeat_small)
    labels = [m.label for m in modules]
    ratios, minus = comparisons(cells, labels, a.variants)
    res = {"name": name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
           "command": shlex.join(["python3", "bench/instructions.py", *sys.argv[1:]]), "smoke": a.smoke,
           "warmup": a.warmup, "requests": a.requests, "repeat": a.repeat, "repeat_small": a.repeat_small,
           "variants": a.variants,
           "modules": [{"label": m.label, "source": str(m.source), "sha256": m.sha256, "size_bytes": m.size,
                        "wasm_dir": str(m.wasm_dir) if m.wasm_dir else None} for m in modules],
           "wasm_dir": str(wasm_dir.relative_to(ROOT) if wasm_dir.is_relative_to(ROOT) else wasm_dir), "wasm": wasm,
           "units": "instructions (callgrind Ir, user space of the nginx process); *_per_request: per measured request",
           "workdir": str(workdir.relative_to(ROOT)), "cells": cells, "ratios": ratios, "minus_proxy_only": minus, "problems": check(cells, a.requests),
           "seconds": time.monotonic() - t0}
    out = BENCH / "results" / name
    (out.parent / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out.parent / f"{name}.md").write_text(markdown(res))
    print((out.parent / f"{name}.md").read_text())
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
