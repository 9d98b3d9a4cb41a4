//! HTTP helpers shared by the filters: header value checks (RFC 9110 section 5.5) and
//! request-target parsing (RFC 9112 section 3.2). Refusal bodies: `crate::error_envelope`.

/// Whether `value` may be sent as a field value: no control characters other than HTAB
/// (RFC 9110 section 5.5 forbids CR, LF and NUL; we refuse every CTL and DEL to be safe).
pub fn is_safe_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// A header name folded as upstreams that read names the CGI way see it: RFC 3875 section
/// 4.1.18 makes a field `HTTP_` and its name upper-cased with `-` as `_` (Python's WSGI servers,
/// wsgiref included, and PHP do so), and PHP also reads `.` as `_` in `$_SERVER` keys. Folded
/// here to lower case with `_` and `.` as `-`: names with one fold are one header to such an
/// upstream, which joins their values (wsgiref: `admin,bob`) or keeps one of them.
pub fn cgi_fold(name: &[u8]) -> Vec<u8> {
    name.iter().map(|&b| cgi_fold_byte(b)).collect()
}

fn cgi_fold_byte(b: u8) -> u8 {
    match b {
        b'_' | b'.' => b'-',
        _ => b.to_ascii_lowercase(),
    }
}

/// Whether a CGI-style upstream reads header `name` as the header whose [`cgi_fold`] is `folded`
/// (any spelling: ASCII case, `_` or `.` for `-`), without allocating the fold of `name`.
pub fn reads_as(name: &[u8], folded: &[u8]) -> bool {
    name.len() == folded.len()
        && name
            .iter()
            .zip(folded)
            .all(|(&a, &b)| cgi_fold_byte(a) == b)
}

/// Whether `name` is a spelling of the header whose [`cgi_fold`] is `folded` that differs from it
/// by more than ASCII case (an `_` or `.` for a `-`): a name a proxy's removal of `folded`
/// leaves in place, yet a CGI-style upstream reads as that header.
pub fn is_cgi_alias(name: &[u8], folded: &[u8]) -> bool {
    name.iter().any(|&b| b == b'_' || b == b'.') && reads_as(name, folded)
}

/// The property through which a host says that no client's request header name has a spelling
/// [`is_cgi_alias`] could match: `1` when the proxy drops every name that is not letters, digits
/// and `-` only, so a filter that removes a header need not list a request's names to find its
/// other spellings. A property of the configuration, the same in every context (a filter reads
/// it once, in `on_configure`). Tollgate's nginx module answers it, `1` when every `server {}`
/// keeps `underscores_in_headers off` and `ignore_invalid_headers on` (nginx-compat/README.md,
/// properties); Envoy and Kong's module do not, and a filter then lists the names itself
/// ([`names_are_plain`]).
pub const PLAIN_HEADER_NAMES_PROPERTY: [&str; 3] = ["tollgate", "http", "plain_header_names"];

/// Whether a host's answer to [`PLAIN_HEADER_NAMES_PROPERTY`] vouches that no name needs a look:
/// only an explicit `1`; no answer, or any other, means the names must be listed.
pub fn names_are_plain(answer: Option<&[u8]>) -> bool {
    answer == Some(b"1")
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
    crate::bytes::utf8_owned(out).ok()
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
    fn only_an_explicit_one_vouches_for_plain_names() {
        assert!(names_are_plain(Some(b"1")));
        for answer in [None, Some(&b"0"[..]), Some(b""), Some(b"1 "), Some(b"true")] {
            assert!(!names_are_plain(answer), "{answer:?}");
        }
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
    fn cgi_aliases() {
        let sub = cgi_fold(b"X-Jwt-Sub");
        assert_eq!(sub, b"x-jwt-sub");
        for alias in [
            "x_jwt_sub",
            "X_JWT_SUB",
            "x-jwt_sub",
            "x_Jwt-sub",
            "x.jwt.sub",
            "X.jwt_Sub",
        ] {
            assert!(is_cgi_alias(alias.as_bytes(), &sub), "{alias}");
        }
        for other in [
            "x-jwt-sub",
            "X-JWT-SUB",
            "x-jwt-subx",
            "x_jwt_su",
            "xjwtsub",
            "x_jwt=sub",
        ] {
            assert!(!is_cgi_alias(other.as_bytes(), &sub), "{other}");
        }
        // reads_as: every spelling, case included, and nothing else; the same as comparing folds.
        for name in [
            "x_jwt_sub",
            "X-JWT-SUB",
            "x-jwt-sub",
            "x.Jwt_sub",
            "x-jwt-subx",
            "x_jwt=sub",
            "",
        ] {
            let want = cgi_fold(name.as_bytes()) == sub;
            assert_eq!(reads_as(name.as_bytes(), &sub), want, "{name}");
        }
        assert!(reads_as(b"X-JWT-SUB", &sub) && !reads_as(b"x-jwt-subx", &sub));
        // A configured name with an underscore folds the same way.
        assert!(is_cgi_alias(b"x-user.id", &cgi_fold(b"x_user_id")));
    }
}
