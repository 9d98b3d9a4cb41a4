"""The filters' refusals as the providers' own SDKs read them (plugins/cost/README.md, "Refusals"):
the real `openai` and `anthropic` Python packages (tests/requirements.txt) pointed at a gateway of
jwt-auth, rate-limit and cost raise the exception class of the status, with our message and our
stable code where each SDK exposes them. One parametrized test over (SDK, refusal) on every host;
client-controlled names carry quotes and a backslash (the tenant) and a control character too (the model)."""

from __future__ import annotations

import json
import time
import uuid

import anthropic
import jwt
import openai
import pytest
import requests

from lab import FilterSpec, GatewaySpec, free_port, kong_differs
from refusals import refusal

SECRET = "sdk-errors-secret-0123456789abcdef"
ISSUER = "https://sdk.e2e"
PRICES = {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07},
          "claude-3-5-haiku-20241022": {"input_cost_per_token": 8e-07, "output_cost_per_token": 4e-06}}
# A global rule whose rate limit service does not answer (nothing listens on its port), on the
# endpoint each SDK calls for "the service is down": 503 rate_limit_unavailable.
DOWN = {"openai": "/v1/embeddings", "anthropic": "/v1/messages/count_tokens"}


def jwt_auth(error_format: str | None = None) -> FilterSpec:
    config = {"providers": {"sdk": {"issuer": ISSUER, "hmac_secrets": [{"alg": "HS256", "kid": "k", "secret": SECRET}],
                                    "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}]}}}
    if error_format:
        config["error_format"] = error_format
    return FilterSpec("jwt-auth", config)


def token(sub: str) -> str:
    now = int(time.time())
    return jwt.encode({"iss": ISSUER, "sub": sub, "iat": now, "exp": now + 600}, SECRET, algorithm="HS256",
                      headers={"kid": "k"})


@pytest.fixture(scope="module")
def gateway(host, upstream):
    down = {"service": "ratelimit", "domain": "sdk", "timeout_ms": 500, "on_error": "deny"}
    # Kong's module has no gRPC calls: a global rule would stop its workers from starting.
    rules = [] if kong_differs(host, "no-grpc-calls") else [
        {"name": f"down-{sdk}", "match": {"path": path}, "global": down,
         "limits": [{"algorithm": "fixed_window", "requests": 100, "per": "minute"}]} for sdk, path in DOWN.items()]
    rules.append({"name": "per-user", "match": {"prefix": "/v1/"}, "key": [{"header": "x-jwt-sub"}],
                  "limits": [{"algorithm": "fixed_window", "requests": 3, "per": "minute"}]})
    cost = {"prices": PRICES, "tenant": {"header": "x-jwt-sub"}, "budgets": {"default": {"day_nano_usd": 1000}},
            "over_budget_status": 429}
    spec = GatewaySpec(filters=[jwt_auth(), FilterSpec("rate-limit", {"namespace": "sdk", "rules": rules}),
                                FilterSpec("cost", cost)],
                       upstreams={"upstream": upstream.port}, grpc_services={"ratelimit": free_port()})
    g = host.start(spec)
    yield g
    g.stop()


def client(sdk: str, url: str, key: str):
    if sdk == "openai":
        return openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0, timeout=10)
    return anthropic.Anthropic(api_key=None, auth_token=key, base_url=url, max_retries=0, timeout=10)


def call(sdk: str, c, model: str = "gpt-4o-mini", endpoint: str = "create"):
    if sdk == "openai":
        if endpoint == "down":
            return c.embeddings.create(model=model, input="hi")
        return c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    model = "claude-3-5-haiku-20241022" if model == "gpt-4o-mini" else model
    messages = [{"role": "user", "content": "hi"}]
    if endpoint == "down":
        return c.messages.count_tokens(model=model, messages=messages)
    return c.messages.create(model=model, max_tokens=10, messages=messages)


def spend_the_budget(url: str, sdk: str, tok: str) -> None:
    """One admitted request that books more than the day's 1000 nano-USD (plain HTTP: the demo
    upstream's reply need not be what the SDK parses)."""
    path = "/v1/chat/completions" if sdk == "openai" else "/v1/messages"
    model = "gpt-4o-mini" if sdk == "openai" else "claude-3-5-haiku-20241022"
    r = requests.post(url + path, data=json.dumps({"model": model, "max_tokens": 10, "messages": []}), timeout=10,
                      headers={"authorization": f"Bearer {tok}", "content-type": "application/json",
                               "x-mock-prompt-tokens": "100", "x-mock-completion-tokens": "10"})
    assert r.status_code == 200, r.text


# (case, status, OpenAI's class, Anthropic's class, our code, a part of our message)
CASES = [
    ("bad_token", 401, openai.AuthenticationError, anthropic.AuthenticationError, "unauthorized", None),
    ("unknown_model", 400, openai.BadRequestError, anthropic.BadRequestError, "model_not_priced", "has no price"),
    ("budget", 429, openai.RateLimitError, anthropic.RateLimitError, "budget_exceeded", "budget of tenant"),
    ("rate_limit", 429, openai.RateLimitError, anthropic.RateLimitError, "rate_limited", "per-user"),
    ("service_down", 503, openai.InternalServerError, anthropic.ServiceUnavailableError, "rate_limit_unavailable",
     None),
]
OPENAI_TYPES = {"budget": "insufficient_quota", "rate_limit": "rate_limit_exceeded", "service_down": "server_error"}
ANTHROPIC_TYPES = {"bad_token": "authentication_error", "unknown_model": "invalid_request_error",
                   "budget": "rate_limit_error", "rate_limit": "rate_limit_error", "service_down": "api_error"}


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_sdk_raises_the_class_of_the_refusal_with_our_message_and_code(host, gateway, sdk, case):
    name, status, openai_class, anthropic_class, code, part = case
    if name == "service_down" and kong_differs(host, "no-grpc-calls"):
        pytest.skip("Kong's module has no gRPC calls (KONG_DIFFERENCES)")
    # The tenant (the token's subject: visible ASCII, or cost books it to "anonymous") and the
    # model are the client's: quotes, a backslash and (the model) a control character come back
    # intact in the message, the body still JSON.
    sub = f'sdk"{sdk}"\\{uuid.uuid4().hex[:8]}'
    tok = token(sub)
    model, endpoint = "gpt-4o-mini", "create"
    if name == "bad_token":
        tok = tok[:-4] + ("AAAA" if not tok.endswith("AAAA") else "BBBB")
    elif name == "unknown_model":
        model = 'no-such-"model"\\\x01'
        part = f"model {model} has no price"
    elif name == "budget":
        spend_the_budget(gateway.url, sdk, tok)
        part = f"budget of tenant {sub} is spent"
    elif name == "rate_limit":
        for _ in range(3):  # the per-user limit's 3 a minute (a GET: nothing for cost to book)
            r = requests.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {tok}"}, timeout=10)
            assert r.status_code == 200, r.text
    elif name == "service_down":
        endpoint = "down"
    with pytest.raises(openai_class if sdk == "openai" else anthropic_class) as raised:
        call(sdk, client(sdk, gateway.url, tok), model, endpoint)
    exc = raised.value
    assert exc.status_code == status, (exc.status_code, exc.body)
    if sdk == "openai":
        # The SDK hands `body["error"]` on as exc.body and prints its message.
        assert exc.code == code and exc.body["code"] == code, exc.body
        assert exc.type == OPENAI_TYPES.get(name, "invalid_request_error"), exc.body
        assert str(exc).startswith(f"Error code: {status} - ") and exc.body["message"] in str(exc), str(exc)
        message = exc.body["message"]
        assert refusal({"error": exc.body}, "openai") == (code, message)
    else:
        assert exc.error_code == code and exc.type == ANTHROPIC_TYPES[name], exc.body
        assert refusal(exc.body, "anthropic") == (code, exc.api_message)
        message = exc.api_message
        assert exc.body["error"]["message"] == message and repr(message)[1:-1] in str(exc), str(exc)
    assert message, exc.body
    if part is not None:
        assert part in message, (part, message)
    if name == "budget":
        assert 0 < int(exc.response.headers["retry-after"]) <= 86_400
        assert exc.response.headers["retry-after"] == exc.response.headers["x-tollgate-budget-reset"]
    if name == "bad_token":
        assert exc.response.headers["www-authenticate"].startswith("Bearer")


def test_other_paths_keep_tollgates_body_and_a_configured_format_wins(host, gateway, upstream):
    """Outside the providers' paths the body is Tollgate's own; `error_format` overrides the path."""
    r = requests.get(gateway.url + "/api/orders?x=/v1/chat", timeout=10)
    assert r.status_code == 401 and refusal(r.json(), "tollgate")[0] == "unauthorized", r.text
    r = requests.get(gateway.url + "/v1/models", timeout=10)
    assert r.status_code == 401 and refusal(r.json(), "openai")[0] == "unauthorized", r.text
    r = requests.post(gateway.url + "/v1/messages?beta=true", timeout=10)
    assert r.status_code == 401 and refusal(r.json(), "anthropic")[0] == "unauthorized", r.text
    g = host.start(GatewaySpec(filters=[jwt_auth("anthropic")], upstreams={"upstream": upstream.port}))
    try:
        for path in ("/api/orders", "/v1/chat/completions"):
            r = requests.get(g.url + path, timeout=10)
            assert r.status_code == 401 and refusal(r.json(), "anthropic")[0] == "unauthorized", r.text
    finally:
        g.stop()
