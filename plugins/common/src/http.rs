//! HTTP helpers shared by the filters: header value checks (RFC 9110 section 5.5), JSON error
//! bodies, and request-target parsing (RFC 9112 section 3.2).

/// Whether `value` may be sent as a field value: no control characters other than HTAB
/// (RFC 9110 section 5.5 forbids CR, LF and NUL; we refuse every CTL and DEL to be safe).
pub fn is_safe_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// A small JSON error body, `{"error":"<error>","message":"<message>"}`, as bytes.
pub fn json_error_body(error: &str, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": error, "message": message });
    body.to_string().into_bytes()
}

/// Splits a request target (`:path`) into its path and its query (without `?`), if any.
pub fn split_path_query(target: &str) -> (&str, Option<&str>) {
    match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    }
}

/// The first value of query parameter `name` in `query` (`a=1&b=2`), percent-decoded.
/// Returns `None` when absent or when the value is not valid UTF-8 after decoding.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            percent_decode(v)
        } else {
            None
        }
    })
}

/// Percent-decodes `s` (RFC 3986 section 2.1; `+` stays `+`). `None` on a bad escape or bad UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0usize;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = bytes
                .get(i.checked_add(1)?)
                .and_then(|c| (*c as char).to_digit(16))?;
            let lo = bytes
                .get(i.checked_add(2)?)
                .and_then(|c| (*c as char).to_digit(16))?;
            out.push(u8::try_from(hi.checked_mul(16)?.checked_add(lo)?).ok()?);
            i = i.checked_add(3)?;
        } else {
            out.push(b);
            i = i.checked_add(1)?;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values() {
        assert!(is_safe_header_value("alice\tsmith"));
        assert!(!is_safe_header_value("a\r\nx-admin: 1"));
        assert!(!is_safe_header_value("a\0"));
        assert!(!is_safe_header_value("a\x7f"));
    }

    #[test]
    fn query_params() {
        let (path, query) = split_path_query("/api/x?a=1&access_token=ab%2Ec&z");
        assert_eq!(path, "/api/x");
        let query = query.unwrap();
        assert_eq!(query_param(query, "access_token").as_deref(), Some("ab.c"));
        assert_eq!(query_param(query, "z").as_deref(), Some(""));
        assert_eq!(query_param(query, "missing"), None);
        assert_eq!(query_param("t=%zz", "t"), None);
        assert_eq!(query_param("t=%4", "t"), None);
        assert_eq!(split_path_query("/p"), ("/p", None));
    }

    #[test]
    fn error_body_is_json() {
        let body = json_error_body("invalid_token", "the \"token\" expired");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"], "invalid_token");
        assert_eq!(v["message"], "the \"token\" expired");
    }
}
