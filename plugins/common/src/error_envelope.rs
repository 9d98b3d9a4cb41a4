//! The body of a filter's refusal, in the error envelope the client's SDK reads: a request on
//! OpenAI's API gets OpenAI's envelope, one on Anthropic's Messages API gets Anthropic's, and
//! any other request gets Tollgate's own body. Host-free: `host_calls::send_json_error` picks the
//! envelope (reading `:path` only when it refuses) and sends the body built here.
//!
//! - **OpenAI** (API reference, "Error codes"; the `openai` Python SDK's `APIError` reads
//!   `error.message`, `error.type`, `error.param`, `error.code`):
//!   `{"error":{"message":"…","type":"…","param":null,"code":"<our code>"}}`.
//! - **Anthropic** (API reference, "Errors", error shapes; the `anthropic` Python SDK's
//!   `APIStatusError` reads `error.type`, `error.message` and `error.details.error_code`):
//!   `{"type":"error","error":{"type":"…","message":"…","details":{"error_code":"<our code>"}}}`.
//! - **Tollgate**: `{"error":"<our code>","message":"…"}`.
//!
//! The status is never changed (a configured 402 stays 402): the SDKs pick their exception class
//! from the status alone, the envelope's `type` follows the status as each provider's reference
//! lists it ([`openai_type`], [`anthropic_type`]). Our stable code is always in the body, where
//! each SDK exposes it (`exc.code`, `exc.error_code`). The message and the code are cut to
//! [`MAX_MESSAGE_BYTES`] and [`MAX_CODE_BYTES`] (at a character boundary) and JSON-escaped by
//! `serde_json`, so a client-controlled name in a message cannot break or bloat the body.

use serde::Deserialize;

/// The most bytes of a refusal's message kept in its body (longer ones are cut, `…` appended).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The most bytes of a refusal's code kept in its body (ours are short constants).
pub const MAX_CODE_BYTES: usize = 64;

/// Which envelope a filter's refusals use: the `error_format` field of its plugin
/// configuration, `"auto"` (default), `"openai"`, `"anthropic"` or `"tollgate"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorFormat {
    /// From the request's path ([`envelope_for_path`]).
    #[default]
    Auto,
    /// OpenAI's envelope on every path.
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic's envelope on every path.
    Anthropic,
    /// Tollgate's own body on every path.
    Tollgate,
}

/// The shape of one refusal's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    /// `{"error":"<code>","message":"…"}`.
    Tollgate,
    /// OpenAI's `{"error":{"message","type","param","code"}}`.
    OpenAi,
    /// Anthropic's `{"type":"error","error":{"type","message","details"}}`.
    Anthropic,
}

impl ErrorFormat {
    /// The envelope of a refusal: the configured one, or for [`ErrorFormat::Auto`] the one of
    /// the request's path, which `path` reads (only then: it costs a host call).
    pub fn envelope(self, path: impl FnOnce() -> Option<String>) -> Envelope {
        match self {
            ErrorFormat::Auto => path().map_or(Envelope::Tollgate, |p| envelope_for_path(&p)),
            ErrorFormat::OpenAi => Envelope::OpenAi,
            ErrorFormat::Anthropic => Envelope::Anthropic,
            ErrorFormat::Tollgate => Envelope::Tollgate,
        }
    }
}

/// The envelope of a request's path (its normal form, `crate::path`; a query is ignored):
/// - Anthropic's Messages API: `/v1/messages` and below it (`/v1/messages/count_tokens`,
///   `/v1/messages/batches…`), and the legacy `/v1/complete`;
/// - OpenAI's API: any other `/v1` path (`/v1/chat/completions`, `/v1/completions`,
///   `/v1/embeddings`, `/v1/responses…`, `/v1/models`), and Azure OpenAI's `/openai/…`
///   (`/openai/deployments/{deployment}/chat/completions`, `/openai/v1/…`);
/// - anything else: Tollgate's own body.
pub fn envelope_for_path(path: &str) -> Envelope {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if under(path, "/v1/messages") || path == "/v1/complete" {
        Envelope::Anthropic
    } else if under(path, "/v1") || under(path, "/openai") {
        Envelope::OpenAi
    } else {
        Envelope::Tollgate
    }
}

/// Whether `path` is `prefix` or a path below it (`prefix/…`).
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// OpenAI's `error.type` for a refusal (OpenAI's "Error codes" reference): a spent budget
/// (`budget_exceeded`) is `insufficient_quota` whatever its configured status (OpenAI's 429 "You
/// exceeded your current quota"); other
/// 429s are `rate_limit_exceeded`; other 4xx are `invalid_request_error` (OpenAI answers its
/// 401s, 403s, 404s with it too); 5xx are `server_error`.
pub fn openai_type(status: u32, code: &str) -> &'static str {
    if code == "budget_exceeded" {
        "insufficient_quota"
    } else if status == 429 {
        "rate_limit_exceeded"
    } else if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    }
}

/// Anthropic's `error.type` for a status (Anthropic's "Errors" reference: 400
/// `invalid_request_error`, also "for other 4XX status codes not listed"; 401
/// `authentication_error`; 402 `billing_error`; 403 `permission_error`; 404 `not_found_error`;
/// 413 `request_too_large`; 429 `rate_limit_error`; 529 `overloaded_error`; other 5xx
/// `api_error`, the 500's type).
pub fn anthropic_type(status: u32) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

/// The JSON body of a refusal with `status`, our stable `code` and a human `message`, in
/// `envelope` (see the module documentation). At most [`MAX_MESSAGE_BYTES`] of the message and
/// [`MAX_CODE_BYTES`] of the code are kept.
pub fn body(envelope: Envelope, status: u32, code: &str, message: &str) -> Vec<u8> {
    let code = cut(code, MAX_CODE_BYTES, "");
    let message = cut(message, MAX_MESSAGE_BYTES, "…");
    let body = match envelope {
        Envelope::Tollgate => serde_json::json!({ "error": code, "message": message }),
        Envelope::OpenAi => serde_json::json!({
            "error": {
                "message": message,
                "type": openai_type(status, &code),
                "param": param(&code),
                "code": code,
            }
        }),
        Envelope::Anthropic => serde_json::json!({
            "type": "error",
            "error": {
                "type": anthropic_type(status),
                "message": message,
                "details": { "error_code": code },
            }
        }),
    };
    body.to_string().into_bytes()
}

/// OpenAI's `error.param`: the request field at fault, when our code names one.
fn param(code: &str) -> Option<&'static str> {
    match code {
        "unknown_model" | "model_not_priced" => Some("model"),
        _ => None,
    }
}

/// `text` cut to at most `max` bytes at a character boundary, `mark` appended when cut (the
/// mark's bytes count within `max`).
fn cut(text: &str, max: usize, mark: &str) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(mark.len());
    while !text.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    let mut out = String::with_capacity(end.saturating_add(mark.len()));
    out.push_str(text.get(..end).unwrap_or_default());
    out.push_str(mark);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn json(envelope: Envelope, status: u32, code: &str, message: &str) -> Value {
        serde_json::from_slice(&body(envelope, status, code, message)).unwrap()
    }

    #[test]
    fn paths_pick_the_provider_of_their_api() {
        for anthropic in [
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/messages/batches/msgbatch_01/results",
            "/v1/complete",
            "/v1/messages?beta=true",
        ] {
            assert_eq!(
                envelope_for_path(anthropic),
                Envelope::Anthropic,
                "{anthropic}"
            );
        }
        for openai in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/responses/resp_1/input_items",
            "/v1/models",
            "/v1",
            "/v1/messagesx",
            "/v1/complete/x",
            "/v1/chat/completions?api-version=1",
            "/openai/deployments/gpt-4o/chat/completions",
            "/openai/v1/responses",
        ] {
            assert_eq!(envelope_for_path(openai), Envelope::OpenAi, "{openai}");
        }
        for other in [
            "/",
            "/healthz",
            "/v10/chat",
            "/v1x/messages",
            "/api/v1/chat/completions",
            "/openaiv1",
            "/messages",
            "",
        ] {
            assert_eq!(envelope_for_path(other), Envelope::Tollgate, "{other}");
        }
    }

    #[test]
    fn a_configured_format_wins_and_reads_no_path() {
        let never = || -> Option<String> { panic!("read the path") };
        assert_eq!(ErrorFormat::OpenAi.envelope(never), Envelope::OpenAi);
        assert_eq!(ErrorFormat::Anthropic.envelope(never), Envelope::Anthropic);
        assert_eq!(ErrorFormat::Tollgate.envelope(never), Envelope::Tollgate);
        let path = |p: &str| {
            let p = p.to_owned();
            move || Some(p)
        };
        assert_eq!(
            ErrorFormat::Auto.envelope(path("/v1/messages")),
            Envelope::Anthropic
        );
        assert_eq!(ErrorFormat::Auto.envelope(|| None), Envelope::Tollgate);
        let parsed: ErrorFormat = serde_json::from_str("\"openai\"").unwrap();
        assert_eq!(parsed, ErrorFormat::OpenAi);
        assert!(serde_json::from_str::<ErrorFormat>("\"open_ai\"").is_err());
        assert!(serde_json::from_str::<ErrorFormat>("\"OpenAI\"").is_err());
    }

    #[test]
    fn openai_envelope_has_the_sdks_fields() {
        let v = json(
            Envelope::OpenAi,
            429,
            "budget_exceeded",
            "tenant alice is over budget",
        );
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "tenant alice is over budget",
                "type": "insufficient_quota", "param": null, "code": "budget_exceeded"}})
        );
        let v = json(Envelope::OpenAi, 400, "unknown_model", "m");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(
            json(Envelope::OpenAi, 429, "rate_limited", "m")["error"]["type"],
            "rate_limit_exceeded"
        );
        assert_eq!(
            json(Envelope::OpenAi, 402, "budget_exceeded", "m")["error"]["type"],
            "insufficient_quota"
        );
        assert_eq!(
            json(Envelope::OpenAi, 503, "budget_unavailable", "m")["error"]["type"],
            "server_error"
        );
        assert_eq!(
            json(Envelope::OpenAi, 401, "missing_token", "m")["error"]["type"],
            "invalid_request_error"
        );
    }

    #[test]
    fn anthropic_envelope_has_the_sdks_fields() {
        let v = json(Envelope::Anthropic, 429, "budget_exceeded", "over");
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error",
                "message": "over", "details": {"error_code": "budget_exceeded"}}})
        );
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (402, "billing_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (409, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "api_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(anthropic_type(status), kind, "{status}");
        }
    }

    #[test]
    fn tollgate_body_is_unchanged() {
        let v = json(
            Envelope::Tollgate,
            401,
            "invalid_token",
            "the \"token\" expired",
        );
        assert_eq!(
            v,
            serde_json::json!({"error": "invalid_token", "message": "the \"token\" expired"})
        );
    }

    #[test]
    fn client_text_is_escaped_in_every_envelope() {
        // A tenant or model name a client sent: quotes, backslashes, control characters, and
        // bytes that were not UTF-8 (read as U+FFFD, `abi_codec::text`).
        let raw = b"ten\"ant\\ \x00\x1f\r\n\x7f \xff\xfe</script>";
        let name = String::from_utf8_lossy(raw).into_owned();
        let message = format!("tenant {name} is over budget");
        for envelope in [Envelope::Tollgate, Envelope::OpenAi, Envelope::Anthropic] {
            let bytes = body(envelope, 429, "budget_exceeded", &message);
            let text = std::str::from_utf8(&bytes).unwrap();
            assert!(
                !text.bytes().any(|b| b < 0x20),
                "raw control byte: {text:?}"
            );
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            let got = match envelope {
                Envelope::Tollgate => &v["message"],
                _ => &v["error"]["message"],
            };
            assert_eq!(got, &Value::String(message.clone()), "{envelope:?}");
        }
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let message = "é".repeat(MAX_MESSAGE_BYTES);
        let code = "c".repeat(MAX_CODE_BYTES * 4);
        for envelope in [Envelope::Tollgate, Envelope::OpenAi, Envelope::Anthropic] {
            let bytes = body(envelope, 400, &code, &message);
            assert!(
                bytes.len() < MAX_MESSAGE_BYTES + MAX_CODE_BYTES + 200,
                "{}",
                bytes.len()
            );
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            let got = match envelope {
                Envelope::Tollgate => v["message"].as_str().unwrap(),
                _ => v["error"]["message"].as_str().unwrap(),
            };
            assert!(
                got.len() <= MAX_MESSAGE_BYTES && got.ends_with("é…"),
                "{got}"
            );
        }
        assert_eq!(cut("abc", 3, "…"), "abc");
        assert_eq!(cut("abcd", 3, ""), "abc");
        assert_eq!(cut("abcdef", 4, "…"), "a…");
        assert_eq!(cut("ab", 0, ""), "");
    }
}
