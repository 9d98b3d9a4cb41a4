"""Kong's ngx_wasm_module as a lab host: Debian's nginx (as NginxHost) with Kong's module instead
of ours, the configuration rendered for it (`nginx_config(kong=True)`), and what it does
differently (`KONG_DIFFERENCES`, which the suites expect on this host through `kong_differs`)."""
from __future__ import annotations

import pathlib
import time

import requests

from .nginx import NginxGateway, NginxHost, nginx_config
from .paths import TARGET
from .process import tail
from .spec import GatewaySpec


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
    return isinstance(host, KongHost)


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


class KongHost(NginxHost):
    """Debian's nginx (as NginxHost) with Kong's ngx_wasm_module instead of ours
    (scripts/build-kong-module.sh): the same filters on the other nginx host of proxy-wasm.
    nginx_config(kong=True) leaves out what only our module has; not in any default host list."""

    name = "kong"
    MODULE = KONG_MODULE
    BUILD = "scripts/build-kong-module.sh"
    gateway_class = KongGateway

    def config(self, spec: GatewaySpec, prefix: pathlib.Path, listen: int, admin: int, error_log: pathlib.Path,
               log_level: str, h2_port: int | None) -> str:
        return nginx_config(spec, prefix, listen, admin, error_log, log_level, self.module, kong=True, h2_port=h2_port)
