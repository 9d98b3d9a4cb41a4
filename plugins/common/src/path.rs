//! The request path the filters' rules match: the `:path` target normalised once, so that a
//! client cannot pick a spelling (`/healthz/../v1`, `//v1`, `/v1/%2e/chat`, `/a%2Fb`) that the
//! rules read one way and the upstream another.
//!
//! [`normalize`] takes a request target (`:path`: origin form `/p?q`, or absolute form
//! `http://host/p?q`, RFC 9112 section 3.2) and returns its path in normal form and its query
//! (untouched: the query is not part of a match). In order:
//!
//! 1. **Characters**: percent-escapes of unreserved characters (ALPHA DIGIT `-` `.` `_` `~`) are
//!    decoded, other escapes are kept with upper-case hex digits (RFC 3986 sections 2.1, 2.3,
//!    6.2.2.1-2). Refused: a malformed escape, NUL (`%00`), raw control characters, raw
//!    non-ASCII bytes, `#` and spaces (not allowed in a request target), escaped non-ASCII that
//!    is not UTF-8 (overlong forms such as `%C0%AE` included). `%2F`, `%5C` and raw `\` follow
//!    [`EscapedSlashes`] (default: refused); `;` and `%3B` follow [`PathParameters`] (default:
//!    refused).
//! 2. **Slashes**: runs of `/` are merged (Envoy's `merge_slashes`, nginx's `merge_slashes on`).
//! 3. **Dot segments**: removed as RFC 3986 section 5.2.4 does (`%2e` counts as `.`, it was
//!    decoded in step 1), except that a `..` above the root is refused instead of dropped.
//!
//! Slashes are merged before dot segments are removed, as nginx does while it parses the
//! request line (`/a//../b` is `/b`), so that the rules see what nginx proxies; Envoy's
//! `normalize_path` + `merge_slashes` run before the filters, and the result is already normal.
//!
//! The function is idempotent (`normalize(normalize(p)) == normalize(p)`, fuzzed in
//! `fuzz/fuzz_targets/path_normalize.rs`) and linear in the target's length.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;

/// What to do with an escaped slash or backslash (`%2F`, `%5C`) and a raw backslash in a path,
/// after Envoy's `path_with_escaped_slashes_action` (HttpConnectionManager).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Refuse the request with 400 (Envoy's `REJECT_REQUEST`). Default.
    #[default]
    Reject,
    /// Keep them escaped (`%2F`, `%5C`; a raw `\` becomes `%5C`): they are part of a segment,
    /// never a separator (Envoy's `KEEP_UNCHANGED`). Only safe when the upstream does not
    /// decode them either (nginx decodes `%2F` into `/`).
    Keep,
    /// Decode them into `/` (a backslash too, as Envoy's `normalize_path` treats it), then
    /// normalise (Envoy's `UNESCAPE_AND_FORWARD`).
    Unescape,
}

/// What to do with `;` (RFC 3986 section 3.3 path parameters) in a path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathParameters {
    /// Refuse the request with 400. Default: Java servlet containers (Tomcat, Jetty) and Spring
    /// drop `;params` from each segment before routing, so `/public/..;/admin` is `/admin`
    /// there while it is a `..;` segment under `/public` to the rules.
    #[default]
    Reject,
    /// `;` is an ordinary character of its segment (for upstreams that do not strip parameters).
    Keep,
}

/// How a filter normalises the paths its rules match (the `paths` object of its plugin
/// configuration): `{"escaped_slashes": "reject", "path_parameters": "reject"}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathPolicy {
    /// `%2F`, `%5C`, `\`.
    #[serde(default)]
    pub escaped_slashes: EscapedSlashes,
    /// `;`, `%3B`.
    #[serde(default)]
    pub path_parameters: PathParameters,
}

/// Why a request target was refused (each is a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Neither origin form (`/...`) nor absolute form (`http(s)://host/...`), e.g. `*` or empty.
    NotOriginForm,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%00`.
    Nul,
    /// A raw control character, non-ASCII byte, space or `#`.
    BadCharacter,
    /// Escaped non-ASCII bytes that are not UTF-8 (including overlong forms).
    BadUtf8,
    /// `%2F`, `%5C` or `\` under [`EscapedSlashes::Reject`].
    EscapedSlash,
    /// `;` or `%3B` under [`PathParameters::Reject`].
    PathParameter,
    /// A `..` segment above the root.
    AboveRoot,
}

impl PathError {
    /// A short description for logs and the 400's JSON body.
    pub fn description(self) -> &'static str {
        match self {
            PathError::NotOriginForm => "the request target is not a path",
            PathError::BadEscape => "the path has a malformed percent-escape",
            PathError::Nul => "the path contains an encoded NUL",
            PathError::BadCharacter => {
                "the path contains a control character, a space, `#` or a raw non-ASCII byte"
            }
            PathError::BadUtf8 => "the path's percent-escapes are not UTF-8",
            PathError::EscapedSlash => "the path contains an encoded slash or a backslash",
            PathError::PathParameter => "the path contains `;` (path parameters are refused)",
            PathError::AboveRoot => "the path climbs above the root",
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// A request target split into its normal path and its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    /// The path in normal form: starts with `/`, printable ASCII.
    pub path: Cow<'a, str>,
    /// The query without `?`, as received.
    pub query: Option<&'a str>,
    /// Whether `path` differs from the target's path as received (then the filter rewrites
    /// `:path`, see [`RequestPath::target`]).
    pub changed: bool,
}

impl RequestPath<'_> {
    /// The request target to forward: the normal path and the query as received.
    pub fn target(&self) -> String {
        match self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.to_string(),
        }
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// A raw byte that may appear in a normal path as is: printable ASCII other than space, `#`,
/// `%` (escapes are rewritten), `\` and `;` (policies).
fn is_plain(b: u8) -> bool {
    b > 0x20 && b < 0x7f && !matches!(b, b'#' | b'%' | b'\\' | b';')
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut Vec<u8>, v: u8) {
    out.push(b'%');
    out.push(HEX.get(usize::from(v >> 4)).copied().unwrap_or(b'0'));
    out.push(HEX.get(usize::from(v & 0xf)).copied().unwrap_or(b'0'));
}

/// The path part of a target in absolute form (`http://host/p` is `/p`, `http://host` is
/// `/`); `None` when the target is not in absolute form.
fn strip_absolute_form(target: &[u8]) -> Option<&[u8]> {
    let rest = if target.len() >= 7 && target.get(..7)?.eq_ignore_ascii_case(b"http://") {
        target.get(7..)?
    } else if target.len() >= 8 && target.get(..8)?.eq_ignore_ascii_case(b"https://") {
        target.get(8..)?
    } else {
        return None;
    };
    match rest.iter().position(|&b| b == b'/') {
        Some(i) => rest.get(i..),
        None => Some(b"/"),
    }
}

/// Byte classes of the fast path: what a normal path may hold as is, and what ends it.
const PLAIN: u8 = 0;
const SLASH: u8 = 1;
const DOT: u8 = 2;
const SEMICOLON: u8 = 3;
const QUERY: u8 = 4;
/// Everything else (`%`, `\`, `#`, space, controls, non-ASCII): the slow path decides.
const OTHER: u8 = 5;

fn class(b: u8) -> u8 {
    match b {
        b'/' => SLASH,
        b'.' => DOT,
        b';' => SEMICOLON,
        b'?' => QUERY,
        b'#' | b'%' | b'\\' => OTHER,
        0x21..=0x7e => PLAIN,
        _ => OTHER,
    }
}

/// Whether the segment that starts at `rest` (just after a `/`) is `.` or `..`.
fn dot_segment(rest: &[u8]) -> bool {
    let ends = |b: Option<&u8>| b.is_none_or(|&b| b == b'/' || b == b'?');
    match rest {
        [b'.', b'.', after @ ..] => ends(after.first()),
        [b'.', after @ ..] => ends(after.first()),
        _ => false,
    }
}

/// The length of the path of an origin-form `target` when that path is already normal under
/// `policy` (plain bytes only, no empty, `.` or `..` segment; a trailing `/` is fine), else
/// `None`. One pass with a byte-class table, no allocation: the common case costs a few
/// instructions per byte.
fn normal_path_len(target: &[u8], policy: &PathPolicy) -> Option<usize> {
    let params_ok = policy.path_parameters == PathParameters::Keep;
    let mut after_slash = true;
    let body = target.get(1..).unwrap_or_default();
    for (i, &b) in body.iter().enumerate() {
        match class(b) {
            PLAIN => after_slash = false,
            SEMICOLON if params_ok => after_slash = false,
            SLASH if after_slash => return None, // `//`
            SLASH => after_slash = true,
            DOT if after_slash && dot_segment(body.get(i..).unwrap_or_default()) => return None,
            DOT => after_slash = false,
            QUERY => return Some(i.saturating_add(1)),
            _ => return None,
        }
    }
    Some(target.len())
}

/// Step 1: decodes and checks characters. Separators are `/` in the output; everything a
/// policy keeps escaped stays `%XX`, so it can never act as a separator or a dot.
fn decode(path: &[u8], policy: &PathPolicy) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(path.len());
    // Escaped non-ASCII bytes of the current run, checked as UTF-8 when the run ends.
    let mut utf8_run: Vec<u8> = Vec::new();
    let end_run = |run: &mut Vec<u8>| -> Result<(), PathError> {
        if !run.is_empty() {
            crate::bytes::utf8(run).map_err(|_| PathError::BadUtf8)?;
            run.clear();
        }
        Ok(())
    };
    let slash = |out: &mut Vec<u8>, escaped: u8| -> Result<(), PathError> {
        match policy.escaped_slashes {
            EscapedSlashes::Reject => Err(PathError::EscapedSlash),
            EscapedSlashes::Keep => {
                push_escaped(out, escaped);
                Ok(())
            }
            EscapedSlashes::Unescape => {
                out.push(b'/');
                Ok(())
            }
        }
    };
    let mut i = 0usize;
    while let Some(&b) = path.get(i) {
        i = i.saturating_add(1);
        if b != b'%' {
            end_run(&mut utf8_run)?;
            match b {
                b'\\' => slash(&mut out, b'\\')?,
                b';' if policy.path_parameters == PathParameters::Reject => {
                    return Err(PathError::PathParameter)
                }
                b';' | b'/' => out.push(b),
                _ if is_plain(b) => out.push(b),
                _ => return Err(PathError::BadCharacter),
            }
            continue;
        }
        let hi = path.get(i).copied().and_then(hex_value);
        let lo = path.get(i.saturating_add(1)).copied().and_then(hex_value);
        let (Some(hi), Some(lo)) = (hi, lo) else {
            return Err(PathError::BadEscape);
        };
        i = i.saturating_add(2);
        let v = (hi << 4) | lo;
        if v >= 0x80 {
            utf8_run.push(v);
            push_escaped(&mut out, v);
            continue;
        }
        end_run(&mut utf8_run)?;
        match v {
            0 => return Err(PathError::Nul),
            b'/' | b'\\' => slash(&mut out, v)?,
            b';' if policy.path_parameters == PathParameters::Reject => {
                return Err(PathError::PathParameter)
            }
            _ if is_unreserved(v) => out.push(v),
            _ => push_escaped(&mut out, v),
        }
    }
    end_run(&mut utf8_run)?;
    Ok(out)
}

/// Steps 2 and 3 on the output of [`decode`] (starts with `/`): merges slashes and removes dot
/// segments, refusing a `..` above the root.
fn resolve(decoded: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    let mut trailing_slash = false;
    let body = decoded.get(1..).unwrap_or_default();
    let count = body.split(|&b| b == b'/').count();
    for (n, seg) in body.split(|&b| b == b'/').enumerate() {
        let last = n.saturating_add(1) == count;
        match seg {
            b"" | b"." => trailing_slash = last,
            b".." => {
                if out.is_empty() {
                    return Err(PathError::AboveRoot);
                }
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
                trailing_slash = last;
            }
            _ => {
                out.push(b'/');
                out.extend_from_slice(seg);
                trailing_slash = false;
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    Ok(out)
}

/// Normalises a request target's path (see the module documentation) and splits off its query.
///
/// Errors: the [`PathError`] that makes the target unacceptable (the filter answers 400).
pub fn normalize<'a>(target: &'a [u8], policy: &PathPolicy) -> Result<RequestPath<'a>, PathError> {
    let query_text = |q: Option<&'a [u8]>| match q {
        // The query is forwarded as received; it only has to be text to be carried along.
        Some(q) => crate::bytes::utf8(q)
            .map(Some)
            .map_err(|_| PathError::BadCharacter),
        None => Ok(None),
    };
    if target.first() == Some(&b'/') {
        if let Some(end) = normal_path_len(target, policy) {
            // Plain bytes are ASCII: the conversion cannot fail.
            let path = crate::bytes::utf8(target.get(..end).unwrap_or_default())
                .map_err(|_| PathError::BadCharacter)?;
            return Ok(RequestPath {
                path: Cow::Borrowed(path),
                query: query_text(target.get(end.saturating_add(1)..))?,
                changed: false,
            });
        }
    }
    let (raw_path, query) = match target.iter().position(|&b| b == b'?') {
        Some(q) => (
            target.get(..q).unwrap_or_default(),
            target.get(q.saturating_add(1)..),
        ),
        None => (target, None),
    };
    let query = query_text(query)?;
    let (path, absolute) = match raw_path.first() {
        Some(b'/') => (raw_path, false),
        _ => (
            strip_absolute_form(raw_path).ok_or(PathError::NotOriginForm)?,
            true,
        ),
    };
    let normal = resolve(&decode(path, policy)?)?;
    let normal = crate::bytes::utf8_owned(normal).map_err(|_| PathError::BadCharacter)?;
    let changed = absolute || normal.as_bytes() != path;
    Ok(RequestPath {
        path: Cow::Owned(normal),
        query,
        changed,
    })
}

/// Whether `path` is a configured path in normal form under `policy` (rules' prefixes and
/// exact paths must be, or they could never match a normalised request).
pub fn is_normal(path: &str, policy: &PathPolicy) -> bool {
    !path.contains('?')
        && normalize(path.as_bytes(), policy).is_ok_and(|p| !p.changed && p.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(target: &str) -> Result<String, PathError> {
        normalize(target.as_bytes(), &PathPolicy::default()).map(|p| p.target())
    }

    const KEEP: PathPolicy = PathPolicy {
        escaped_slashes: EscapedSlashes::Keep,
        path_parameters: PathParameters::Keep,
    };
    const UNESCAPE: PathPolicy = PathPolicy {
        escaped_slashes: EscapedSlashes::Unescape,
        path_parameters: PathParameters::Reject,
    };

    /// The tricky paths of issue 17, with the expected normal form (or refusal) under the
    /// default policy. tests/e2e/test_paths.py sends the same table through every host.
    const TABLE: &[(&str, Result<&str, PathError>)] = &[
        ("/v1/chat/completions", Ok("/v1/chat/completions")),
        (
            "/healthz/../v1/chat/completions",
            Ok("/v1/chat/completions"),
        ),
        ("/v1/./chat/completions", Ok("/v1/chat/completions")),
        ("//v1/chat/completions", Ok("/v1/chat/completions")),
        ("/v1//chat///completions", Ok("/v1/chat/completions")),
        ("/healthz/%2e%2e/v1/chat", Ok("/v1/chat")),
        ("/healthz/%2E./v1/chat", Ok("/v1/chat")),
        ("/healthz/.%2e/v1/chat", Ok("/v1/chat")),
        ("/v1/%2e/chat", Ok("/v1/chat")),
        ("/v1/ch%61t?x=%2F", Ok("/v1/chat?x=%2F")),
        ("/v1/chat%7e", Ok("/v1/chat~")),
        ("/v1/a%3fb", Ok("/v1/a%3Fb")),
        ("/v1/a%20b", Ok("/v1/a%20b")),
        ("/a/b/..", Ok("/a/")),
        ("/a/b/.", Ok("/a/b/")),
        ("/a/b/../", Ok("/a/")),
        ("/a//../b", Ok("/b")),
        ("/.", Ok("/")),
        ("/", Ok("/")),
        ("/healthz?probe=1", Ok("/healthz?probe=1")),
        ("/healthz/..?x", Ok("/?x")),
        ("http://api.example.com/healthz/../v1", Ok("/v1")),
        ("HTTPS://h", Ok("/")),
        ("/caf%C3%A9", Ok("/caf%C3%A9")),
        ("/caf%c3%a9", Ok("/caf%C3%A9")),
        ("/..", Err(PathError::AboveRoot)),
        ("/v1/../../etc/passwd", Err(PathError::AboveRoot)),
        ("/%2e%2e/x", Err(PathError::AboveRoot)),
        ("/healthz%2F..%2Fv1", Err(PathError::EscapedSlash)),
        ("/v1%2fchat", Err(PathError::EscapedSlash)),
        ("/v1%5Cchat", Err(PathError::EscapedSlash)),
        ("/healthz\\..\\v1", Err(PathError::EscapedSlash)),
        ("/v1/chat%00", Err(PathError::Nul)),
        ("/healthz;/../v1", Err(PathError::PathParameter)),
        ("/public/..;/admin", Err(PathError::PathParameter)),
        ("/admin%3Bx/secret", Err(PathError::PathParameter)),
        ("/%c0%ae%c0%ae/v1", Err(PathError::BadUtf8)),
        ("/%e0%80%af", Err(PathError::BadUtf8)),
        ("/%C3", Err(PathError::BadUtf8)),
        ("/%C3/%A9", Err(PathError::BadUtf8)),
        ("/%zz", Err(PathError::BadEscape)),
        ("/%4", Err(PathError::BadEscape)),
        ("/a b", Err(PathError::BadCharacter)),
        ("/a#b", Err(PathError::BadCharacter)),
        ("/a\u{7f}", Err(PathError::BadCharacter)),
        ("/caf\u{e9}", Err(PathError::BadCharacter)),
        ("*", Err(PathError::NotOriginForm)),
        ("", Err(PathError::NotOriginForm)),
        ("v1/chat", Err(PathError::NotOriginForm)),
    ];

    #[test]
    fn the_tricky_paths_table() {
        for (target, want) in TABLE {
            let got = norm(target);
            assert_eq!(got.as_deref().map_err(|e| *e), *want, "{target:?}");
            if let Ok(normal) = &got {
                assert_eq!(norm(normal).as_deref(), Ok(normal.as_str()), "idempotent");
            }
        }
    }

    #[test]
    fn raw_overlong_utf8_and_other_bytes_are_refused() {
        let policy = PathPolicy::default();
        for raw in [
            &b"/\xc0\xae\xc0\xae/v1"[..],
            b"/a\x00b",
            b"/a\rb",
            b"/a\xffb",
        ] {
            assert_eq!(
                normalize(raw, &policy).unwrap_err(),
                PathError::BadCharacter,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn changed_only_when_the_path_differs() {
        let policy = PathPolicy::default();
        let p = normalize(b"/v1/chat?x=1", &policy).unwrap();
        assert!(!p.changed && matches!(p.path, Cow::Borrowed(_)));
        assert_eq!(p.query, Some("x=1"));
        let p = normalize(b"/v1/%43hat", &policy).unwrap();
        assert!(p.changed);
        assert_eq!(p.path, "/v1/Chat");
        let p = normalize(b"/v1/a%3f", &policy).unwrap();
        assert!(p.changed, "upper-cased hex is a change");
        let p = normalize(b"/v1/a%3F", &policy).unwrap();
        assert!(!p.changed);
        assert_eq!(p.path, "/v1/a%3F");
    }

    #[test]
    fn policies() {
        let n = |t: &str, p: &PathPolicy| normalize(t.as_bytes(), p).map(|r| r.target());
        assert_eq!(n("/a%2fb/../c", &KEEP).as_deref(), Ok("/c"));
        assert_eq!(n("/a%2fb/c", &KEEP).as_deref(), Ok("/a%2Fb/c"));
        assert_eq!(n("/a\\b", &KEEP).as_deref(), Ok("/a%5Cb"));
        assert_eq!(n("/a;v=1/b", &KEEP).as_deref(), Ok("/a;v=1/b"));
        assert_eq!(n("/a%3bv/b", &KEEP).as_deref(), Ok("/a%3Bv/b"));
        assert_eq!(n("/healthz%2F..%2Fv1", &UNESCAPE).as_deref(), Ok("/v1"));
        assert_eq!(n("/healthz\\..\\v1", &UNESCAPE).as_deref(), Ok("/v1"));
        assert_eq!(n("/a%5c%5cb", &UNESCAPE).as_deref(), Ok("/a/b"));
        assert_eq!(n("/a;b", &UNESCAPE), Err(PathError::PathParameter));
        assert_eq!(n("/%2e%2e%2f", &UNESCAPE), Err(PathError::AboveRoot));
    }

    #[test]
    fn a_64_kib_path_is_linear_and_bounded() {
        let mut long = String::from("/");
        while long.len() < 64 * 1024 {
            long.push_str("a/./b/../");
        }
        let p = normalize(long.as_bytes(), &PathPolicy::default()).unwrap();
        assert!(p.path.starts_with("/a/a/a/"));
        assert!(p.path.len() < long.len());
        let deep = "/..".repeat(22_000);
        assert_eq!(
            normalize(deep.as_bytes(), &PathPolicy::default()).unwrap_err(),
            PathError::AboveRoot
        );
        let plain = format!("/{}", "x".repeat(65_536));
        let p = normalize(plain.as_bytes(), &PathPolicy::default()).unwrap();
        assert!(!p.changed && p.path.len() == 65_537);
    }

    #[test]
    fn configured_paths_must_be_normal() {
        let policy = PathPolicy::default();
        assert!(is_normal("/v1/chat", &policy));
        assert!(is_normal("/v1/", &policy));
        assert!(is_normal("/", &policy));
        for bad in [
            "/v1/../x", "//v1", "/v1/%61", "/v1?x", "v1", "/a;b", "/a%2Fb",
        ] {
            assert!(!is_normal(bad, &policy), "{bad}");
        }
        assert!(is_normal("/a;b", &KEEP));
    }
}
