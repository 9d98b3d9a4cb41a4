"""LiteLLM's price file, as users get it: `model_prices_and_context_window_backup.json` from the
`litellm` wheel on PyPI at a pinned version, fetched once with pip into the project's cache
(.cache/litellm/<version>/) and checked against its pinned SHA-256. Idempotent: a cached file
with the right digest is used as is."""
from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = "1.110.2"
MEMBER = "litellm/model_prices_and_context_window_backup.json"
SHA256 = "8943af58bf9f979c6a4bef815687117ffa341e462a41faed9be17b5c33d3dcc2"
ENTRIES = 4878
# Entries the cost filter prices per token, 98 of them through `alias_of` (the others are
# skipped, counted by reason).
LOADED = 3985
ALIASES = 98
PATH = ROOT / ".cache" / "litellm" / VERSION / "model_prices_and_context_window_backup.json"


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def price_file() -> pathlib.Path:
    """The pinned price file's path, fetched from PyPI if it is not cached yet."""
    if PATH.exists() and _digest(PATH) == SHA256:
        return PATH
    PATH.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PATH.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"litellm=={VERSION}", "-d", tmp],
                       check=True, timeout=600)
        wheel = next(pathlib.Path(tmp).glob("litellm-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            data = z.read(MEMBER)
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise RuntimeError(f"litellm {VERSION}'s {MEMBER} does not have the pinned SHA-256 {SHA256}")
    part = PATH.with_suffix(".part")
    part.write_bytes(data)
    part.replace(PATH)
    return PATH


if __name__ == "__main__":
    print(price_file())
