"""Whether a shared-data zone evicts, as a filter can ask the nginx host (both nginx builds).

The property `tollgate.shared_data.eviction.<KEY>` answers `none`, `lru` or `slru`: the
`eviction=` of the `shm_kv` zone `proxy_set_shared_data(KEY)` uses (a key `NAME/...` goes to the
zone `NAME`, any other key to `*`; without a declared `*`, the module's own 4 MiB LRU zone).
Filters that keep limits or budgets in shared data (rate-limit, cost) read it in `on_configure`
and refuse a zone that evicts: this host runs `on_configure` in the master at configuration time,
so `nginx -t` fails then. The probe filter reads it for its `eviction_keys` in `on_configure`
(in the master, and again in each worker: the `configure` answers it reports) and in each HTTP
context (`request`); with `require_no_eviction` its `on_configure` refuses anything but `none`.

Before, the host had no such property: every read was NotFound (the probe's `null`), so a filter
could not tell a zone that evicts from one that does not. Envoy's shared data never evicts and it
answers NotFound, as Kong's module does in HTTP contexts (in root contexts Kong refuses every
dotted property with InternalFailure: `ngx_proxy_wasm_properties_get`).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from lab import NGINX_BUILDS, PROBE_WASM, RawNginx, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

KEYS = ["limits/rl/tenant-1", "cache/jwks", "plain/x", "other/y", "no-prefix"]
ZONES = """    shm_kv limits 64k eviction=none;
    shm_kv cache 64k eviction=slru;
    shm_kv plain 64k;"""


def probe_location(config: dict) -> str:
    return f"        location / {{ proxy_wasm probe {nginx_quote(json.dumps(config))}; return 500; }}"


@pytest.fixture(params=selected_nginx_hosts())
def nginx(request, tmp_path):
    started = []

    def start(zones: str, config: dict) -> RawNginx:
        n = RawNginx(tmp_path, f"    module probe {PROBE_WASM};\n{zones}", probe_location(config), workers=2,
                     host=request.param)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


def test_each_key_gets_the_eviction_of_its_zone(nginx):
    n = nginx(ZONES, {"request_headers": "eviction", "eviction_keys": KEYS})
    want = {
        "limits/rl/tenant-1": "none",  # eviction=none
        "cache/jwks": "slru",          # as declared (it evicts as lru here)
        "plain/x": "lru",              # no eviction=: lru
        "other/y": "lru",              # no zone "other": the implicit `*` zone (4 MiB, LRU)
        "no-prefix": "lru",            # the implicit `*` zone
    }
    for _ in range(4):  # both workers, most likely
        r = n.get("/")
        assert r.status_code == 200, r.text
        assert r.json() == {"configure": want, "request": want}


def test_a_declared_star_zone_is_the_one_of_unprefixed_keys(nginx):
    n = nginx("    shm_kv * 64k eviction=none;\n    shm_kv cache 64k eviction=lru;",
              {"request_headers": "eviction", "eviction_keys": ["cache/x", "other/y", "no-prefix"]})
    want = {"cache/x": "lru", "other/y": "none", "no-prefix": "none"}
    r = n.get("/")
    assert r.status_code == 200, r.text
    assert r.json() == {"configure": want, "request": want}


def nginx_t(tmp_path, host: str, zones: str, config: dict) -> subprocess.CompletedProcess:
    """`nginx -t` on a configuration with the probe as the only filter."""
    binary, module = NGINX_BUILDS[host]
    conf = tmp_path / "t.conf"
    conf.write_text(f"""load_module {module};
worker_processes 1;
pid {tmp_path}/t.pid;
error_log {tmp_path}/t.log info;
events {{ worker_connections 64; }}
wasm {{
    module probe {PROBE_WASM};
{zones}
}}
http {{
    access_log off;
    client_body_temp_path {tmp_path}/cb; proxy_temp_path {tmp_path}/p; fastcgi_temp_path {tmp_path}/f;
    uwsgi_temp_path {tmp_path}/u; scgi_temp_path {tmp_path}/s;
    server {{
        listen 127.0.0.1:1;
{probe_location(config)}
    }}
}}
""")
    return subprocess.run([str(binary), "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "t.log")],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("key, evicts", [("limits/rl/x", False), ("plain/x", True), ("cache/x", True),
                                         ("other/x", True)])
def test_nginx_t_fails_for_a_filter_that_refuses_a_zone_that_evicts(tmp_path, key, evicts):
    """The property answers in the master at configuration time (`nginx -t`), where the zones
    are only declared: a filter refusing an evicting zone fails `nginx -t`, one on an
    `eviction=none` zone passes."""
    for host in selected_nginx_hosts():
        out = nginx_t(tmp_path, host, ZONES, {"eviction_keys": [key], "require_no_eviction": True})
        said = out.stderr + ((tmp_path / "t.log").read_text() if (tmp_path / "t.log").exists() else "")
        if evicts:
            assert out.returncode != 0, said
            assert f'shared-data key "{key}" is in a zone whose eviction is' in said, said
        else:
            assert out.returncode == 0, said
