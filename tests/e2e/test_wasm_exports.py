"""The built filters export only the proxy-wasm stream callbacks they implement.

scripts/build.sh runs tools/trim-callbacks on every module with the list in its crate's
[package.metadata.tollgate] http-callbacks. These tests read the exports of the modules the
gateway loads with a parser of their own (not the tool's wasmparser), so a build that skipped the
step, trimmed the wrong names or broke a module fails here; that the trimmed filters still behave
is what every other e2e suite shows, on Envoy and on nginx.
"""
from __future__ import annotations

import pathlib
import re
import tomllib

import pytest

from harness import ROOT, WASM_DIR

STREAM_CALLBACKS = {"request_headers", "request_body", "request_trailers", "response_headers",
                    "response_body", "response_trailers", "log", "done"}
# What the SDK needs and no trimming may remove: the context's creation and deletion, the root
# context's start and configuration, the guest allocator and the memory.
ALWAYS = {"proxy_on_context_create", "proxy_on_delete", "proxy_on_vm_start", "proxy_on_configure",
          "proxy_on_memory_allocate", "memory"}
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


def exports(path: pathlib.Path) -> set[str]:
    """The export names of a core module (WebAssembly core spec, section 5.5.10: section id 7)."""
    data = path.read_bytes()
    assert data[:8] == b"\0asm\1\0\0\0", f"{path} is not a wasm module"
    i, names = 8, set()
    while i < len(data):
        section, i = data[i], i + 1
        size, i = uleb(data, i)
        if section == 7:
            j = i
            count, j = uleb(data, j)
            for _ in range(count):
                n, j = uleb(data, j)
                names.add(data[j:j + n].decode())
                j += n + 1          # the name, then the export kind byte
                _, j = uleb(data, j)  # and its index
        i += size
    return names


def declared(crate: pathlib.Path) -> tuple[str, set[str]]:
    package = tomllib.loads((crate / "Cargo.toml").read_text())["package"]
    return package["name"].replace("-", "_"), set(package["metadata"]["tollgate"]["http-callbacks"])


def test_every_filter_declares_its_callbacks():
    names = {declared(c)[0] for c in CRATES}
    filters = {p.parent.name.replace("-", "_") for p in ROOT.glob("plugins/*/Cargo.toml")
               if "cdylib" in p.read_text()}
    assert {f"tollgate_{f}" for f in filters} | {"tollgate_wasm_floor"} == names


@pytest.mark.parametrize("crate", CRATES, ids=lambda c: c.name)
def test_module_exports_exactly_the_declared_stream_callbacks(crate):
    name, keep = declared(crate)
    assert keep <= STREAM_CALLBACKS, keep - STREAM_CALLBACKS
    got = exports(WASM_DIR / f"{name}.wasm")
    assert {c for c in STREAM_CALLBACKS if f"proxy_on_{c}" in got} == keep
    assert ALWAYS <= got, ALWAYS - got


@pytest.mark.parametrize("crate", CRATES, ids=lambda c: c.name)
def test_declared_callbacks_are_the_ones_the_filter_overrides(crate):
    """A callback the filter implements but does not declare would be trimmed and never called;
    one declared but not implemented costs a call into the VM for the SDK's default. The SDK's
    HttpContext methods are `on_http_<name>` (`on_log`, `on_done`) for proxy_on_<name>."""
    source = "\n".join(f.read_text() for f in sorted((crate / "src").rglob("*.rs")))
    implemented = {m.group(1) or m.group(2)
                   for m in re.finditer(r"\bfn on_(?:http_((?:request|response)_(?:headers|body|trailers))|(log|done))\s*\(", source)}
    if crate.name == "wasm-floor":
        # The floor overrides nothing and keeps proxy_on_request_headers on purpose: the least a
        # filter that looks at requests is called for.
        assert (implemented, declared(crate)[1]) == (set(), {"request_headers"})
    else:
        assert implemented == declared(crate)[1]


def test_untrimmed_floor_exports_every_stream_callback():
    """The benchmarks' `wasm-floor-all-callbacks` is the SDK's module as cargo built it."""
    got = exports(WASM_DIR / "tollgate_wasm_floor_all_callbacks.wasm")
    assert {f"proxy_on_{c}" for c in STREAM_CALLBACKS} <= got
    assert len(got) > len(exports(WASM_DIR / "tollgate_wasm_floor.wasm"))

