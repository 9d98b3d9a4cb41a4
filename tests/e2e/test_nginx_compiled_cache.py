"""nginx: compiled code kept across starts and reloads (`tollgate_compiled_cache DIR;`, and Kong's
`wasmtime { cache_config FILE; }`), and never loaded when it cannot be trusted."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import time

import pytest

from lab import NGINX_BINARY, NGINX_MODULE, ROOT, WASM_DIR, RawNginx, nginx_quote, selected_nginx_hosts

GOOD_JWT = {"providers": {"p": {"issuer": "i", "hmac_secrets": [{"alg": "HS256", "secret": "0123456789abcdef0123456789abcdef"}]}}}
MODULES = {"jwt_auth": "tollgate_jwt_auth.wasm", "floor": "tollgate_wasm_floor.wasm"}


def modules() -> str:
    return "\n".join(f"module {name} {WASM_DIR / f};" for name, f in MODULES.items())


def nginx_t(tmp: pathlib.Path, wasm: str) -> subprocess.CompletedProcess:
    """`nginx -t` of a configuration with `wasm` as its `wasm {}` block; `stderr` holds the log."""
    conf = tmp / "nginx.conf"
    conf.write_text(f"""load_module {NGINX_MODULE};
pid {tmp}/nginx.pid;
events {{}}
wasm {{
{wasm}
}}
http {{ server {{ listen 127.0.0.1:1; location / {{ return 200; }} }} }}
""")
    log = tmp / "error.log"
    log.unlink(missing_ok=True)
    r = subprocess.run([NGINX_BINARY, "-t", "-p", str(tmp), "-c", str(conf), "-e", str(log)],
                       capture_output=True, text=True, timeout=120)
    # The configuration's log lines go to the -e file; its stderr adds the verdict.
    r.stderr = (log.read_text() if log.exists() else "") + r.stderr
    return r


def notes(stderr: str) -> dict[str, str]:
    """Per module, what the cache did: `stored`, `reused` or `warn: <line>`."""
    out = {}
    for line in stderr.splitlines():
        m = re.search(r'\[(notice|warn)\].*tollgate: module "([^"]+)": (.*)', line)
        if not m:
            continue
        level, name, text = m.groups()
        text = re.sub(r" in \S+:\d+$", "", text)  # ngx_conf_log_error's file and line
        if level == "warn":
            out[name] = "warn: " + text
        elif text.startswith("compiled code reused"):
            out[name] = "reused"
        elif text.endswith("; stored"):
            out[name] = "stored"
        else:
            out[name] = text
    return out


@pytest.fixture(autouse=True)
def built():
    if not NGINX_MODULE.exists() or not (WASM_DIR / MODULES["jwt_auth"]).exists():
        pytest.fail("run scripts/build.sh and scripts/build-nginx-module.sh")


def test_modules_are_compiled_once_then_loaded(tmp_path):
    cache = tmp_path / "cache"
    wasm = f"tollgate_compiled_cache {cache};\n{modules()}"
    first = nginx_t(tmp_path, wasm)
    assert first.returncode == 0, first.stderr[-2000:]
    assert notes(first.stderr) == {"jwt_auth": "stored", "floor": "stored"}, first.stderr[-2000:]
    entries = sorted(cache.iterdir())
    assert len(entries) == 2
    assert {oct(e.stat().st_mode & 0o777) for e in entries} == {"0o600"}
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    again = nginx_t(tmp_path, wasm)
    assert again.returncode == 0, again.stderr[-2000:]
    assert notes(again.stderr) == {"jwt_auth": "reused", "floor": "reused"}, again.stderr[-2000:]
    assert sorted(cache.iterdir()) == entries


def test_without_the_directive_nothing_is_kept(tmp_path):
    r = nginx_t(tmp_path, f"tollgate_compiled_cache off;\n{modules()}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert notes(r.stderr) == {}


def test_a_changed_entry_is_compiled_again_and_logged(tmp_path):
    cache = tmp_path / "cache"
    wasm = f"tollgate_compiled_cache {cache};\n{modules()}"
    assert nginx_t(tmp_path, wasm).returncode == 0
    jwt_entry = next(e for e in cache.iterdir() if e.stat().st_size == max(x.stat().st_size for x in cache.iterdir()))
    good = jwt_entry.read_bytes()
    for bad, why in [(good[:-1] + bytes([good[-1] ^ 1]), "checksum mismatch"), (good[:100], "checksum mismatch"),
                     (b"", "too short")]:
        jwt_entry.write_bytes(bad)
        r = nginx_t(tmp_path, wasm)
        assert r.returncode == 0, r.stderr[-2000:]
        n = notes(r.stderr)
        assert n["floor"] == "reused"
        assert n["jwt_auth"].startswith("warn: ") and why in n["jwt_auth"] and n["jwt_auth"].endswith("stored"), n
        assert jwt_entry.read_bytes() == good
    assert notes(nginx_t(tmp_path, wasm).stderr)["jwt_auth"] == "reused"


def test_a_directory_others_can_write_is_neither_read_nor_written(tmp_path):
    cache = tmp_path / "cache"
    wasm = f"tollgate_compiled_cache {cache};\n{modules()}"
    assert nginx_t(tmp_path, wasm).returncode == 0
    os.chmod(cache, 0o777)
    stamps = {e: e.stat().st_mtime_ns for e in cache.iterdir()}
    r = nginx_t(tmp_path, wasm)
    assert r.returncode == 0, r.stderr[-2000:]
    for name, note in notes(r.stderr).items():
        assert note.startswith("warn: ") and "writable by its group or others" in note and "not written" in note, (name, note)
    assert {e: e.stat().st_mtime_ns for e in cache.iterdir()} == stamps
    os.chmod(cache, 0o700)
    entry = next(cache.iterdir())
    os.chmod(entry, 0o644 | 0o020)
    r = nginx_t(tmp_path, wasm)
    assert sum(n.startswith("warn: ") for n in notes(r.stderr).values()) == 1, r.stderr[-2000:]


def test_the_directive_is_refused_twice_and_empty(tmp_path):
    r = nginx_t(tmp_path, f"tollgate_compiled_cache {tmp_path}/a; tollgate_compiled_cache {tmp_path}/b;")
    assert r.returncode != 0 and '"tollgate_compiled_cache" directive is duplicate' in r.stderr
    r = nginx_t(tmp_path, "tollgate_compiled_cache '';")
    assert r.returncode != 0 and "tollgate_compiled_cache: invalid directory" in r.stderr


def test_kongs_cache_config_names_the_directory(tmp_path):
    cache = tmp_path / "kong-cache"
    toml = tmp_path / "wasmtime.toml"
    toml.write_text(f'[cache]\nenabled = true\ndirectory = "{cache}"\n')
    wasm = f"wasmtime {{ cache_config {toml}; }}\n{modules()}"
    r = nginx_t(tmp_path, wasm)
    assert r.returncode == 0, r.stderr[-2000:]
    assert notes(r.stderr) == {"jwt_auth": "stored", "floor": "stored"}
    assert notes(nginx_t(tmp_path, wasm).stderr) == {"jwt_auth": "reused", "floor": "reused"}
    # tollgate_compiled_cache wins, even off.
    r = nginx_t(tmp_path, f"tollgate_compiled_cache off;\n{wasm}")
    assert r.returncode == 0 and notes(r.stderr) == {}
    toml.write_text(f'[cache]\nenabled = false\ndirectory = "{cache}"\n')
    assert notes(nginx_t(tmp_path, wasm).stderr) == {}
    toml.write_text("[cache]\nenabled = true\n")
    r = nginx_t(tmp_path, wasm)
    assert r.returncode == 0 and "names no [cache] directory" in r.stderr, r.stderr[-2000:]
    toml.write_text('[cache]\ndirectory = "relative"\n')
    r = nginx_t(tmp_path, wasm)
    assert r.returncode != 0 and "cache.directory is not an absolute path" in r.stderr, r.stderr[-2000:]
    r = nginx_t(tmp_path, f"wasmtime {{ cache_config {tmp_path}/missing.toml; }}")
    assert r.returncode != 0 and "cache_config" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("host", selected_nginx_hosts() or ["nginx"])
def test_a_start_and_a_reload_serve_with_the_loaded_code(tmp_path, host):
    """The filters run from loaded compiled code: jwt-auth refuses a request without a token,
    after a start and after a reload that loaded it."""
    cache = tmp_path / "cache"
    wasm = f"tollgate_compiled_cache {cache};\n{modules()}"
    http = f"location / {{ proxy_wasm jwt_auth {nginx_quote(json.dumps(GOOD_JWT))}; proxy_wasm floor; return 200; }}"
    (tmp_path / "a").mkdir()
    first = RawNginx(tmp_path / "a", wasm, http, workers=2, host=host)
    try:
        assert first.get("/").status_code == 401
    finally:
        first.stop()
    (tmp_path / "b").mkdir()
    n = RawNginx(tmp_path / "b", wasm, http, workers=2, host=host)
    try:
        assert n.get("/").status_code == 401
        master = n.process.proc.pid
        reused = lambda: len(re.findall(rf"\] {master}#\d+: tollgate: module \"\w+\": compiled code reused", n.log.read_text()))
        assert reused() == 2, n.log.read_text()[-3000:]
        workers = n.workers()
        assert n.signal("reload").returncode == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (set(n.workers()) & set(workers) or len(n.workers()) != 2):
            time.sleep(0.1)
        assert not set(n.workers()) & set(workers)
        assert n.get("/").status_code == 401
        assert reused() == 4  # the master's (`nginx -s reload` parses the configuration too)
    finally:
        n.stop()
