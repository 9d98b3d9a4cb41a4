"""The shipped LLM gateways, envoy/llm-gateway.yaml and nginx-compat/conf/llm-gateway.conf, as
they are (only their ports and paths rendered for the test): the same filters and prices on every
host, so an OpenAI chat model, an Anthropic model and an embedding model are served to a
budgeted tenant, and a model without a price is refused before the upstream."""

from __future__ import annotations

import json
import subprocess
import time

import jwt
import pytest
import requests

from lab import (NGINX_BUILDS, ROOT, WASM_DIR, DemoUpstream, Process, envoy_binary, free_port, selected_hosts,
                     wait_for_port)

SECRET = "tollgate-demo-secret-change-me-0123456789"  # the configurations' demo provider


def token(sub: str = "alice") -> str:
    now = int(time.time())
    claims = {"iss": "https://demo.tollgate.local", "aud": "demo-api", "sub": sub, "iat": now, "exp": now + 600}
    return jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "demo"})


def start_envoy(tmp, port: int, upstream: int, admin: int) -> Process:
    text = (ROOT / "envoy" / "llm-gateway.yaml").read_text()
    for old, new in [("port_value: 10000", f"port_value: {port}"), ("port_value: 9901", f"port_value: {admin}"),
                     ("port_value: 8080", f"port_value: {upstream}"),
                     ("filename: target/wasm32-wasip1/release/", f"filename: {WASM_DIR}/")]:
        assert old in text, old
        text = text.replace(old, new)
    conf = tmp / "llm-gateway.yaml"
    conf.write_text(text)
    p = Process([envoy_binary(), "-c", str(conf), "--concurrency", "2", "--use-dynamic-base-id", "-l", "warning"],
                tmp / "envoy.log")
    wait_for_port(port, p.proc, 60, p.log)
    return p


def start_nginx(tmp, host: str, port: int, upstream: int, admin: int) -> Process:
    binary, module = NGINX_BUILDS[host]
    text = (ROOT / "nginx-compat" / "conf" / "llm-gateway.conf").read_text()
    for old, new in [("load_module target/nginx/ngx_http_tollgate_wasm_module.so;", f"load_module {module};"),
                     ("127.0.0.1:10000", f"127.0.0.1:{port}"), ("127.0.0.1:8080", f"127.0.0.1:{upstream}"),
                     ("127.0.0.1:9901", f"127.0.0.1:{admin}"),
                     (" target/wasm32-wasip1/release/", f" {WASM_DIR}/"), (" target/nginx/run/", f" {tmp}/")]:
        assert old in text, old
        text = text.replace(old, new)
    conf = tmp / "llm-gateway.conf"
    conf.write_text(text)
    p = Process([str(binary), "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")], tmp / "nginx.out")
    wait_for_port(port, p.proc, 60, tmp / "error.log")
    return p


@pytest.fixture(params=[h for h in selected_hosts() if h == "envoy" or h in NGINX_BUILDS])
def gateway(request, tmp_path):
    upstream = DemoUpstream("demo-upstream", tmp_path)
    port = free_port()
    admin = free_port()
    try:
        if request.param == "envoy":
            p = start_envoy(tmp_path, port, upstream.port, admin)
        else:
            p = start_nginx(tmp_path, request.param, port, upstream.port, admin)
    except BaseException:
        upstream.stop()
        raise
    # Where the Prometheus exposition is: Envoy's admin endpoint, nginx's tollgate_metrics server.
    request.node.admin = f"http://127.0.0.1:{admin}"
    request.node.host_name = request.param
    yield f"http://127.0.0.1:{port}"
    p.stop()
    upstream.stop()


def post(url: str, path: str, body: dict, auth: bool = True) -> requests.Response:
    headers = {"content-type": "application/json", "x-mock-prompt-tokens": "100", "x-mock-completion-tokens": "20"}
    if auth:
        headers["authorization"] = f"Bearer {token()}"
    return requests.post(url + path, data=json.dumps(body), headers=headers, timeout=10)


def test_the_shipped_llm_gateway_serves_each_priced_kind_of_model(gateway):
    r = post(gateway, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = post(gateway, "/v1/messages", {"model": "claude-3-5-haiku-20241022", "max_tokens": 10,
                                       "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = post(gateway, "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 200, r.text
    # No price, a budgeted tenant: refused before the upstream (unknown_model: refuse_budgeted).
    r = post(gateway, "/v1/chat/completions", {"model": "gpt-4o", "messages": []})
    assert r.status_code == 400 and "model_not_priced" in r.text, r.text
    # No token: jwt-auth.
    r = post(gateway, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": []}, auth=False)
    assert r.status_code == 401, r.text


def test_the_prometheus_exposition_has_the_filters_labels_and_passes_promtool(gateway, request):
    """envoy/llm-gateway.yaml ships the stats_tags rules, nginx's llm-gateway.conf a
    tollgate_metrics server: the filters' own counters come out of /stats/prometheus as labelled
    families, not with their labels folded into the names. promtool finds nothing on nginx's; on
    Envoy's only `no help text` on ours (Envoy writes no # HELP: plugins/metrics/README.md)."""
    admin = request.node.admin
    r = post(gateway, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    text = requests.get(admin + "/stats/prometheus", timeout=10).text
    lines = [l for l in text.splitlines() if l.startswith(("tollgate_cost_requests_total", "tollgate_jwt_auth_requests_total"))]
    assert any(l.startswith('tollgate_cost_requests_total{outcome="priced"}') for l in lines), lines
    assert any(l.startswith('tollgate_jwt_auth_requests_total{outcome="ok"}') for l in lines), lines
    assert not any(".outcome." in l or "_outcome_" in l for l in lines), lines
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    findings = [l for l in (res.stdout + res.stderr).splitlines() if l.strip()]
    if request.node.host_name == "envoy":
        assert res.returncode in (0, 3), findings[:50]
        ours = [l for l in findings if l.startswith("tollgate_")]
        assert ours and all(l.endswith(" no help text") for l in ours), ours
    else:
        assert (res.returncode, findings) == (0, []), findings
