"""The images' Dockerfiles, checked without a Docker engine (none runs on these machines).

scripts/lint-docker.sh runs hadolint on every Dockerfile (every rule at every severity fails, the
images' label schema), requires a justification comment above each inline ignore, and
shellchecks the scripts the images run. These tests run it on the repository (clean) and on
deliberately bad snippets (flagged), so a lint that stopped finding anything would fail here too;
and they check what hadolint does not: each image's final stage runs as a non-root user, has a
HEALTHCHECK, EXPOSEs its ports and declares its labels.
"""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINT = ROOT / "scripts" / "lint-docker.sh"
IMAGES = ["envoy", "nginx-debian", "nginx-alpine"]
# Stand-ins for the official base images where no registry is reachable (scripts/images.sh).
BASES = ["bases/rust", "bases/envoy"]


def lint(*files: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LINT), *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_every_dockerfile_lints_clean():
    r = lint()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for name in IMAGES + BASES:
        assert f"docker/{name}.Dockerfile" in out, out  # each image was linted
    assert f"clean: {len(IMAGES + BASES)} Dockerfile(s)" in out, out


BAD = """\
FROM debian:latest
RUN apt-get update && apt-get install -y curl
RUN cd /tmp && curl -s https://example.invalid/install.sh | sh
USER root
"""


def test_a_bad_dockerfile_is_flagged(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text(BAD)
    r = lint(bad)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    for rule in ["DL3007",  # FROM :latest
                 "DL3008",  # unpinned apt packages
                 "DL3009",  # apt lists left in the layer
                 "DL3015",  # no --no-install-recommends
                 "DL3003",  # cd instead of WORKDIR
                 "DL4006",  # a pipe without pipefail
                 "DL3002",  # the last USER is root
                 "DL3049"]:  # the images' labels missing
        assert rule in out, f"{rule} not reported:\n{out}"


def test_an_ignore_needs_a_justification(tmp_path):
    body = ('FROM debian:trixie-slim\n'
            'LABEL org.opencontainers.image.title="t" org.opencontainers.image.description="d" '
            'org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.base.name="debian:trixie-slim" '
            'tollgate.ports="none" tollgate.mounts="none"\n'
            '{comment}# hadolint ignore=DL3008\n'
            'RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*\n'
            'USER 10001\n')
    bare = tmp_path / "bare.Dockerfile"
    bare.write_text(body.format(comment=""))
    r = lint(bare)
    assert r.returncode != 0 and "ignore=DL3008 without a comment" in r.stderr + r.stdout, r.stdout + r.stderr

    justified = tmp_path / "justified.Dockerfile"
    justified.write_text(body.format(comment="# DL3008: curl of the release, whatever its version (test).\n"))
    r = lint(justified)
    assert r.returncode == 0, r.stdout + r.stderr


def final_stage(text: str) -> str:
    """The instructions of the last stage, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages = re.split(r"(?m)^FROM\s", joined)
    return stages[-1]


@pytest.mark.parametrize("name", IMAGES)
def test_final_stage_is_non_root_with_healthcheck_ports_and_labels(name):
    stage = final_stage((ROOT / "docker" / f"{name}.Dockerfile").read_text())
    users = re.findall(r"(?m)^USER\s+(\S+)", stage)
    assert users and users[-1].split(":")[0] not in {"root", "0"}, users
    assert re.search(r"(?m)^HEALTHCHECK\s+.*CMD\s", stage)
    assert re.search(r"(?m)^EXPOSE\s+\d+", stage)
    for label in ["org.opencontainers.image.title", "tollgate.ports", "tollgate.mounts"]:
        assert label in stage, label
    assert re.search(r"(?m)^(ENTRYPOINT|CMD)\s", stage)


def test_healthcheck_script_reads_a_status(tmp_path):
    """docker/healthcheck.sh: healthy below 500, unhealthy on 5xx or no answer, with the client
    fallback the Debian images use (bash /dev/tcp: no curl, no wget on PATH)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response({"/ok": 200, "/denied": 401}.get(self.path, 503))
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    def bin_dir(name: str, tools: list[str]) -> str:
        d = tmp_path / name
        d.mkdir()
        for tool in tools + ["bash", "sed", "tail"]:  # what the script needs besides sh's builtins
            (d / tool).symlink_to(subprocess.check_output(["bash", "-c", f"command -v {tool}"], text=True).strip())
        return str(d)

    # One PATH per client the script may find: curl, wget (Alpine's case), neither (Debian's).
    paths = {client: bin_dir(client, tools) for client, tools in [("curl", ["curl"]), ("wget", ["wget"]), ("bash", [])]
             if all(subprocess.run(["bash", "-c", f"command -v {t}"], capture_output=True).returncode == 0 for t in tools)}
    assert "bash" in paths
    script = str(ROOT / "docker" / "healthcheck.sh")
    try:
        for client, env_path in paths.items():
            for path, healthy in [("/ok", True), ("/denied", True), ("/down", False)]:
                r = subprocess.run(["/bin/sh", script, f"http://127.0.0.1:{port}{path}"],
                                   capture_output=True, text=True, timeout=30, env={"PATH": env_path})
                assert (r.returncode == 0) == healthy, (client, path, r.stderr)
            closed = subprocess.run(["/bin/sh", script, "http://127.0.0.1:1/"], capture_output=True, text=True, timeout=30,
                                    env={"PATH": env_path})
            assert closed.returncode == 1, (client, closed.stderr)
        # The URL may also come from the environment, as the images set it.
        r = subprocess.run(["/bin/sh", script], capture_output=True, text=True, timeout=30,
                           env={"PATH": paths["bash"], "TOLLGATE_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/ok"})
        assert r.returncode == 0, r.stderr
    finally:
        srv.shutdown()
