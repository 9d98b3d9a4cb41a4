"""nginx as a lab host: a GatewaySpec rendered into nginx.conf (`nginx_config`: the chain as
`proxy_wasm` directives, upstreams as `upstream {}` blocks, an admin server), run by
`NginxHost` (Debian's nginx with Tollgate's module, nginx-compat/module) and `NginxMuslHost`
(nginx and the module built on musl); `RawNginx` runs an nginx.conf a test writes itself. Kong's
module on the same nginx is lab/kong.py."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

import requests

from .host import Gateway, Host, selected_hosts
from .paths import ROOT, TARGET
from .process import Process, free_port, wait_for_port
from .spec import EnvoyNativeFilter, GatewaySpec


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
                 h2_port: int | None = None, compiled_cache: pathlib.Path | None = None) -> str:
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
    `spec.http2_listener` asks for (RuntimeError without one).

    `compiled_cache`: a `tollgate_compiled_cache` directory (not with `kong`, which has no such
    directive)."""
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
    cache = [f"    tollgate_compiled_cache {compiled_cache};"] if compiled_cache and not kong else []
    modules_conf = "\n".join(cache + [f"    module {n} {p};" for n, p in modules.items()]
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
    return f"""# Rendered by lab/nginx.py ({"KongHost" if kong else "NginxHost"})
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


# TOLLGATE_NGINX_LOG_LEVEL=debug: every nginx the tests start logs at that level (scripts/test.sh
# runs the nginx module's suites once more so: the debug log reads events' data, and once
# crashed workers on the module's timers).
NGINX_LOG_LEVEL = os.environ.get("TOLLGATE_NGINX_LOG_LEVEL", "")

# TOLLGATE_E2E_COMPILED_CACHE=DIR: every gateway NginxHost renders keeps its modules' compiled
# code in DIR (`tollgate_compiled_cache`), so that the suites compile each distinct .wasm once
# instead of at every start (scripts/test.sh sets it for the main e2e runs; the debug run and
# RawNginx's own configurations compile as a production start without a cache does).
E2E_COMPILED_CACHE = pathlib.Path(os.environ["TOLLGATE_E2E_COMPILED_CACHE"]) if os.environ.get("TOLLGATE_E2E_COMPILED_CACHE") else None


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


class NginxHost(Host):
    """Stock Debian nginx with Tollgate's dynamic module (nginx-compat/module). Subclasses run
    another build (`BINARY`, `MODULE`, made by `BUILD`), render for another module (`config`) or
    start another kind of gateway (`gateway_class`); an instance may be given another binary and
    module (bench/instructions.py, bench/libc.py)."""

    name = "nginx"
    BINARY = pathlib.Path(NGINX_BINARY)
    MODULE = NGINX_MODULE
    BUILD = "scripts/build-nginx-module.sh"
    gateway_class: type[NginxGateway] = NginxGateway

    def __init__(self, workdir: pathlib.Path, nginx_binary: str | None = None, module: pathlib.Path | None = None):
        super().__init__(workdir)
        self.binary = nginx_binary or str(self.BINARY)
        self.module = module or self.MODULE

    @classmethod
    def unavailable(cls) -> str | None:
        for path in (cls.BINARY, cls.MODULE):
            if not path.exists():
                return f"{path} is missing: run {cls.BUILD}"
        return None

    def validate(self, config_path: pathlib.Path) -> subprocess.CompletedProcess:
        prefix = pathlib.Path(tempfile.mkdtemp(prefix="nginx-t-", dir=self.workdir))
        return subprocess.run(
            [self.binary, "-t", "-p", str(prefix), "-c", str(config_path), "-e", str(prefix / "error.log")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )

    def config(self, spec: GatewaySpec, prefix: pathlib.Path, listen: int, admin: int, error_log: pathlib.Path,
               log_level: str, h2_port: int | None) -> str:
        """The nginx.conf this host runs `spec` with."""
        return nginx_config(spec, prefix, listen, admin, error_log, log_level, self.module, h2_port=h2_port,
                            compiled_cache=E2E_COMPILED_CACHE)

    def render(self, spec: GatewaySpec, log_level: str = "info", h2_port: int | None = None) -> tuple[pathlib.Path, int, int]:
        listen, admin = free_port(), free_port()
        prefix = pathlib.Path(tempfile.mkdtemp(prefix="nginx-", dir=self.workdir))
        conf = prefix / "nginx.conf"
        conf.write_text(self.config(spec, prefix, listen, admin, prefix.with_suffix(".log"), log_level, h2_port))
        return conf, listen, admin

    def start(self, spec: GatewaySpec, timeout: float = 60, log_level: str = "info", cpus: str | None = None) -> NginxGateway:
        level = {"trace": "debug", "debug": "debug", "info": "info", "warning": "warn", "warn": "warn", "error": "error"}.get(log_level, "info")
        level = NGINX_LOG_LEVEL or level
        h2_port = free_port() if spec.http2_listener else None
        conf, listen, admin = self.render(spec, level, h2_port)
        g = self.gateway_class(conf, listen, admin, timeout, cpus, self.binary)
        if h2_port is not None:
            g.h2_address = f"127.0.0.1:{h2_port}"
        return g


NGINX_MUSL_BINARY = TARGET / "nginx-musl" / "install" / "sbin" / "nginx"
NGINX_MUSL_MODULE = TARGET / "nginx-musl" / "ngx_http_tollgate_wasm_module.so"


class NginxMuslHost(NginxHost):
    """nginx 1.22.1 built from Debian's source with musl-gcc, loading the module built for
    x86_64-unknown-linux-musl (scripts/build-nginx-musl.sh): the libc of the Alpine image."""

    name = "nginx-musl"
    BINARY = NGINX_MUSL_BINARY
    MODULE = NGINX_MUSL_MODULE
    BUILD = "scripts/build-nginx-musl.sh"


# The nginx builds of our module by host name: (binary, module).
NGINX_BUILDS = {h.name: (h.BINARY, h.MODULE) for h in (NginxHost, NginxMuslHost)}


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
