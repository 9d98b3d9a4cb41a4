"""`nginx -t` on every example configuration in nginx-compat/conf/ (the Tollgate module loads,
every filter compiles and accepts its configuration), and unsupported ngx_wasm_module
directives fail with a clear message."""
from __future__ import annotations

import pathlib
import subprocess

import pytest

from harness import NGINX_BINARY, NGINX_MODULE, ROOT, WASM_DIR

CONFS = sorted((ROOT / "nginx-compat" / "conf").glob("*.conf"))


def nginx_t(text: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    """Renders repository-relative paths (`target/...`) absolute (the run-time files under
    `target/nginx/run/` into `tmp`) and runs `nginx -t` with `tmp` as prefix and error log
    (unprivileged)."""
    conf = tmp / "nginx.conf"
    text = text.replace(" target/nginx/run/", f" {tmp}/")  # pid, logs, temporary files
    conf.write_text(text.replace(" target/", f" {ROOT}/target/"))
    return subprocess.run([NGINX_BINARY, "-t", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def built():
    if not NGINX_MODULE.exists():
        pytest.fail(f"{NGINX_MODULE} missing: run scripts/build-nginx-module.sh")
    if not list(WASM_DIR.glob("tollgate_*.wasm")):
        pytest.fail("filters not built: run scripts/build.sh")


def test_there_are_example_configurations():
    assert CONFS


@pytest.mark.parametrize("conf", CONFS, ids=[c.name for c in CONFS])
def test_example_configuration_passes_nginx_t(conf, tmp_path):
    r = nginx_t(conf.read_text(), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test is successful" in r.stderr


MINIMAL = """load_module target/nginx/ngx_http_tollgate_wasm_module.so;
events {}
wasm {
    module jwt_auth target/wasm32-wasip1/release/tollgate_jwt_auth.wasm;
    %(wasm)s
}
http {
    server {
        listen 127.0.0.1:1;
        location / {
            %(location)s
            return 200;
        }
    }
}
"""

GOOD_JWT = '{"providers": {"p": {"issuer": "i", "hmac_secrets": [{"alg": "HS256", "secret": "0123456789abcdef0123456789abcdef"}]}}}'


@pytest.mark.parametrize("wasm,location,directive", [
    ("resolver 1.1.1.1;", "", "resolver"),
    ("socket_connect_timeout 1s;", "", "socket_connect_timeout"),
    ("tls_verify_cert on;", "", "tls_verify_cert"),
    ("metrics_slab_size 1m;", "", "metrics_slab_size"),
    ("wasmtime { flag static_memory_maximum_size 1m; }", "", "wasmtime"),
    ("v8 { flag x y; }", "", "v8"),
    ("", "wasm_call rewrite jwt_auth f;", "wasm_call"),
    ("", "wasm_socket_read_timeout 1s;", "wasm_socket_read_timeout"),
    ("", "proxy_wasm_lua_resolver on;", "proxy_wasm_lua_resolver"),
    ("", "resolver_add 127.0.0.1 localhost;", "resolver_add"),
    ("", "wasm_postpone_rewrite on;", "wasm_postpone_rewrite"),
])
def test_unsupported_ngx_wasm_module_directives_fail_clearly(tmp_path, wasm, location, directive):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": location}, tmp_path)
    assert r.returncode != 0
    assert f'tollgate: directive "{directive}" of ngx_wasm_module is not supported' in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("wasm", ["compiler auto;", "compiler cranelift;", "backtraces on;", "backtraces off;"])
def test_kongs_tuning_directives_that_this_host_honours_pass(tmp_path, wasm):
    """ngx_wasm_module's `compiler` and `backtraces` (docs/DIRECTIVES.md): Cranelift is what this
    host compiles with, and every trap is logged either way."""
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("wasm,message", [
    ("compiler singlepass;", 'tollgate: compiler "singlepass" is not available'),
    ("compiler llvm;", 'tollgate: compiler "llvm" is not available'),
    ("backtraces yes;", 'tollgate: invalid value "yes" in "backtraces"'),
    ("backtraces;", "invalid number of arguments"),
])
def test_kongs_tuning_directives_refuse_what_this_host_cannot_do(tmp_path, wasm, message):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_supported_directives_pass(tmp_path):
    location = f"proxy_wasm_isolation stream; proxy_wasm_request_headers_in_access on; proxy_wasm jwt_auth '{GOOD_JWT}';"
    r = nginx_t(MINIMAL % {"wasm": "shm_kv * 1m; shm_kv tenants 64k eviction=lru; shm_queue jobs 64k;",
                           "location": location}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("wasm,message", [
    ("shm_queue jobs 64k; shm_queue jobs 64k;", 'shm_queue "jobs" already defined'),
    ("shm_queue jobs 1k;", 'shm_queue "jobs" is too small'),
    ("shm_queue jobs lots;", 'invalid shm_queue size "lots"'),
    ("shm_queue a/b 64k;", 'invalid shm_queue name "a/b"'),
    ("shm_queue jobs;", "invalid number of arguments"),
])
def test_bad_shm_queue_directives_fail(tmp_path, wasm, message):
    r = nginx_t(MINIMAL % {"wasm": wasm, "location": ""}, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_a_bad_filter_configuration_fails_nginx_t_with_the_filters_message(tmp_path):
    bad = '{"providers": {"main": {"issuer": "i", "hmac_secrets": [{"alg": "HS256", "secret": "short"}]}}}'
    r = nginx_t(MINIMAL % {"wasm": "", "location": f"proxy_wasm jwt_auth '{bad}';"}, tmp_path)
    assert r.returncode != 0
    assert "providers.main.hmac_secrets[0].secret" in r.stderr, r.stderr[-2000:]


def test_an_unknown_module_and_a_missing_file_fail(tmp_path):
    r = nginx_t(MINIMAL % {"wasm": "", "location": "proxy_wasm nope;"}, tmp_path)
    assert r.returncode != 0 and 'unknown module "nope"' in r.stderr
    r = nginx_t(MINIMAL % {"wasm": "module other /nonexistent.wasm;", "location": ""}, tmp_path)
    assert r.returncode != 0 and 'module "other"' in r.stderr
