//! gRPC statuses and `grpc-message` text as Envoy handles them, shared by the gRPC client
//! (`grpc_client.rs`: reading a reply) and the nginx module's local replies to gRPC requests
//! ([`grpc_local_reply`]: writing one). Nothing here touches the network.
//!
//! Sources: gRPC's doc/PROTOCOL-HTTP2.md ("Responses": `grpc-status`, `grpc-message` and its
//! percent-encoding, trailers-only responses), doc/statuscodes.md and
//! doc/http-grpc-status-mapping.md; Envoy's `Grpc::Utility::httpToGrpcStatus`
//! (source/common/grpc/status.cc), `Grpc::Common::hasGrpcContentType`
//! (source/common/grpc/common.cc) and the local reply of a gRPC request,
//! `Http::Utility::prepareLocalReply` (source/common/http/utility.cc).

/// gRPC status codes (grpc/doc/statuscodes.md) this crate produces itself.
pub mod status {
    /// The call succeeded.
    pub const OK: u32 = 0;
    /// No or bad `grpc-status`; an HTTP status without a mapping.
    pub const UNKNOWN: u32 = 2;
    /// HTTP 403.
    pub const PERMISSION_DENIED: u32 = 7;
    /// A message above the size cap.
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    /// HTTP 404.
    pub const UNIMPLEMENTED: u32 = 12;
    /// A malformed or cut-short reply, a reset stream, OK without a message; HTTP 400.
    pub const INTERNAL: u32 = 13;
    /// No connection, or the deadline passed (Envoy's local reply 503 / 504); HTTP 429, 502.
    pub const UNAVAILABLE: u32 = 14;
    /// HTTP 401.
    pub const UNAUTHENTICATED: u32 = 16;
    /// The largest code gRPC defines (`UNAUTHENTICATED`): Envoy's
    /// `Grpc::Status::WellKnownGrpcStatus::MaximumKnown`.
    pub const MAXIMUM_KNOWN: u32 = UNAUTHENTICATED;
}

/// Envoy's `Grpc::Utility::httpToGrpcStatus` (source/common/grpc/status.cc, after gRPC's
/// http-grpc-status-mapping.md): the gRPC status of an HTTP status. 400 Internal, 401
/// Unauthenticated, 403 PermissionDenied, 404 Unimplemented, 429/502/503/504 Unavailable,
/// anything else (200 included) Unknown.
pub fn http_to_grpc_status(http_status: u16) -> u32 {
    match http_status {
        400 => status::INTERNAL,
        401 => status::UNAUTHENTICATED,
        403 => status::PERMISSION_DENIED,
        404 => status::UNIMPLEMENTED,
        429 | 502 | 503 | 504 => status::UNAVAILABLE,
        _ => status::UNKNOWN,
    }
}

/// The content type of gRPC requests and replies.
pub const GRPC_CONTENT_TYPE: &[u8] = b"application/grpc";

/// Whether a request whose `content-type` value is `value` is a gRPC request, as Envoy's
/// `Grpc::Common::hasGrpcContentType` decides (source/common/grpc/common.cc, after
/// PROTOCOL-HTTP2.md's `Content-Type → "content-type" "application/grpc" [("+proto" /
/// "+json" / {custom})]`): exactly `application/grpc`, or `application/grpc+` and anything.
/// Case-sensitive, parameters not allowed: `application/grpc-web` and `application/grpc;
/// charset=utf-8` are not gRPC (Envoy's test `GrpcCommonTest.HasGrpcContentType`).
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    match value.strip_prefix(GRPC_CONTENT_TYPE) {
        Some(rest) => rest.is_empty() || rest.first() == Some(&b'+'),
        None => false,
    }
}

/// Percent-encodes `text` for a `grpc-message` field (PROTOCOL-HTTP2.md, "Responses":
/// `Percent-Byte-Unencoded = 1*( %x20-%x24 / %x26-%x7E )`, every other byte `%XX` with
/// upper-case hex digits). Envoy's `Http::Utility::PercentEncoding::encode` also encodes `~`
/// (0x7E); decoders read both spellings as the same text.
pub fn encode_grpc_message(text: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(text.len());
    for &b in text {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'));
            out.push(HEX.get(usize::from(b & 0x0f)).copied().unwrap_or(b'0'));
        }
    }
    out
}

/// Percent-decodes a `grpc-message` (PROTOCOL-HTTP2.md), lossy UTF-8; a `%` not followed by
/// two hex digits stays as it is (the spec asks decoders to accept that).
pub fn decode_grpc_message(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = v.iter().copied().peekable();
    while let Some(b) = i.next() {
        if b == b'%' {
            let mut hex = i.clone();
            let hi = hex.next().and_then(|c| (c as char).to_digit(16));
            let lo = hex.next().and_then(|c| (c as char).to_digit(16));
            if let (Some(hi), Some(lo)) = (hi, lo) {
                out.push(u8::try_from(hi.saturating_mul(16).saturating_add(lo)).unwrap_or(b'?'));
                i.next();
                i.next();
                continue;
            }
        }
        out.push(b);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The response fields of a filter's local reply (`proxy_send_local_response`) to a gRPC
/// request, as Envoy makes it (`Http::Utility::prepareLocalReply`, source/common/http/utility.cc,
/// called by `sendLocalReply` when `Grpc::Common::isGrpcRequestHeaders`): a trailers-only
/// response, that is these fields sent as the response's only HEADERS frame with END_STREAM,
/// no body and no `content-length`.
///
/// - `headers`: the filter's extra fields (names lower-case), kept, except `content-length`
///   (removed), `content-type` (replaced) and, when `body` is not empty, `grpc-message`
///   (replaced);
/// - `:status: 200` (whatever `http_status` the filter gave), `content-type: application/grpc`;
/// - `grpc-status`: the filter's own `grpc-status` field when it gave a non-empty one (Envoy
///   only sets it when the map has none), else `grpc_status` (the ABI's argument when Envoy
///   counts it as set: 0 to 16, see `tollgate_host::LocalResponse::grpc_status`), else
///   `http_status` mapped by [`http_to_grpc_status`] (e.g. 401 → 16 Unauthenticated);
/// - `grpc-message`: `body` percent-encoded ([`encode_grpc_message`]), unless `body` is empty
///   or the request is a HEAD (`head_request`). Envoy strips one trailing LF only from the
///   bodies of its JSON local-reply formatter, never from a Wasm filter's text: neither is it
///   stripped here.
///
/// Returns `(name, value)` pairs, `:status` first.
pub fn grpc_local_reply(
    http_status: u32,
    grpc_status: Option<u32>,
    body: &[u8],
    headers: &[(Vec<u8>, Vec<u8>)],
    head_request: bool,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let message = (!body.is_empty() && !head_request).then(|| encode_grpc_message(body));
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(headers.len().saturating_add(4));
    out.push((b":status".to_vec(), b"200".to_vec()));
    out.push((b"content-type".to_vec(), GRPC_CONTENT_TYPE.to_vec()));
    let mut has_status = false;
    for (k, v) in headers {
        match k.as_slice() {
            b"content-length" | b"content-type" => continue,
            b"grpc-message" if message.is_some() => continue,
            b"grpc-status" if v.is_empty() => continue,
            b"grpc-status" => has_status = true,
            n if n.first() == Some(&b':') => continue,
            _ => {}
        }
        out.push((k.clone(), v.clone()));
    }
    if !has_status {
        let code = grpc_status
            .unwrap_or_else(|| http_to_grpc_status(u16::try_from(http_status).unwrap_or(0)));
        out.push((b"grpc-status".to_vec(), code.to_string().into_bytes()));
    }
    if let Some(m) = message {
        out.push((b"grpc-message".to_vec(), m));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Vec<&'a [u8]> {
        fields
            .iter()
            .filter(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    #[test]
    fn http_statuses_map_as_envoys_http_to_grpc_status() {
        let table = [
            (400, status::INTERNAL),
            (401, status::UNAUTHENTICATED),
            (403, status::PERMISSION_DENIED),
            (404, status::UNIMPLEMENTED),
            (429, status::UNAVAILABLE),
            (502, status::UNAVAILABLE),
            (503, status::UNAVAILABLE),
            (504, status::UNAVAILABLE),
            (200, status::UNKNOWN),
            (418, status::UNKNOWN),
            (500, status::UNKNOWN),
        ];
        for (http, grpc) in table {
            assert_eq!(http_to_grpc_status(http), grpc, "HTTP {http}");
        }
    }

    #[test]
    fn grpc_content_types_are_envoys() {
        for yes in [
            &b"application/grpc"[..],
            b"application/grpc+proto",
            b"application/grpc+json",
            b"application/grpc+",
        ] {
            assert!(
                is_grpc_content_type(yes),
                "{}",
                String::from_utf8_lossy(yes)
            );
        }
        for no in [
            &b""[..],
            b"application/grpc-web",
            b"application/grpc-web+proto",
            b"application/grpc; charset=utf-8",
            b"application/grpcx",
            b"Application/gRPC",
            b"text/plain",
            b"application/json",
        ] {
            assert!(!is_grpc_content_type(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn messages_are_percent_encoded_as_grpc_says_and_decode_back() {
        assert_eq!(encode_grpc_message(b"plain text ~!"), b"plain text ~!");
        assert_eq!(encode_grpc_message(b"100%"), b"100%25");
        assert_eq!(encode_grpc_message(b"a\r\nb\t\x7f"), b"a%0D%0Ab%09%7F");
        // UTF-8 bytes one by one.
        assert_eq!(encode_grpc_message("é→".as_bytes()), b"%C3%A9%E2%86%92");
        for text in ["", "aborted by the filter", "100% sure\n", "é→ \u{0} ~%7E"] {
            let encoded = encode_grpc_message(text.as_bytes());
            assert!(
                encoded.iter().all(|b| (0x20..=0x7e).contains(b)),
                "{encoded:?}"
            );
            assert_eq!(decode_grpc_message(&encoded), text);
        }
        assert_eq!(decode_grpc_message(b"%zz%4"), "%zz%4");
    }

    #[test]
    fn a_local_reply_with_a_grpc_status_is_trailers_only_with_that_status_and_the_body_as_message()
    {
        // The Rust SDK's send_grpc_response(Aborted, Some("..."), vec![]): HTTP 200, status 10.
        let out = grpc_local_reply(200, Some(10), b"aborted: try again", &[], false);
        assert_eq!(
            out,
            [
                (b":status".to_vec(), b"200".to_vec()),
                (b"content-type".to_vec(), b"application/grpc".to_vec()),
                (b"grpc-status".to_vec(), b"10".to_vec()),
                (b"grpc-message".to_vec(), b"aborted: try again".to_vec()),
            ]
        );
    }

    #[test]
    fn without_a_grpc_status_the_http_status_is_mapped() {
        // jwt-auth's refusal: 401 with a JSON body, no gRPC status (-1 on the ABI).
        let headers = vec![
            (b"content-type".to_vec(), b"application/json".to_vec()),
            (b"www-authenticate".to_vec(), b"Bearer".to_vec()),
            (b"content-length".to_vec(), b"13".to_vec()),
        ];
        let out = grpc_local_reply(401, None, b"{\"e\":\"no\"}\n", &headers, false);
        assert_eq!(field(&out, ":status"), [b"200"]);
        assert_eq!(field(&out, "content-type"), [b"application/grpc"]);
        assert_eq!(field(&out, "grpc-status"), [b"16"]);
        assert_eq!(field(&out, "grpc-message"), [b"{\"e\":\"no\"}%0A"]);
        assert_eq!(field(&out, "www-authenticate"), [b"Bearer"]);
        assert!(field(&out, "content-length").is_empty());
        for (http, grpc) in [
            (403, "7"),
            (429, "14"),
            (500, "2"),
            (418, "2"),
            (70000, "2"),
        ] {
            let out = grpc_local_reply(http, None, b"", &[], false);
            assert_eq!(field(&out, "grpc-status"), [grpc.as_bytes()], "HTTP {http}");
            assert!(field(&out, "grpc-message").is_empty());
        }
    }

    #[test]
    fn the_filters_own_grpc_status_wins_and_head_requests_get_no_message() {
        let headers = vec![
            (b"grpc-status".to_vec(), b"5".to_vec()),
            (
                b"grpc-message".to_vec(),
                b"kept%20when%20no%20body".to_vec(),
            ),
            (b":status".to_vec(), b"418".to_vec()),
        ];
        let out = grpc_local_reply(403, Some(10), b"", &headers, false);
        assert_eq!(field(&out, "grpc-status"), [b"5"]);
        assert_eq!(field(&out, "grpc-message"), [b"kept%20when%20no%20body"]);
        assert_eq!(field(&out, ":status"), [b"200"]);
        let out = grpc_local_reply(403, Some(10), b"replaced", &headers, false);
        assert_eq!(field(&out, "grpc-message"), [b"replaced"]);
        let out = grpc_local_reply(403, None, b"body", &[], true);
        assert_eq!(field(&out, "grpc-status"), [b"7"]);
        assert!(field(&out, "grpc-message").is_empty());
        // An empty grpc-status of the filter's does not count (Envoy tests the value).
        let empty = vec![(b"grpc-status".to_vec(), Vec::new())];
        let out = grpc_local_reply(401, None, b"", &empty, false);
        assert_eq!(field(&out, "grpc-status"), [b"16"]);
    }
}
