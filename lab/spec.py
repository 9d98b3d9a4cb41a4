"""What a gateway is made of, independent of the host: `GatewaySpec` (the filter chain, upstream
clusters, workers, zones and the listener's options), `FilterSpec` (one proxy-wasm filter and its
plugin configuration) and `EnvoyNativeFilter` (one of Envoy's own filters, a benchmark baseline).
Each host renders a spec into its own configuration (lab/envoy.py, lab/nginx.py)."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from . import paths


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
        return self.wasm_file or paths.WASM_DIR / f"tollgate_{self.plugin.replace('-', '_')}.wasm"


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
