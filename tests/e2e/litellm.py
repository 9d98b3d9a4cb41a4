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
VERSION = "1.109.1"
MEMBER = "litellm/model_prices_and_context_window_backup.json"
SHA256 = "8f8060d8ce7a40c91b995c74d6a27657543d49e3c1c53430dabd556f244392c6"
ENTRIES = 4553
# Entries the cost filter prices per token (the others are skipped, counted by reason).
LOADED = 3676
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
