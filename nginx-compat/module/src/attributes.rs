//! Envoy's request attributes as `proxy_get_property` names them, nginx-free: which attribute
//! a property path asks for, and the encodings (`props.rs` reads the values from the nginx
//! request). Names and encodings follow Envoy's attributes
//! (<https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/advanced/attributes>):
//! strings as bytes, integers as 8-byte little-endian, timestamps as nanoseconds since the
//! epoch (8-byte little-endian). `ngx.<variable>` (or `ngx\0<variable>`) reads any nginx
//! variable, like ngx_wasm_module.

use std::borrow::Cow;

/// One attribute a filter can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute<'a> {
    /// `request.path`: the path with its query, as received.
    RequestPath,
    /// `request.url_path`: the path without the query.
    RequestUrlPath,
    /// `request.query`.
    RequestQuery,
    /// `request.host`: the request's `:authority` (an absolute-form target's authority, else
    /// `Host`, else the server name), as Envoy's attribute is `:authority`.
    RequestHost,
    /// `request.method`.
    RequestMethod,
    /// `request.scheme`: `http` or `https`.
    RequestScheme,
    /// `request.protocol`: `HTTP/1.1`...
    RequestProtocol,
    /// `request.id`: nginx's `$request_id`.
    RequestId,
    /// `request.time`: start of the request, ns since the epoch.
    RequestTime,
    /// `request.size`: the body's declared length (bytes, 0 if none).
    RequestSize,
    /// `request.total_size`: head and body as received (bytes).
    RequestTotalSize,
    /// `request.useragent`.
    RequestUserAgent,
    /// `request.referer`.
    RequestReferer,
    /// `request.headers.<name>`: the first value of that request header.
    RequestHeader(&'a [u8]),
    /// `source.address`: the client's `ip:port`.
    SourceAddress,
    /// `source.port`.
    SourcePort,
    /// `destination.address`: the local `ip:port`.
    DestinationAddress,
    /// `destination.port`.
    DestinationPort,
    /// `connection.id`: nginx's connection number.
    ConnectionId,
    /// `connection.mtls`: always false (nginx's TLS here does not verify clients).
    ConnectionMtls,
    /// `response.code`.
    ResponseCode,
    /// `response.code_details`: `via_upstream`, a local reply's details...
    ResponseCodeDetails,
    /// `response.size`: body bytes sent.
    ResponseSize,
    /// `response.total_size`: bytes sent with the head.
    ResponseTotalSize,
    /// `ngx.<name>`: the nginx variable `<name>`.
    NgxVariable(&'a [u8]),
}

/// The `\0`-joined form of a property path. A dotted path (`request.path`, no `\0`) is
/// accepted like the `\0`-joined one, except `ngx.<variable>`, whose name may hold dots.
pub fn joined(path: &[u8]) -> Cow<'_, [u8]> {
    if !path.contains(&0) && path.contains(&b'.') && !path.starts_with(b"ngx.") {
        Cow::Owned(
            path.iter()
                .map(|b| if *b == b'.' { 0 } else { *b })
                .collect(),
        )
    } else {
        Cow::Borrowed(path)
    }
}

/// The attribute a `\0`-joined path (see [`joined`]) names; `None` for any other path.
pub fn parse(path: &[u8]) -> Option<Attribute<'_>> {
    Some(match path {
        b"request\0path" => Attribute::RequestPath,
        b"request\0url_path" => Attribute::RequestUrlPath,
        b"request\0query" => Attribute::RequestQuery,
        b"request\0host" => Attribute::RequestHost,
        b"request\0method" => Attribute::RequestMethod,
        b"request\0scheme" => Attribute::RequestScheme,
        b"request\0protocol" => Attribute::RequestProtocol,
        b"request\0id" => Attribute::RequestId,
        b"request\0time" => Attribute::RequestTime,
        b"request\0size" => Attribute::RequestSize,
        b"request\0total_size" => Attribute::RequestTotalSize,
        b"request\0useragent" => Attribute::RequestUserAgent,
        b"request\0referer" => Attribute::RequestReferer,
        b"source\0address" => Attribute::SourceAddress,
        b"source\0port" => Attribute::SourcePort,
        b"destination\0address" => Attribute::DestinationAddress,
        b"destination\0port" => Attribute::DestinationPort,
        b"connection\0id" => Attribute::ConnectionId,
        b"connection\0mtls" => Attribute::ConnectionMtls,
        b"response\0code" => Attribute::ResponseCode,
        b"response\0code_details" => Attribute::ResponseCodeDetails,
        b"response\0size" => Attribute::ResponseSize,
        b"response\0total_size" => Attribute::ResponseTotalSize,
        _ => {
            if let Some(name) = path.strip_prefix(b"request\0headers\0") {
                return Some(Attribute::RequestHeader(name));
            }
            let name = path
                .strip_prefix(b"ngx\0")
                .or_else(|| path.strip_prefix(b"ngx."))?;
            Attribute::NgxVariable(name)
        }
    })
}

/// An integer attribute: 8 bytes, little-endian.
pub fn int(v: i64) -> [u8; 8] {
    v.to_le_bytes()
}

/// `request.url_path` of a request target: everything before the first `?`.
pub fn url_path(target: &[u8]) -> &[u8] {
    target.split(|b| *b == b'?').next().unwrap_or_default()
}

/// `request.time` of a request that started at `secs` + `msecs` (nginx's `start_sec` and
/// `start_msec`): nanoseconds since the epoch, saturating.
pub fn time_ns(secs: i64, msecs: i64) -> i64 {
    secs.saturating_mul(1_000_000_000)
        .saturating_add(msecs.saturating_mul(1_000_000))
}

/// `response.size`: bytes sent minus the head's (never negative).
pub fn body_bytes_sent(sent: i64, header_size: i64) -> i64 {
    sent.saturating_sub(header_size).max(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dotted_and_joined_paths_name_the_same_attribute() {
        for (dotted, attr) in [
            (&b"request.path"[..], Attribute::RequestPath),
            (b"request.url_path", Attribute::RequestUrlPath),
            (b"source.port", Attribute::SourcePort),
            (b"response.code_details", Attribute::ResponseCodeDetails),
            (
                b"request.headers.x-tenant",
                Attribute::RequestHeader(b"x-tenant"),
            ),
        ] {
            assert_eq!(parse(&joined(dotted)), Some(attr), "{dotted:?}");
            let raw: Vec<u8> = dotted
                .iter()
                .map(|b| if *b == b'.' { 0 } else { *b })
                .collect();
            assert_eq!(parse(&raw), Some(attr));
        }
    }

    #[test]
    fn nginx_variables_keep_their_dots() {
        assert_eq!(joined(b"ngx.a.b"), Cow::Borrowed(&b"ngx.a.b"[..]));
        assert_eq!(parse(b"ngx.a.b"), Some(Attribute::NgxVariable(b"a.b")));
        assert_eq!(
            parse(b"ngx\0remote_addr"),
            Some(Attribute::NgxVariable(b"remote_addr"))
        );
    }

    #[test]
    fn unknown_and_hostile_paths_name_nothing() {
        for path in [
            &b""[..],
            b".",
            b"request",
            b"request\0",
            b"request\0path\0",
            b"REQUEST\0path",
            b"request\0path\0extra",
            b"tollgate\0jwt_auth\0result",
            b"\0\0\0",
        ] {
            assert_eq!(parse(&joined(path)), None, "{path:?}");
        }
        // A header name taken as it is, even empty or holding separators: the lookup finds
        // no such header.
        assert_eq!(
            parse(b"request\0headers\0"),
            Some(Attribute::RequestHeader(b""))
        );
        assert_eq!(
            parse(&joined(b"request.headers.a.b")),
            Some(Attribute::RequestHeader(b"a\0b"))
        );
    }

    #[test]
    fn encodings() {
        assert_eq!(int(200), [200, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(int(-1), [0xff; 8]);
        assert_eq!(url_path(b"/v1/chat?x=1?y"), b"/v1/chat");
        assert_eq!(url_path(b""), b"");
        assert_eq!(time_ns(1_700_000_000, 250), 1_700_000_000_250_000_000);
        assert_eq!(time_ns(i64::MAX, 999), i64::MAX);
        assert_eq!(body_bytes_sent(1000, 200), 800);
        assert_eq!(body_bytes_sent(100, 200), 0);
    }
}
