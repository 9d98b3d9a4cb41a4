"""The gateway lab: Tollgate's filters in real proxies on loopback, started and stopped by the
end-to-end tests (tests/e2e), the benchmarks (bench/) and fuzz/seeds.py.

A program describes the gateway it needs with a host-agnostic `GatewaySpec` (lab/spec.py:
filters in chain order with their plugin configurations, upstream clusters, workers, zones); a
`Host` (lab/host.py) renders it into its proxy's own configuration, starts the proxy and returns
a `Gateway` (`url`, `admin`, logs, `stats`, `stop`), so the same test runs against every host
with the same expectations. The hosts, by the names `TOLLGATE_HOSTS` selects (`HOSTS`):

- `envoy`: `EnvoyHost` (lab/envoy.py), Envoy's bootstrap with the filters on V8;
- `nginx`: `NginxHost` (lab/nginx.py), Debian's nginx with Tollgate's module;
- `nginx-musl`: `NginxMuslHost` (lab/nginx.py), nginx and the module built on musl;
- `kong`: `KongHost` (lab/kong.py), Debian's nginx with Kong's ngx_wasm_module, whose known
  differences are `KONG_DIFFERENCES`, asked with `kong_differs`.

Beside them: `RawNginx` (an nginx.conf a test writes itself, lab/nginx.py), `DemoUpstream` (the
demo upstream, lab/upstream.py), and ports, processes, waiting and logs (lab/process.py). Where
the build outputs are found: lab/paths.py (TOLLGATE_WASM_DIR and TOLLGATE_NGINX_MODULE point the
lab at other builds).

It is imported as `lab` with the repository root on sys.path: tests/e2e/conftest.py,
bench/runner.py and fuzz/seeds.py put it there.
"""
from __future__ import annotations

from .envoy import ENVOY_PATH_NORMALIZATION, EnvoyGateway, EnvoyHost, envoy_binary, envoy_config, wasm_filter
from .host import Gateway, Host, selected_hosts
from .kong import KONG_DIFFERENCES, KONG_MODULE, KongGateway, KongHost, kong_differs
from .nginx import (DEFAULT_KV_ZONES, NGINX_BINARY, NGINX_BUILDS, NGINX_INLINE_CONFIG_MAX, NGINX_LOG_LEVEL,
                    NGINX_MODULE, NGINX_MUSL_BINARY, NGINX_MUSL_MODULE, NginxGateway, NginxHost, NginxMuslHost,
                    RawNginx, nginx_config, nginx_quote, selected_nginx_hosts)
from .paths import ABI_FUZZ_WASM, PROBE_WASM, ROOT, TARGET, WASM_DIR
from .process import Process, free_port, tail, wait_for_port, wait_until
from .spec import EnvoyNativeFilter, FilterSpec, GatewaySpec
from .upstream import DemoUpstream

# The hosts by the names TOLLGATE_HOSTS (tests) and --hosts (bench) select.
HOSTS: dict[str, type[Host]] = {"envoy": EnvoyHost, "nginx": NginxHost, "nginx-musl": NginxMuslHost, "kong": KongHost}

__all__ = [
    "ABI_FUZZ_WASM", "DEFAULT_KV_ZONES", "ENVOY_PATH_NORMALIZATION", "HOSTS", "KONG_DIFFERENCES", "KONG_MODULE",
    "NGINX_BINARY", "NGINX_BUILDS", "NGINX_INLINE_CONFIG_MAX", "NGINX_LOG_LEVEL", "NGINX_MODULE",
    "NGINX_MUSL_BINARY", "NGINX_MUSL_MODULE", "PROBE_WASM", "ROOT", "TARGET", "WASM_DIR",
    "DemoUpstream", "EnvoyGateway", "EnvoyHost", "EnvoyNativeFilter", "FilterSpec", "Gateway", "GatewaySpec", "Host",
    "KongGateway", "KongHost", "NginxGateway", "NginxHost", "NginxMuslHost", "Process", "RawNginx",
    "envoy_binary", "envoy_config", "free_port", "kong_differs", "nginx_config", "nginx_quote", "selected_hosts",
    "selected_nginx_hosts", "tail", "wait_for_port", "wait_until", "wasm_filter",
]
