"""End-to-end harness: real gateways and upstreams on loopback, started and stopped by the tests.

A test describes the gateway it needs with a host-agnostic `GatewaySpec` (filters in chain order
with their plugin configurations, upstream clusters, workers, zones); a host renders it into its
own configuration, starts the proxy and stops it: `EnvoyHost` (Envoy's YAML), `NginxHost` (Debian's
nginx with Tollgate's module), `NginxMuslHost` (nginx and the module built on musl) and `KongHost`
(Kong's ngx_wasm_module, whose known differences are `KONG_DIFFERENCES`, asked with
`kong_differs`). `HOSTS` maps the names `TOLLGATE_HOSTS` selects to them. Tests use the
`Gateway` a host returns (`url`, logs, stop), so the same test runs against every host with the
same expectations. bench/ and fuzz/ import it too, to start the same gateways.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
# TOLLGATE_WASM_DIR runs the suites against other builds of the filters (e.g. main's, to show
# that a new test fails there).
WASM_DIR = pathlib.Path(os.environ.get("TOLLGATE_WASM_DIR") or ROOT / "target" / "wasm32-wasip1" / "release")
TARGET = ROOT / "target"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None, timeout: float, log: pathlib.Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening after {timeout}s: {tail(log)}")


def wait_until(predicate, timeout: float, step: float = 0.25) -> float:
    """Polls `predicate` every `step` seconds until it is true; the seconds that took, or
    AssertionError after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


def tail(log: pathlib.Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class Process:
    """A child process in its own session, logged to a file, always stopped."""

    def __init__(self, argv: list[str], log: pathlib.Path, cwd: pathlib.Path = ROOT):
        self.log = log
        self._file = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._file, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._file.close()


class DemoUpstream:
    """The demo upstream (demo-upstream/, Go): echoes what it received, LLM-shaped endpoints."""

    def __init__(self, name: str, workdir: pathlib.Path, cpus: str | None = None):
        self.name = name
        self.port = free_port()
        argv = [str(TARGET / "demo-upstream"), "-listen", f"127.0.0.1:{self.port}", "-name", name]
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self.process = Process(argv, workdir / f"upstream-{name}.log")
        wait_for_port(self.port, self.process.proc, 10, self.process.log)

    def stop(self) -> None:
        self.process.stop()


# tests/filters/probe: a test-only filter that uses the ABI as other people's filters do.
PROBE_WASM = WASM_DIR / "test_probe.wasm"
# tests/filters/abi-fuzz: a test-only hostile guest (seeded calls of every import).
ABI_FUZZ_WASM = WASM_DIR / "test_abi_fuzz.wasm"


@dataclasses.dataclass
class FilterSpec:
    """One proxy-wasm filter of the chain: `plugin` is the directory name under plugins/ (or
    any name, with `wasm_file` giving the module)."""

    plugin: str
    config: dict[str, Any]
    root_id: str | None = None
    wasm_file: pathlib.Path | None = None

    @property
    def wasm(self) -> pathlib.Path:
        return self.wasm_file or WASM_DIR / f"tollgate_{self.plugin.replace('-', '_')}.wasm"


@dataclasses.dataclass
class EnvoyNativeFilter:
    """One of Envoy's own HTTP filters (a benchmark baseline), given as its filter entry."""

    name: str
    typed_config: dict[str, Any]


@dataclasses.dataclass
class GatewaySpec:
    """What a test needs from a gateway, independent of the host."""

    filters: list[FilterSpec | EnvoyNativeFilter]
    upstreams: dict[str, int | list[int]]  # cluster name -> port(s) on 127.0.0.1 (a list: one endpoint each); the first is the default route
    workers: int = 1
    route_header: str | None = None  # route by this header's value (cluster name) when set
    stats_config: dict[str, Any] | None = None  # Envoy bootstrap `stats_config` (e.g. stats_tags), rendered as given
    kv_zones: dict[str, str | None] | None = None  # nginx `shm_kv NAME ARGS;` (e.g. {"cost": "64k eviction=none"}) beside DEFAULT_KV_ZONES (None: not declared); Envoy's shared data has no zones
    # The shipped configurations' path handling: Envoy normalises paths before the filters
    # (normalize_path, merge_slashes, escaped slashes refused); nginx proxies the URI it
    # normalised ($uri) instead of the raw request target. Off: both forward the raw target.
    normalize_paths: bool = False
    # nginx hosts: forward only these request headers (`proxy_pass_request_headers off;` and
    # `proxy_set_header NAME $http_NAME;` each), the remedy for Kong's "hidden-headers-forwarded":
    # `$http_NAME` reads the first visible copy, so a header a filter removed stays behind. Envoy:
    # RuntimeError (its filters' removals are real).
    request_header_allowlist: list[str] | None = None
    # gRPC services the filters call (`dispatch_grpc_call`), cluster name -> port on 127.0.0.1:
    # Envoy clusters speaking HTTP/2 (prior knowledge), nginx `upstream {}` blocks of the same
    # name (the host's gRPC client speaks HTTP/2 itself). Not routes: no request is proxied there.
    grpc_services: dict[str, int] | None = None
    # Kong's module (no per-worker counters): log the worker (pid) of each proxied request, read
    # by KongGateway.worker_log. Off by default: the benchmarks render the same configuration.
    worker_log: bool = False
    # Request header names with `_`: None, each host's default (Envoy forwards them, nginx drops
    # them: `underscores_in_headers off`); True, forwarded (nginx `underscores_in_headers on`);
    # False, refused (Envoy's `headers_with_underscores_action: REJECT_REQUEST`, as envoy/*.yaml
    # ship; nginx drops them, its default).
    underscores_in_headers: bool | None = None
    # A cleartext HTTP/2 listener (prior knowledge, "h2c") for gRPC clients, at
    # `Gateway.h2_address`. Envoy's listener already takes it beside HTTP/1.1 (the connection
    # manager's codec_type AUTO); nginx 1.22's `listen ... http2;` without TLS speaks HTTP/2 only,
    # so nginx gets a second `listen` of that kind in the same server (same locations, filters).
    http2_listener: bool = False


class Gateway:
    url: str
    log: pathlib.Path
    # `host:port` of the gateway's cleartext HTTP/2 listener (GatewaySpec.http2_listener).
    h2_address: str | None = None

    def stop(self) -> None:
        raise NotImplementedError


def envoy_binary() -> str:
    found = glob.glob(str(ROOT / ".venv/lib/python3*/site-packages/envoy/_bin/envoy"))
    if not found:
        raise RuntimeError("Envoy is not installed: run scripts/setup.sh")
    return found[0]


def wasm_filter(f: FilterSpec | EnvoyNativeFilter) -> dict:
    if isinstance(f, EnvoyNativeFilter):
        return {"name": f.name, "typed_config": f.typed_config}
    name = f.root_id or f.plugin.replace("-", "_")
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": name,
                "vm_config": {
                    "vm_id": f"tollgate_{name}",
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": str(f.wasm)}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": json.dumps(f.config),
                },
                "fail_open": False,
            },
        },
    }


# As in envoy/*.yaml (README: "Paths").
ENVOY_PATH_NORMALIZATION = {
    "normalize_path": True,
    "merge_slashes": True,
    "path_with_escaped_slashes_action": "REJECT_REQUEST",
}


def envoy_config(spec: GatewaySpec, listen_port: int, admin_port: int) -> dict:
    if spec.request_header_allowlist is not None:
        raise RuntimeError("request_header_allowlist is an nginx remedy (Kong's hidden headers); Envoy has no need of it")
    default_cluster = next(iter(spec.upstreams))
    if spec.route_header:
        route = {"cluster_header": spec.route_header}
    else:
        route = {"cluster": default_cluster}
    clusters = [
        {
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                                                for p in (ports if isinstance(ports, list) else [ports])]}],
            },
        }
        for name, ports in spec.upstreams.items()
    ]
    for name, port in (spec.grpc_services or {}).items():
        clusters.append({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
            },
        })
    bootstrap = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "gateway",
                                        "max_request_headers_kb": 96,
                                        **(ENVOY_PATH_NORMALIZATION if spec.normalize_paths else {}),
                                        **({"common_http_protocol_options": {"headers_with_underscores_action": "REJECT_REQUEST"}}
                                           if spec.underscores_in_headers is False else {}),
                                        "route_config": {
                                            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}]
                                        },
                                        "http_filters": [wasm_filter(f) for f in spec.filters]
                                        + [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }
    if spec.stats_config is not None:
        bootstrap["stats_config"] = spec.stats_config
    return bootstrap


class EnvoyHost:
    name = "envoy"

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir

    def validate(self, config_path: pathlib.Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--use-dynamic-base-id", "-l", "warn"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )

    def render(self, spec: GatewaySpec) -> tuple[pathlib.Path, int, int]:
        listen, admin = free_port(), free_port()
        path = pathlib.Path(tempfile.mkstemp(prefix="envoy-", suffix=".json", dir=self.workdir)[1])
        path.write_text(json.dumps(envoy_config(spec, listen, admin), indent=1))
        return path, listen, admin

    def start(self, spec: GatewaySpec, timeout: float = 60, log_level: str = "info", cpus: str | None = None) -> "EnvoyGateway":
        path, listen, admin = self.render(spec)
        g = EnvoyGateway(path, listen, admin, spec.workers, timeout, log_level, cpus)
        if spec.http2_listener:
            g.h2_address = f"127.0.0.1:{listen}"  # codec_type AUTO: HTTP/1.1 and h2c on one port
        return g


class EnvoyGateway(Gateway):
    def __init__(self, config: pathlib.Path, listen: int, admin: int, workers: int, timeout: float, log_level: str = "info", cpus: str | None = None):
        self.url = f"http://127.0.0.1:{listen}"
        self.admin = f"http://127.0.0.1:{admin}"
        self.log = config.with_suffix(".log")
        argv = [envoy_binary(), "-c", str(config), "--concurrency", str(workers), "--use-dynamic-base-id", "-l", log_level, "--disable-hot-restart"]
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self.process = Process(argv, self.log)
        try:
            wait_for_port(listen, self.process.proc, timeout, self.log)
        except Exception:
            self.process.stop()
            raise

    @property
    def pids(self) -> list[int]:
        """The processes whose CPU time is the gateway's."""
        return [self.process.proc.pid]

    def alive(self) -> bool:
        return self.process.proc.poll() is None and requests.get(self.admin + "/ready", timeout=5).status_code == 200

    def stats(self, prefix: str = "") -> dict[str, int]:
        text = requests.get(self.admin + "/stats", params={"filter": prefix} if prefix else None, timeout=5).text
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stop(self) -> None:
        self.process.stop()


# TOLLGATE_NGINX_MODULE: another build of the module (e.g. an older commit's, to show a test
# fails there).
NGINX_MODULE = pathlib.Path(os.environ.get("TOLLGATE_NGINX_MODULE", TARGET / "nginx" / "ngx_http_tollgate_wasm_module.so"))
NGINX_BINARY = "/usr/sbin/nginx"


def nginx_quote(value: str) -> str:
    """An nginx configuration string: single-quoted, with `\\` and `'` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Longest plugin configuration written inline: nginx refuses an argument longer than about 4 KB;
# longer ones go to a file read by `tollgate_proxy_wasm_file` (nginx-compat/module/src/conf_file.rs).
NGINX_INLINE_CONFIG_MAX = 3000


# The zones every rendered nginx configuration declares unless the spec names them itself:
# rate-limit's `ratelimit/` keys and cost's ledger (`cost/`), each in a zone that never evicts.
DEFAULT_KV_ZONES = {"ratelimit": "4m eviction=none", "cost": "4m eviction=none"}


def nginx_config(spec: GatewaySpec, prefix: pathlib.Path, listen_port: int, admin_port: int, error_log: pathlib.Path,
                 log_level: str = "info", module: pathlib.Path | None = None, kong: bool = False,
                 h2_port: int | None = None) -> str:
    """nginx.conf for a GatewaySpec: the Tollgate module, one `module` per plugin, the chain as
    `proxy_wasm` directives (`tollgate_proxy_wasm_file` with a file under `prefix` for
    configurations over NGINX_INLINE_CONFIG_MAX bytes), upstreams as `upstream {}` blocks (routed
    by `spec.route_header` through `$http_<header>` when set), and an admin server (`/stats`,
    `/ready`).

    `kong`: for Kong's ngx_wasm_module (KongHost), which has the same `wasm {}` `module` /
    `shm_kv` and `proxy_wasm` directives but neither `tollgate_proxy_wasm_file` (a configuration
    over nginx's 4 KB argument limit cannot be given: RuntimeError) nor `tollgate_metrics` (the
    admin server's `/stats` answers 501), and no implicit default zone: ours adds `shm_kv *`
    (4 MiB, LRU) when none is declared, Kong traps on shared data ("could not resolve
    namespace"), so that zone is declared here.

    `h2_port`: the port of the cleartext HTTP/2 listener (`listen ... http2;`) that
    `spec.http2_listener` asks for (RuntimeError without one)."""
    module = module or NGINX_MODULE
    if spec.http2_listener and h2_port is None:
        raise RuntimeError("spec.http2_listener needs an h2_port")
    if not module.exists():
        build = "scripts/build-kong-module.sh" if kong else "scripts/build-nginx-module.sh (glibc) or scripts/build-nginx-musl.sh (musl)"
        raise RuntimeError(f"{module} is missing: run {build}")
    modules: dict[str, pathlib.Path] = {}
    chain = []
    for f in spec.filters:
        if isinstance(f, EnvoyNativeFilter):
            raise RuntimeError(f"Envoy's native filter {f.name} has no nginx equivalent")
        name = f.root_id or f.plugin.replace("-", "_")
        modules.setdefault(name, f.wasm)
        text = json.dumps(f.config)
        if len(text) > NGINX_INLINE_CONFIG_MAX and kong:
            raise RuntimeError(f"{name}: a configuration of {len(text)} bytes is over nginx's 4 KB argument limit, "
                               "and Kong's module has no equivalent of tollgate_proxy_wasm_file")
        if len(text) > NGINX_INLINE_CONFIG_MAX:
            config_file = prefix / f"filter-{len(chain)}-{name}.json"
            config_file.write_text(text)
            chain.append(f"            tollgate_proxy_wasm_file {name} {config_file};")
        else:
            chain.append(f"            proxy_wasm {name} {nginx_quote(text)};")
    upstreams = []
    for name, ports in spec.upstreams.items():
        servers = "".join(f"        server 127.0.0.1:{p};\n" for p in (ports if isinstance(ports, list) else [ports]))
        upstreams.append(f"    upstream {name} {{\n{servers}        keepalive 16;\n    }}")
    for name, port in (spec.grpc_services or {}).items():
        upstreams.append(f"    upstream {name} {{\n        server 127.0.0.1:{port};\n    }}")
    default = next(iter(spec.upstreams))
    if spec.route_header:
        var = "$http_" + spec.route_header.lower().replace("-", "_")
        target = "http://$tollgate_route"
        route_map = f"    map {var} $tollgate_route {{\n        default {var};\n        '' {default};\n    }}\n"
    else:
        target = f"http://{default}"
        route_map = ""
    # As in nginx-compat/conf/full-chain.conf: the state that limits and budgets enforce lives in
    # zones that never evict (rate-limit and cost refuse to load on one that does; the implicit
    # `*` zone evicts). A spec's own kv_zones replace these; a zone given as None is not declared.
    kv_zones = {name: args for name, args in {**DEFAULT_KV_ZONES, **(spec.kv_zones or {})}.items() if args is not None}
    if kong:
        kv_zones.setdefault("*", "4m eviction=lru")
    modules_conf = "\n".join([f"    module {n} {p};" for n, p in modules.items()]
                             + [f"    shm_kv {n} {args};" for n, args in kv_zones.items()])
    # As in nginx-compat/conf/*.conf: proxy the URI nginx normalised, not the raw target.
    rewrite = "            rewrite ^ $uri break;\n" if spec.normalize_paths else ""
    chain_conf = "\n".join(chain)
    if spec.request_header_allowlist is not None:
        chain_conf += "\n            proxy_pass_request_headers off;" + "".join(
            f"\n            proxy_set_header {h} $http_{h.lower().replace('-', '_')};" for h in spec.request_header_allowlist)
    # Kong's module has no per-worker counters: a test that asks (spec.worker_log) gets the
    # worker (pid) of each proxied request logged instead (KongGateway.worker_log).
    worker_log = f"        access_log {prefix}/workers.log tollgate_worker;\n" if kong and spec.worker_log else ""
    underscores = "        underscores_in_headers on;\n" if spec.underscores_in_headers else ""
    stats = ("location /stats { return 501 \"Kong's ngx_wasm_module has no metrics endpoint\\n\"; }" if kong
             else "location /stats { tollgate_metrics; }")
    h2_listen = f"        listen 127.0.0.1:{h2_port} http2 reuseport;\n" if spec.http2_listener else ""
    return f"""# Rendered by tests/e2e/harness.py ({"KongHost" if kong else "NginxHost"})
load_module {module};
worker_processes {spec.workers};
master_process on;
env RUST_BACKTRACE=1;
daemon off;
pid {prefix}/nginx.pid;
error_log {error_log} {log_level};
events {{ worker_connections 4096; }}
wasm {{
{modules_conf}
}}
http {{
    access_log off;
    log_format tollgate_worker '$pid';
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    large_client_header_buffers 4 128k;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
{chr(10).join(upstreams)}
{route_map}    server {{
        listen 127.0.0.1:{listen_port} reuseport;
{h2_listen}{underscores}{worker_log}        location / {{
{rewrite}{chain_conf}
            proxy_pass {target};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            # Envoy answers 503 when it cannot reach the upstream (nginx: 502).
            error_page 502 = @tollgate_unreachable;
        }}
        location @tollgate_unreachable {{
            return 503 "upstream connect error or disconnect/reset before headers. reset reason: connection failure";
        }}
    }}
    server {{
        listen 127.0.0.1:{admin_port};
        location = /ready {{ return 200 "ready\\n"; }}
        {stats}
    }}
}}
"""


class NginxHost:
    """Stock Debian nginx with Tollgate's dynamic module (nginx-compat/module)."""

    name = "nginx"
    kong = False  # KongHost: the configuration rendered for Kong's module, a KongGateway

    def __init__(self, workdir: pathlib.Path, nginx_binary: str | None = None, module: pathlib.Path | None = None):
        self.workdir = workdir
        self.binary = nginx_binary or NGINX_BINARY
        self.module = module or NGINX_MODULE

    def validate(self, config_path: pathlib.Path) -> subprocess.CompletedProcess:
        prefix = pathlib.Path(tempfile.mkdtemp(prefix="nginx-t-", dir=self.workdir))
        return subprocess.run(
            [self.binary, "-t", "-p", str(prefix), "-c", str(config_path), "-e", str(prefix / "error.log")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )

    def render(self, spec: GatewaySpec, log_level: str = "info", h2_port: int | None = None) -> tuple[pathlib.Path, int, int]:
        listen, admin = free_port(), free_port()
        prefix = pathlib.Path(tempfile.mkdtemp(prefix="nginx-", dir=self.workdir))
        conf = prefix / "nginx.conf"
        conf.write_text(nginx_config(spec, prefix, listen, admin, prefix.with_suffix(".log"), log_level, self.module,
                                     kong=self.kong, h2_port=h2_port))
        return conf, listen, admin

    def start(self, spec: GatewaySpec, timeout: float = 60, log_level: str = "info", cpus: str | None = None) -> "NginxGateway":
        level = {"trace": "debug", "debug": "debug", "info": "info", "warning": "warn", "warn": "warn", "error": "error"}.get(log_level, "info")
        level = NGINX_LOG_LEVEL or level
        h2_port = free_port() if spec.http2_listener else None
        conf, listen, admin = self.render(spec, level, h2_port)
        g = (KongGateway if self.kong else NginxGateway)(conf, listen, admin, timeout, cpus, self.binary)
        if h2_port is not None:
            g.h2_address = f"127.0.0.1:{h2_port}"
        return g


class NginxGateway(Gateway):
    def __init__(self, config: pathlib.Path, listen: int, admin: int, timeout: float, cpus: str | None = None,
                 binary: str | None = None):
        self.url = f"http://127.0.0.1:{listen}"
        self.admin = f"http://127.0.0.1:{admin}"
        prefix = config.parent
        self.prefix = prefix
        self.log = prefix.with_suffix(".log")
        argv = [binary or NGINX_BINARY, "-p", str(prefix), "-c", str(config), "-e", str(self.log)]
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self.process = Process(argv, prefix.with_suffix(".out.log"))
        try:
            wait_for_port(listen, self.process.proc, timeout, self.log)
            wait_for_port(admin, self.process.proc, timeout, self.log)
        except Exception:
            self.process.stop()
            raise

    @property
    def pids(self) -> list[int]:
        """The master and its workers."""
        pids = [self.process.proc.pid]
        try:
            out = subprocess.run(["pgrep", "-P", str(self.process.proc.pid)], capture_output=True, text=True).stdout
            pids += [int(p) for p in out.split()]
        except OSError:
            pass
        return pids

    def alive(self) -> bool:
        return self.process.proc.poll() is None and requests.get(self.admin + "/ready", timeout=5).status_code == 200

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Filter metrics summed over the workers, named like Envoy's /stats
        (`wasmcustom.<name as defined>`)."""
        text = requests.get(self.admin + "/stats", params={"format": "envoy"}, timeout=5).text
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if prefix and prefix not in name:
                continue
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stop(self) -> None:
        self.process.stop()


NGINX_MUSL_BINARY = TARGET / "nginx-musl" / "install" / "sbin" / "nginx"
NGINX_MUSL_MODULE = TARGET / "nginx-musl" / "ngx_http_tollgate_wasm_module.so"


class NginxMuslHost(NginxHost):
    """nginx 1.22.1 built from Debian's source with musl-gcc, loading the module built for
    x86_64-unknown-linux-musl (scripts/build-nginx-musl.sh): the libc of the Alpine image."""

    name = "nginx-musl"

    def __init__(self, workdir: pathlib.Path):
        super().__init__(workdir, nginx_binary=str(NGINX_MUSL_BINARY), module=NGINX_MUSL_MODULE)


KONG_MODULE = TARGET / "kong" / "ngx_wasmx_module.so"

# What Kong's ngx_wasm_module (snapshot 3bed278) does differently from our nginx host and Envoy,
# each expected by the suites on the kong host through kong_differs(host, NAME) (grep for the
# name to find the tests). The same list, with the causes in Kong's source, is the table in
# nginx-compat/README.md ("Tollgate's filters under Kong's ngx_wasm_module").
KONG_DIFFERENCES: dict[str, str] = {
    "no-stats": "no metrics endpoint in plain nginx: filter counters are served to Kong's Lua "
                "(resty.wasmx) only, so the admin server's /stats answers 501",
    "hidden-headers-forwarded": "a removed request header is only hidden (hash 0) and nginx 1.22's "
                                "proxy module forwards it anyway: forged copies reach the upstream",
    "dispatch-by-address": "dispatch_http_call's target is resolved as host[:port] by Kong's own "
                           "resolver, never as an nginx upstream{} (Envoy: a cluster; ours: either)",
    "no-code-details": "no response.code_details property: sticky-upstream cannot tell the proxy's "
                       "503 from the upstream's own and re-pins on both (a missing property is the proxy's answer)",
    "error-page-skips-filters": "an internal redirect (error_page to a location without proxy_wasm) "
                                "drops the request's filter context (ngx_http_wasm_rctx declines there): "
                                "no filter sees the final response (ours keeps the chain on it)",
    "path-is-uri": "`:path` is nginx's decoded, normalised $uri plus the query, not the request "
                   "target as received: the filters judge the path nginx resolved",
    "no-large-config": "no equivalent of tollgate_proxy_wasm_file: a plugin configuration is one "
                       "nginx argument, at most 4 KB",
    "local-response-body-lf": "a local response's body gets a LF appended, counted in its Content-Length "
                              "(ngx_http_wasm_local_response.c stashes body + LF)",
    "resume-from-root-context-crashes": "resume_http_request from on_tick segfaults the worker (signal 11): "
                                        "set_effective_context is a no-op and the root context has no request "
                                        "context to resume; the paused request's connection is closed unanswered",
    "hop-by-hop-request-fields": "the request map is nginx's fields as sent (names in the client's case), with "
                                 "Connection, Keep-Alive, Proxy-Connection and the fields Connection nominates; "
                                 "nginx's proxy module forwards the nominated ones and Proxy-Connection",
    "header-writes-escaped": "header writes with CR, LF, NUL in a value or a non-token name answer Ok and are "
                             "written percent-escaped (request, response, local response): no injection, no BadArgument",
    "framing-fields-written": "Transfer-Encoding, Keep-Alive, Proxy-Connection, Upgrade written into a response "
                              "reach the client as written, beside nginx's Content-Length (a body not chunked); "
                              "Connection is applied: close ends the keep-alive, upgrade makes the status 101",
    "shm-keys-by-crc32": "shared data finds a key by its CRC-32 alone (ngx_wa_shm_kv.c's rbtree "
                         "lookup compares no key bytes): two keys of one CRC-32 are one record, so a "
                         "client choosing its rate-limit key can spend another client's limit",
    "body-lost-after-a-reading-filter": "when a filter that reads the request body is followed by another "
                                        "filter in the chain, the upstream gets the request without its body, "
                                        "and the unread body is parsed as the connection's next request",
    "no-grpc-calls": "proxy_grpc_call traps (\"function not yet implemented\"): the filters' global mode (Envoy's "
                     "rate limit service) cannot run; rate-limit and cost probe it when they load, so a `global` "
                     "block fails the worker's start (fatal: no request is served), never a request",
    "shm-full-traps": "a write to a full shm_kv zone (eviction=none) traps the guest instead of "
                      "answering a status (ngx_proxy_wasm_host.c set_shared_data): that request "
                      "answers 500, the key-creation lease it held stays taken for its 2 s",
    "no-eviction-policy": "the module does not tell the filters whether a shm_kv zone evicts "
                          "(tollgate.shared_data.eviction.<key>), so rate-limit and cost load on an "
                          "evicting zone (lru, slru: the default) without a word: declare their zones "
                          "eviction=none",
    "dispatch-body-whole": "a dispatch response's body is buffered whole (one allocation of its "
                           "Content-Length) and its length reaches on_http_call_response as 32 "
                           "bits: an endless body fails the call yet reaches the filter as an "
                           "empty 200",
    "grpc-local-response-is-http": "a local response without a gRPC status (-1, the SDKs' "
                                   "send_http_response) to a gRPC request is the filter's HTTP response: "
                                   "the gRPC client sees its library's mapping of the HTTP status (200: "
                                   "UNKNOWN, 401: UNAUTHENTICATED) without the filter's message",
    "grpc-status-aborts-the-worker": "a local response with a gRPC status (the SDKs' send_grpc_response) "
                                     "aborts the worker (signal 6): ngx_proxy_wasm_host.c asserts "
                                     "grpc_status == -1 when NGX_DEBUG, which Debian's nginx (--with-debug) "
                                     "defines; the client's connection is closed, with every other request "
                                     "of that worker",
    "authority-is-server-name": "`:authority` is the server{}'s server_name (else the machine's host name) "
                                "and the local port (ngx_proxy_wasm_maps.c, "
                                "ngx_proxy_wasm_maps_get_authority): neither the Host header nor the "
                                "absolute-form target's authority nginx routes on",
}


def kong_differs(host, name: str) -> bool:
    """True on the kong host, where a suite expects KONG_DIFFERENCES[name] instead of what the
    other hosts do; KeyError for a name not in the list (so every expectation is documented)."""
    if name not in KONG_DIFFERENCES:
        raise KeyError(f"{name!r} is not in KONG_DIFFERENCES")
    return host.name == "kong"


class KongHost(NginxHost):
    """Debian's nginx (as NginxHost) with Kong's ngx_wasm_module instead of ours
    (scripts/build-kong-module.sh): the same filters on the other nginx host of proxy-wasm.
    nginx_config(kong=True) leaves out what only our module has; not in any default host list."""

    name = "kong"
    kong = True

    def __init__(self, workdir: pathlib.Path):
        super().__init__(workdir, module=KONG_MODULE)

    @staticmethod
    def unavailable() -> str | None:
        """Why the host cannot run here (bench/runner.py's host check), or None."""
        if not pathlib.Path(NGINX_BINARY).exists():
            return "nginx is not installed (scripts/build-kong-module.sh installs it)"
        if not KONG_MODULE.exists():
            return f"{KONG_MODULE} is missing: run scripts/build-kong-module.sh"
        return None


class KongGateway(NginxGateway):
    """Kong's module starts the filters (on_vm_start, on_configure) in each worker, after the
    master listens and `nginx -t` passes: a refused configuration only shows as workers exiting.
    So the gateway is up once a worker answers `/ready`, and refused when a worker exits first
    (RuntimeError with the log's tail, as our module's refusal at startup)."""

    WORKER_FAILED = ("exited with fatal code", "exited on signal", "[emerg]")

    def __init__(self, config: pathlib.Path, listen: int, admin: int, timeout: float, cpus: str | None = None,
                 binary: str | None = None):
        super().__init__(config, listen, admin, timeout, cpus, binary)
        deadline = time.monotonic() + timeout
        try:
            while True:
                text = self.log.read_text(errors="replace") if self.log.exists() else ""
                failed = [line for line in text.splitlines() if any(m in line for m in self.WORKER_FAILED)]
                if failed:
                    raise RuntimeError(f"Kong's module: worker failed: {failed[0]}\n{tail(self.log)}")
                try:
                    if requests.get(self.admin + "/ready", timeout=1).status_code == 200:
                        return
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no worker answered /ready after {timeout}s: {tail(self.log)}")
                time.sleep(0.1)
        except Exception:
            self.process.stop()
            raise

    def worker_log(self) -> list[int]:
        """The worker (pid) of each request proxied so far, in order: the access log that
        nginx_config writes for Kong's module (which has no per-worker counters) when the
        gateway's spec asks for it (`GatewaySpec.worker_log`)."""
        path = self.prefix / "workers.log"
        if not path.exists():
            return []
        return [int(line) for line in path.read_text().split()]

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Kong's module keeps filter metrics in its `metrics` shm zone but serves them only to
        Kong's Lua (resty.wasmx); stock nginx has no endpoint for them."""
        raise NotImplementedError("stats() on the kong host: Kong's ngx_wasm_module has no metrics endpoint "
                                  "(its metrics are read through Kong's Lua API only)")


HOSTS = {"envoy": EnvoyHost, "nginx": NginxHost, "nginx-musl": NginxMuslHost, "kong": KongHost}

# TOLLGATE_NGINX_LOG_LEVEL=debug: every nginx the tests start logs at that level (scripts/test.sh
# runs the nginx module's suites once more so: the debug log reads events' data, and once
# crashed workers on the module's timers).
NGINX_LOG_LEVEL = os.environ.get("TOLLGATE_NGINX_LOG_LEVEL", "")

# The nginx builds by host name: (binary, module).
NGINX_BUILDS = {"nginx": (pathlib.Path(NGINX_BINARY), NGINX_MODULE), "nginx-musl": (NGINX_MUSL_BINARY, NGINX_MUSL_MODULE)}


def selected_nginx_hosts() -> list[str]:
    """The nginx builds among the selected hosts (tests of the nginx module itself run on each)."""
    return [h for h in selected_hosts() if h in NGINX_BUILDS]


class RawNginx:
    """nginx with the module and a configuration written by the test: `wasm` is the body of the
    `wasm {}` block, `http` the body of the `server {}` block (`extra_http` goes in `http {}`),
    `host` picks the build (`nginx` or `nginx-musl`), `port` the server's port (default: a free
    one; given, so that a server in `extra_http` can listen on it too)."""

    def __init__(self, tmp: pathlib.Path, wasm: str, http: str, workers: int = 1, host: str = "nginx",
                 log_level: str = "info", extra_http: str = "", main: str = "", port: int | None = None):
        binary, module = NGINX_BUILDS[host]
        log_level = NGINX_LOG_LEVEL or log_level
        self.binary = binary
        self.port = port or free_port()
        self.prefix = tmp
        self.log = tmp / "error.log"
        self.conf = tmp / "nginx.conf"
        self.conf.write_text(f"""load_module {module};
worker_processes {workers};
master_process on;
daemon off;
pid {tmp}/nginx.pid;
error_log {self.log} {log_level};
{main}
events {{ worker_connections 256; }}
wasm {{
{wasm}
}}
http {{
    access_log off;
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f; uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
{extra_http}
    server {{
        listen 127.0.0.1:{self.port};
{http}
    }}
}}
""")
        self.process = Process([str(binary), "-p", str(tmp), "-c", str(self.conf), "-e", str(self.log)], tmp / "out.log")
        wait_for_port(self.port, self.process.proc, 30, self.log)

    def get(self, path: str, timeout: float = 10, **kw) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=timeout, **kw)

    def workers(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.process.proc.pid)], capture_output=True, text=True).stdout
        return sorted(int(p) for p in out.split())

    def signal(self, sig: str) -> subprocess.CompletedProcess:
        """`nginx -s SIG` against this instance."""
        return subprocess.run([str(self.binary), "-p", str(self.prefix), "-c", str(self.conf), "-e", str(self.log), "-s", sig],
                              capture_output=True, text=True, timeout=30)

    def test_config(self) -> subprocess.CompletedProcess:
        """`nginx -t` on this instance's configuration."""
        return subprocess.run([str(self.binary), "-t", "-p", str(self.prefix), "-c", str(self.conf), "-e", str(self.log)],
                              capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        self.process.stop()


def selected_hosts() -> list[str]:
    """Hosts to run the end-to-end suites against (TOLLGATE_HOSTS, comma-separated)."""
    return [h for h in os.environ.get("TOLLGATE_HOSTS", "envoy").split(",") if h]

