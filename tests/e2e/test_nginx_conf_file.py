"""nginx: plugin configurations of any size from a file (`tollgate_proxy_wasm_file NAME FILE;`,
`tollgate_module_file NAME PATH FILE;`, nginx-compat/module/src/conf_file.rs), on both nginx
builds. nginx's own parser refuses an inline argument over about 4 KB; a 3.2 MB cost
configuration (LiteLLM's whole price file) loads from a file whose relative path is resolved
against the prefix (`-p`), and a missing, unreadable or refused file fails `nginx -t` naming it
and the line of nginx.conf."""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

import litellm
from lab import NGINX_BUILDS, WASM_DIR, nginx_quote, selected_nginx_hosts

pytestmark = pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")

COST_WASM = WASM_DIR / "tollgate_cost.wasm"
# For the cases that fail before any filter runs: compiles in a fraction of cost's time.
FLOOR_WASM = WASM_DIR / "tollgate_wasm_floor.wasm"


@pytest.fixture(params=selected_nginx_hosts())
def nginx_build(request):
    return NGINX_BUILDS[request.param]


def nginx_t(build, tmp: pathlib.Path, location: str, wasm: str = "", filter_wasm: pathlib.Path = COST_WASM) -> subprocess.CompletedProcess:
    binary, module = build
    conf = tmp / "nginx.conf"
    conf.write_text(f"""load_module {module};
worker_processes 1;
pid {tmp}/nginx.pid;
events {{}}
wasm {{
    module cost {filter_wasm};
{wasm}
}}
http {{
    access_log off;
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f; uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
    server {{
        listen 127.0.0.1:1;
        location / {{
            {location}
            return 200;
        }}
    }}
}}
""")
    return subprocess.run([str(binary), "-t", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                          capture_output=True, text=True, timeout=120)


def cost_config() -> dict:
    return {"ledger": "file", "tenant": {"unverified_header": "x-tenant"},
            "prices": json.loads(litellm.price_file().read_bytes())}


def cost_config_text() -> str:
    """The cost configuration with LiteLLM's file in it byte for byte (3.2 MB)."""
    return '{"ledger": "file", "tenant": {"unverified_header": "x-tenant"},\n "prices": ' \
        + litellm.price_file().read_text() + "}"


def test_a_3mb_configuration_loads_from_a_file_relative_to_the_prefix(nginx_build, tmp_path):
    text = cost_config_text()
    assert len(text) > 3_000_000
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "cost.json").write_text(text)
    r = nginx_t(nginx_build, tmp_path, "tollgate_proxy_wasm_file cost conf/cost.json;")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test is successful" in r.stderr
    log = (tmp_path / "error.log").read_text()
    assert f"{litellm.LOADED} models loaded; {litellm.ENTRIES - litellm.LOADED} entries skipped" in log, log[-2000:]
    # The same configuration inline: nginx's parser refuses it before Tollgate sees it.
    r = nginx_t(nginx_build, tmp_path, f"proxy_wasm cost {nginx_quote(text)};")
    assert r.returncode != 0 and "too long parameter" in r.stderr, r.stderr[-2000:]


def test_missing_unreadable_or_refused_files_fail_naming_them(nginx_build, tmp_path):
    def fails(location: str, *needles: str, wasm: str = "", filter_wasm: pathlib.Path = FLOOR_WASM) -> None:
        r = nginx_t(nginx_build, tmp_path, location, wasm, filter_wasm)
        assert r.returncode != 0, r.stderr[-2000:]
        out = r.stderr + (tmp_path / "error.log").read_text()
        for n in needles:
            assert n in out, (n, out[-2000:])
        assert f"{tmp_path}/nginx.conf:" in out, "the directive's line"

    fails("tollgate_proxy_wasm_file cost missing.json;", f'"{tmp_path}/missing.json"', "No such file")
    (tmp_path / "dir.json").mkdir()
    fails("tollgate_proxy_wasm_file cost dir.json;", f'"{tmp_path}/dir.json"', "not a regular file")
    (tmp_path / "empty.json").write_text("")
    fails("tollgate_proxy_wasm_file cost empty.json;", "empty")
    # Invalid JSON: the filter's message (with line and column in the file) and the file.
    (tmp_path / "bad.json").write_text('{\n  "ledger": "x",\n  "prices": {"m": {"input_cost_per_token": -1e-6,\n')
    fails(f"tollgate_proxy_wasm_file cost {tmp_path}/bad.json;", 'refused its configuration (read from', "bad.json", "line",
          filter_wasm=COST_WASM)
    # Valid JSON, a refused value: named by its field.
    bad = cost_config()
    bad["prices"]["gpt-4o"]["output_cost_per_token"] = -1
    (tmp_path / "neg.json").write_text(json.dumps(bad))
    fails("tollgate_proxy_wasm_file cost neg.json;", "neg.json", "prices.gpt-4o.output_cost_per_token", filter_wasm=COST_WASM)
    fails("tollgate_proxy_wasm_file cost;", "invalid number of arguments")
    # The VM configuration of a module from a file: the same rules.
    fails("", f'"{tmp_path}/no-vm.json"', "No such file",
          wasm=f"    tollgate_module_file cost2 {FLOOR_WASM} no-vm.json;")
    (tmp_path / "vm.json").write_text("{}")
    ok = nginx_t(nginx_build, tmp_path, "", f"    tollgate_module_file cost2 {FLOOR_WASM} vm.json;", FLOOR_WASM)
    assert ok.returncode == 0, ok.stderr[-2000:]
