"""A filter's refusal body as the client reads it (plugins/cost/README.md, "Refusals"): OpenAI's
envelope on OpenAI's paths, Anthropic's on the Messages API, Tollgate's own body elsewhere.
`refusal` checks that a body has exactly the envelope's fields and returns our stable code and the
message, so a suite asserts the code whatever the path."""

from __future__ import annotations

OPENAI_FIELDS = {"message", "type", "param", "code"}


def refusal(body: object, api: str = "openai") -> tuple[str, str]:
    """(code, message) of a refusal `body` (parsed JSON) in `api`'s envelope: "openai",
    "anthropic" or "tollgate"; an AssertionError names what is off."""
    assert isinstance(body, dict), body
    if api == "openai":
        assert set(body) == {"error"}, body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == OPENAI_FIELDS, body
        return error["code"], error["message"]
    if api == "anthropic":
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"type", "message", "details"}, body
        return error["details"]["error_code"], error["message"]
    assert api == "tollgate", api
    assert set(body) == {"error", "message"} and isinstance(body["error"], str), body
    return body["error"], body["message"]


def refusal_code(body: object, api: str = "openai") -> str:
    """Our stable code of a refusal `body` in `api`'s envelope ([`refusal`])."""
    return refusal(body, api)[0]
