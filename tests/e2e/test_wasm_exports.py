"""The built filters export every proxy-wasm stream callback, and those they do not implement
are constant stubs.

scripts/build.sh runs tools/trim-callbacks on every module with the list in its crate's
[package.metadata.tollgate] http-callbacks: a callback not in the list stays exported (Kong's
ngx_wasm_module calls every one without checking it exists) but points at a function whose whole
body is the SDK's default answer (`i32.const 0`, Continue; `i32.const 1` for proxy_on_done;
nothing for proxy_on_log), which nginx-compat's host recognises and skips. A callback in the
crate's `root-callbacks` (`done`: metrics' root context flushes its counters at proxy_on_done)
stays the SDK's, and the module carries a custom section `tollgate.http_callbacks` listing the
callbacks its HTTP contexts implement, so that nginx-compat still skips it per request. These tests read the
modules the gateway loads with a parser of their own (not the tool's or the host's wasmparser),
so a build that skipped the step, stubbed the wrong names or broke a module fails here; that the
filters still behave is what every other e2e suite shows, on every host.
"""
from __future__ import annotations

import pathlib
import subprocess
import tomllib

import pytest

from lab import ROOT, WASM_DIR

STREAM_CALLBACKS = {"request_headers", "request_body", "request_trailers", "response_headers",
                    "response_body", "response_trailers", "log", "done"}
# What the SDK exports and Kong's module calls on every request without a NULL check
# (ngx_http_proxy_wasm.c, ngx_proxy_wasm_on_log): these must never go missing.
KONG_CALLS = {"request_headers", "request_body", "response_headers", "response_body", "log", "done"}
# What the SDK needs and no trimming may remove: the context's creation and deletion, the root
# context's start and configuration, the guest allocator and the memory.
ALWAYS = {"proxy_on_context_create", "proxy_on_delete", "proxy_on_vm_start", "proxy_on_configure",
          "proxy_on_memory_allocate", "memory"}
# A stub's body (WebAssembly core spec 5.5.13): no local declarations, then the answer and `end`.
STUB_BODY = {"log": b"\x00\x0b", "done": b"\x00\x41\x01\x0b"}
CONTINUE_BODY = b"\x00\x41\x00\x0b"
CRATES = sorted(p.parent for p in [*ROOT.glob("plugins/*/Cargo.toml"), ROOT / "bench/wasm-floor/Cargo.toml"]
                if "metadata" in tomllib.loads(p.read_text()).get("package", {}))


def uleb(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def limits(data: bytes, i: int) -> int:
    flags, i = data[i], i + 1
    _, i = uleb(data, i)
    if flags & 1:
        _, i = uleb(data, i)
    return i


def parse(path: pathlib.Path) -> tuple[dict[str, int], dict[int, bytes], dict[str, bytes]]:
    """A core module's function exports (name: function index), its defined functions' bodies
    (function index: body bytes) and its custom sections (name: data), from sections 0 (custom),
    2 (imports), 7 (exports) and 10 (code) of the WebAssembly core spec (5.5)."""
    data = path.read_bytes()
    assert data[:8] == b"\0asm\1\0\0\0", f"{path} is not a wasm module"
    i, names, bodies, custom, imported = 8, {}, {}, {}, 0
    while i < len(data):
        section, i = data[i], i + 1
        size, i = uleb(data, i)
        j = i
        if section == 0:
            n, j = uleb(data, j)
            custom[data[j:j + n].decode()] = data[j + n:i + size]
        elif section == 2:
            count, j = uleb(data, j)
            for _ in range(count):
                for _ in range(2):  # module and field names
                    n, j = uleb(data, j)
                    j += n
                kind, j = data[j], j + 1
                if kind == 0:
                    _, j = uleb(data, j)
                    imported += 1
                elif kind == 1:
                    j = limits(data, j + 1)
                elif kind == 2:
                    j = limits(data, j)
                elif kind == 3:
                    j += 2
                else:
                    raise AssertionError(f"{path}: import kind {kind}")
        elif section == 7:
            count, j = uleb(data, j)
            for _ in range(count):
                n, j = uleb(data, j)
                name = data[j:j + n].decode()
                j += n
                kind, j = data[j], j + 1
                index, j = uleb(data, j)
                names[name] = index if kind == 0 else -1
        elif section == 10:
            count, j = uleb(data, j)
            for k in range(count):
                n, j = uleb(data, j)
                bodies[imported + k] = data[j:j + n]
                j += n
        i += size
    return names, bodies, custom


def declared(crate: pathlib.Path) -> tuple[str, set[str], set[str]]:
    """The module's name, its `http-callbacks` and its `root-callbacks`."""
    package = tomllib.loads((crate / "Cargo.toml").read_text())["package"]
    meta = package["metadata"]["tollgate"]
    return package["name"].replace("-", "_"), set(meta["http-callbacks"]), set(meta.get("root-callbacks", []))


def test_every_filter_declares_its_callbacks():
    names = {declared(c)[0] for c in CRATES}
    filters = {p.parent.name.replace("-", "_") for p in ROOT.glob("plugins/*/Cargo.toml")
               if "cdylib" in p.read_text()}
    assert {f"tollgate_{f}" for f in filters} | {"tollgate_wasm_floor"} == names


@pytest.mark.parametrize("crate", CRATES, ids=lambda c: c.name)
def test_every_callback_is_exported_and_the_undeclared_ones_are_stubs(crate):
    name, keep, root = declared(crate)
    assert keep <= STREAM_CALLBACKS, keep - STREAM_CALLBACKS
    assert root <= {"done"}, root
    exports, bodies, custom = parse(WASM_DIR / f"{name}.wasm")
    assert ALWAYS <= exports.keys(), ALWAYS - exports.keys()
    # The filters allocate with Rust's dlmalloc (plugins/common/src/lib.rs), a heap apart from
    # wasi-libc's `malloc`. Kong's ngx_wasm_module prefers a `malloc` export to
    # `proxy_on_memory_allocate` for the values it returns (ngx_proxy_wasm.c), which the SDK frees
    # with Rust's allocator: memory from the one heap freed into the other would corrupt both.
    assert not {"malloc", "free", "realloc", "calloc"} & exports.keys()
    for callback in sorted(KONG_CALLS):
        assert f"proxy_on_{callback}" in exports, f"{name} does not export proxy_on_{callback}"
    stubs = {c for c in STREAM_CALLBACKS if f"proxy_on_{c}" in exports
             and bodies.get(exports[f"proxy_on_{c}"]) == STUB_BODY.get(c, CONTINUE_BODY)}
    assert stubs == {c for c in STREAM_CALLBACKS if f"proxy_on_{c}" in exports} - keep - root
    # Kept for the root context only: the section names what the HTTP contexts implement.
    section = custom.get("tollgate.http_callbacks")
    if root - keep:
        assert section is not None and set(section.decode().split(", ")) == keep, section
    else:
        assert section is None, section


def test_the_sdks_callbacks_are_not_stubs():
    """The parser tells a stub from real code: cargo's untrimmed module has none."""
    untrimmed = WASM_DIR / "tollgate_wasm_floor_all_callbacks.wasm"
    exports, bodies, _ = parse(untrimmed)
    assert not [c for c in STREAM_CALLBACKS if f"proxy_on_{c}" in exports
                and bodies.get(exports[f"proxy_on_{c}"]) == STUB_BODY.get(c, CONTINUE_BODY)]


def test_a_build_with_nothing_to_compile_leaves_the_modules_alone():
    """scripts/build.sh runs while gateways load the modules (the demo runs it during the suites):
    a build that changes nothing must not replace a module, even for a moment. cargo re-links its
    artifacts into its output directory on every build, so the modules' directory is not it."""
    if WASM_DIR != ROOT / "target" / "wasm32-wasip1" / "release":
        pytest.skip("TOLLGATE_WASM_DIR points at other builds")
    modules = sorted(WASM_DIR.glob("*.wasm"))
    assert {f"{declared(c)[0]}.wasm" for c in CRATES} <= {m.name for m in modules}
    before = {m.name: (m.stat().st_ino, m.stat().st_mtime_ns) for m in modules}
    r = subprocess.run([str(ROOT / "scripts" / "build.sh")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {m.name: (m.stat().st_ino, m.stat().st_mtime_ns) for m in sorted(WASM_DIR.glob("*.wasm"))} == before
