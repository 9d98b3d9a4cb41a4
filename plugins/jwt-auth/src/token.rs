//! Where a request carries its token: a header with an optional prefix (default
//! `Authorization: Bearer`, RFC 6750 section 2.1), a query parameter (RFC 6750 section 2.3) or
//! a cookie (RFC 6265 section 4.2, parsed by the `cookie` crate).

use tollgate_common::http::query_param;

/// One place to look for a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenLocation {
    /// Header `name` (lower case); the value must start with `prefix`, compared
    /// case-insensitively (auth schemes are case-insensitive, RFC 9110 section 11.1).
    Header {
        /// Header name.
        name: String,
        /// Value prefix, e.g. `Bearer `; may be empty.
        prefix: String,
    },
    /// Query parameter.
    Param(String),
    /// Cookie.
    Cookie(String),
}

/// A token found in a request, and where (one of the configured locations, borrowed: nothing
/// is copied per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundToken<'l> {
    /// The compact JWS.
    pub token: String,
    /// Where it was.
    pub location: &'l TokenLocation,
}

/// Looks in `locations`, in order, for a token. `header` returns a request header's value;
/// `query` is the request's query string, if any.
pub fn extract<'l>(
    locations: &'l [TokenLocation],
    mut header: impl FnMut(&str) -> Option<String>,
    query: Option<&str>,
) -> Option<FoundToken<'l>> {
    let mut cookie_header: Option<Option<String>> = None;
    for location in locations {
        let token = match location {
            TokenLocation::Header { name, prefix } => {
                header(name).and_then(|v| strip_prefix_ci(v, prefix))
            }
            TokenLocation::Param(name) => query.and_then(|q| query_param(q, name)),
            TokenLocation::Cookie(name) => {
                let cookies = cookie_header.get_or_insert_with(|| header("cookie"));
                cookies.as_deref().and_then(|c| cookie_value(c, name))
            }
        };
        if let Some(token) = token.filter(|t| !t.is_empty()) {
            return Some(FoundToken { token, location });
        }
    }
    None
}

/// `value` after `prefix` (compared case-insensitively), trimmed (`str::trim`), in `value`'s own
/// buffer: the header's copy is the token's, no second allocation.
fn strip_prefix_ci(mut value: String, prefix: &str) -> Option<String> {
    let head = value.get(..prefix.len())?;
    if !head.eq_ignore_ascii_case(prefix) {
        return None;
    }
    let rest = value.get(prefix.len()..)?;
    let token = rest.trim();
    // Where the trimmed token starts and ends in `value` (both on character boundaries).
    let start = prefix
        .len()
        .checked_add(rest.len().checked_sub(rest.trim_start().len())?)?;
    let end = start.checked_add(token.len())?;
    value.truncate(end);
    value.replace_range(..start, "");
    Some(value)
}

/// The value of cookie `name` in a `Cookie` header (RFC 6265 section 4.2; quotes removed).
pub fn cookie_value(header: &str, name: &str) -> Option<String> {
    cookie::Cookie::split_parse(header)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value_trimmed().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        move |n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        }
    }

    fn bearer() -> TokenLocation {
        TokenLocation::Header {
            name: "authorization".into(),
            prefix: "Bearer ".into(),
        }
    }

    #[test]
    fn bearer_header_case_insensitive_scheme() {
        let locations = [bearer()];
        let found = extract(
            &locations,
            headers(&[("authorization", "bearer abc.def.ghi")]),
            None,
        )
        .unwrap();
        assert_eq!(found.token, "abc.def.ghi");
        assert!(extract(
            &[bearer()],
            headers(&[("authorization", "Basic abc")]),
            None
        )
        .is_none());
        assert!(extract(&[bearer()], headers(&[("authorization", "Bearer ")]), None).is_none());
        assert!(extract(&[bearer()], headers(&[("authorization", "Bear")]), None).is_none());
    }

    #[test]
    fn param_and_cookie_in_order() {
        let locs = vec![
            bearer(),
            TokenLocation::Param("access_token".into()),
            TokenLocation::Cookie("jwt".into()),
        ];
        let f = extract(&locs, headers(&[]), Some("x=1&access_token=a.b.c")).unwrap();
        assert_eq!((f.token.as_str(), f.location), ("a.b.c", &locs[1]));
        let f = extract(
            &locs,
            headers(&[("cookie", "a=1; jwt=\"x.y.z\";  other=2")]),
            None,
        )
        .unwrap();
        assert_eq!((f.token.as_str(), f.location), ("x.y.z", &locs[2]));
        assert!(extract(&locs, headers(&[("cookie", ";;=;jwt")]), None).is_none());
    }

    #[test]
    fn prefix_stripped_as_slicing_and_trimming_would() {
        // The in-place strip against the plain definition: the rest after the prefix, trimmed
        // (Unicode whitespace included), for values around every prefix and whitespace shape.
        let reference = |value: &str, prefix: &str| {
            let head = value.get(..prefix.len())?;
            head.eq_ignore_ascii_case(prefix)
                .then(|| value.get(prefix.len()..).map(|t| t.trim().to_string()))?
        };
        let spaces = ["", " ", "\t", "  \t ", "\u{a0}", "\u{2003} ", "\u{3000}"];
        let bodies = ["", "a", "a.b.c", "é.ü", "a b", "\u{a0}x\u{a0}y"];
        for prefix in ["", "Bearer ", "bearer ", "Bearer", "é"] {
            for head in [
                "", "Bearer ", "BEARER ", "Bearer", "Bear", "é", "éé", "Basic ",
            ] {
                for lead in spaces {
                    for body in bodies {
                        for trail in spaces {
                            let value = format!("{head}{lead}{body}{trail}");
                            assert_eq!(
                                strip_prefix_ci(value.clone(), prefix),
                                reference(&value, prefix),
                                "{value:?} after {prefix:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
