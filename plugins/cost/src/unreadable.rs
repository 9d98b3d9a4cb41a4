//! Request bodies the filter cannot read, and the rules that decide it.
//!
//! The filter prices and refuses requests from what it reads in their bodies (`request`): the
//! model, the stream flags. An upstream that reads a body the filter could not read, or reads
//! other members than the filter did, is served a request the filter never judged. Lenient
//! readers are common: Go's `encoding/json` replaces invalid UTF-8 with U+FFFD, matches member
//! names to fields without regard to case (Unicode simple folding, `bytes.EqualFold`) and, with
//! a `json.Decoder`, reads the first value and ignores what follows; Python's `json.loads` on
//! bytes accepts UTF-8 with a byte order mark, UTF-16 and UTF-32 (`json.detect_encoding`), lone
//! surrogate escapes, `NaN` and `Infinity`; aiohttp decodes a request body with the `charset`
//! of its `content-type` and decompresses a `content-encoding`; RapidJSON's `FindMember` and
//! simdjson's `find_field` return the first of two members of one name, where `serde_json`,
//! Python and Go keep the last. So for a tenant that must be read (`filter`: it has a budget,
//! or `unknown_model` refuses every tenant) a body is read only when every reader agrees on it,
//! and is refused otherwise ([`Unreadable`]):
//! - `content-encoding`: absent, empty or `identity` (RFC 9110 section 8.4.1); any other coding
//!   is refused with 415 (section 15.5.16) and `accept-encoding: identity` (section 12.5.3).
//! - `content-type`: absent, or JSON (`application/json`, or a `+json` structured suffix,
//!   RFC 6839 section 3.1) whose `charset` parameter, if given, is `utf-8` (RFC 8259 section
//!   8.1: JSON exchanged between systems is UTF-8); anything else (forms, multipart, text, other
//!   charsets) is refused with 415.
//! - the body: one JSON object in UTF-8 (RFC 8259), as `serde_json` reads it: no byte order
//!   mark, no invalid UTF-8, no other encoding, nothing after the object, no `NaN`; refused
//!   with 400 otherwise. (Nesting is no reason: `serde_json` skips the members the filter does
//!   not read without a depth limit, `Deserializer::ignore_value`, and reads the same members
//!   as Python and Go in a body they refuse for its depth.)
//! - the members the filter reads (`model`, `stream`, `stream_options` and, inside it,
//!   `include_usage`): each at most once, and no other member whose name is a spelling of one
//!   of them ([`spells`]: case, the non-ASCII characters whose case mappings are ASCII letters,
//!   anything from a NUL on); refused with 400 otherwise.
//! - their types, as the APIs define them (OpenAI's and Anthropic's API references): `model` a
//!   string, `stream` a boolean or null, `stream_options` an object or null, `include_usage` a
//!   boolean or null; refused with 400 otherwise (a lenient server coerces `"stream": 1` to
//!   true, pydantic's lax mode does).
//!
//! Escaped names (`"mod\u0065l"`) are read as their decoded text, as every reader decodes them
//! (RFC 8259 section 7); lone surrogate escapes in values the filter does not decode are read as
//! the other readers read them (skipped), and refused where the filter must decode them (names,
//! `model`).

/// Why a request body cannot be read (`tollgate_cost_unreadable_bodies_total.reason.<label>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// A `content-encoding` other than identity.
    ContentEncoding,
    /// A `content-type` that is not JSON in UTF-8.
    ContentType,
    /// Not one JSON object in UTF-8 as `serde_json` reads it.
    Json,
    /// A member the filter reads given twice, or under another spelling.
    AmbiguousName,
    /// A member the filter reads with a type the API does not define.
    MemberType,
    /// The host did not give the body's bytes.
    Host,
}

impl Unreadable {
    /// Every reason (for defining the counters).
    pub const ALL: [Unreadable; 6] = [
        Unreadable::ContentEncoding,
        Unreadable::ContentType,
        Unreadable::Json,
        Unreadable::AmbiguousName,
        Unreadable::MemberType,
        Unreadable::Host,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Unreadable::ContentEncoding => "content_encoding",
            Unreadable::ContentType => "content_type",
            Unreadable::Json => "json",
            Unreadable::AmbiguousName => "ambiguous_name",
            Unreadable::MemberType => "member_type",
            Unreadable::Host => "host",
        }
    }

    /// The status of the refusal: 415 for the content's coding or media type (RFC 9110 section
    /// 15.5.16), 500 when the host failed, 400 for the body itself.
    pub fn status(self) -> u32 {
        match self {
            Unreadable::ContentEncoding | Unreadable::ContentType => 415,
            Unreadable::Host => 500,
            Unreadable::Json | Unreadable::AmbiguousName | Unreadable::MemberType => 400,
        }
    }

    /// The refusal's message (the error code is always `unreadable_body`).
    pub fn message(self) -> &'static str {
        match self {
            Unreadable::ContentEncoding => {
                "the gateway reads request bodies without a content-encoding; send it uncompressed"
            }
            Unreadable::ContentType => {
                "the gateway reads request bodies as JSON in UTF-8: send content-type \
                 application/json (without a charset other than utf-8)"
            }
            Unreadable::Json => {
                "the request body is not one JSON object in UTF-8 (RFC 8259): no byte order mark, \
                 no other encoding, no invalid UTF-8, NaN or data after the object"
            }
            Unreadable::AmbiguousName => {
                "the request body gives model, stream, stream_options or include_usage twice, or \
                 under another spelling (case, Unicode case variants)"
            }
            Unreadable::MemberType => {
                "the request body's model must be a string, stream a boolean, stream_options an \
                 object and include_usage a boolean"
            }
            Unreadable::Host => "the gateway could not read the request body",
        }
    }
}

/// What the request headers say about reading the body: `content-encoding` first, then
/// `content-type` (each the header's value, `None` when absent). `None` when both allow it.
pub fn headers(content_encoding: Option<&[u8]>, content_type: Option<&[u8]>) -> Option<Unreadable> {
    if content_encoding.is_some() && !identity_coding(content_encoding) {
        return Some(Unreadable::ContentEncoding);
    }
    // What the SDKs send, without parsing.
    let plain = content_type
        .is_some_and(|v| v == b"application/json" || v.eq_ignore_ascii_case(b"application/json"));
    if !plain && !json_media_type(content_type) {
        return Some(Unreadable::ContentType);
    }
    None
}

/// Whether a `content-encoding` value leaves the content as it is: absent, empty or `identity`
/// (case-insensitive, RFC 9110 section 8.4.1), optional whitespace around it.
fn identity_coding(value: Option<&[u8]>) -> bool {
    match value.map(<[u8]>::trim_ascii) {
        None | Some(b"") => true,
        Some(v) => v.eq_ignore_ascii_case(b"identity"),
    }
}

/// Whether a `content-type` value is JSON that is read as UTF-8: absent, or
/// `application/json` or `application/<x>+json` (RFC 6839 section 3.1), with parameters per
/// RFC 9110 section 8.3.1 (`;`, token `=` token or quoted-string, optional whitespace around
/// `;`) among which every `charset` is `utf-8` (case-insensitive, section 8.3.2). A value that
/// does not parse so (two values joined with `,`, a stray character) is not.
fn json_media_type(value: Option<&[u8]>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let mut p = Cursor(value.trim_ascii());
    let (Some(kind), true, Some(subtype)) = (p.token(), p.eat(b'/'), p.token()) else {
        return false;
    };
    let suffix = subtype.len() > 5
        && subtype
            .get(subtype.len().saturating_sub(5)..)
            .is_some_and(|s| s.eq_ignore_ascii_case(b"+json"));
    if !kind.eq_ignore_ascii_case(b"application")
        || !(subtype.eq_ignore_ascii_case(b"json") || suffix)
    {
        return false;
    }
    loop {
        p.skip_ows();
        if p.0.is_empty() {
            return true;
        }
        if !p.eat(b';') {
            return false;
        }
        p.skip_ows();
        if p.0.is_empty() {
            return true;
        }
        let (Some(name), true) = (p.token(), p.eat(b'=')) else {
            return false;
        };
        let utf8 = match p.0.first() {
            Some(b'"') => p.quoted_is(b"utf-8"),
            _ => p.token().map(|v| v.eq_ignore_ascii_case(b"utf-8")),
        };
        match utf8 {
            None => return false,
            Some(false) if name.eq_ignore_ascii_case(b"charset") => return false,
            Some(_) => {}
        }
    }
}

/// A position in a header value.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    /// A token (RFC 9110 section 5.6.2), at least one character.
    fn token(&mut self) -> Option<&'a [u8]> {
        let tchar = |c: &&u8| {
            matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'!' | b'#'..=b'\'' | b'*' | b'+'
                | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
        };
        let n = self.0.iter().take_while(tchar).count();
        let (token, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        (!token.is_empty()).then_some(token)
    }

    fn eat(&mut self, c: u8) -> bool {
        match self.0.split_first() {
            Some((&first, rest)) if first == c => {
                self.0 = rest;
                true
            }
            _ => false,
        }
    }

    fn skip_ows(&mut self) {
        while self.eat(b' ') || self.eat(b'\t') {}
    }

    /// A quoted-string (section 5.6.4), the cursor on its opening quote: whether its text
    /// (quoted-pairs unescaped) is `want`, case-insensitive; `None` when it is not one.
    fn quoted_is(&mut self, want: &[u8]) -> Option<bool> {
        if !self.eat(b'"') {
            return None;
        }
        let mut text = Vec::new();
        loop {
            let (&c, rest) = self.0.split_first()?;
            self.0 = rest;
            match c {
                b'"' => return Some(text.eq_ignore_ascii_case(want)),
                b'\\' => {
                    let (&escaped, rest) = self.0.split_first()?;
                    self.0 = rest;
                    text.push(escaped);
                }
                b'\t' | b' '..=b'~' | 0x80..=0xff => text.push(c),
                _ => return None,
            }
        }
    }
}

/// The characters outside ASCII whose case mappings are ASCII letters, each with those letters
/// in lower case: the union of Unicode's simple mappings (Go's `unicode.ToLower`, `ToUpper`,
/// `ToTitle`, `SimpleFold`) and its full mappings and case folding (Python's `str.lower`,
/// `upper`, `title`, `casefold`), over every code point, as listed in
/// `testdata/case_partners.txt` (made by `testdata/case_partners.{py,go}`). Go's
/// `encoding/json` matches `"ſtream"` (U+017F) to a field `stream` through them; .NET's
/// case-insensitive names (`ToUpperInvariant`) match `ı` (U+0131) to `i`.
const CASE_PARTNERS: [(char, &str); 13] = [
    ('\u{00DF}', "ss"),
    ('\u{0130}', "i"),
    ('\u{0131}', "i"),
    ('\u{017F}', "s"),
    ('\u{1E9E}', "ss"),
    ('\u{212A}', "k"),
    ('\u{FB00}', "ff"),
    ('\u{FB01}', "fi"),
    ('\u{FB02}', "fl"),
    ('\u{FB03}', "ffi"),
    ('\u{FB04}', "ffl"),
    ('\u{FB05}', "st"),
    ('\u{FB06}', "st"),
];

/// Whether the member name `name` (decoded) is read as `target` (lower-case ASCII) by some JSON
/// reader: equal once ASCII letters are put in lower case and each of [`CASE_PARTNERS`] is
/// replaced by its letters, up to the first NUL (a reader holding names as C strings ends them
/// there). True for `target` itself.
pub fn spells(name: &str, target: &str) -> bool {
    let (name_bytes, want) = (name.as_bytes(), target.as_bytes());
    if name.is_ascii() {
        // Letters map one to one: the name up to a NUL, of the target's length.
        return match name_bytes.get(want.len()) {
            None | Some(0) => name_bytes
                .get(..want.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(want)),
            Some(_) => false,
        };
    }
    let mut rest = want;
    for c in name.chars() {
        if c == '\0' {
            break;
        }
        let mut ascii = [0u8; 1];
        let letters: &[u8] = if c.is_ascii() {
            c.to_ascii_lowercase().encode_utf8(&mut ascii).as_bytes()
        } else {
            match CASE_PARTNERS.iter().find(|(p, _)| *p == c) {
                Some((_, letters)) => letters.as_bytes(),
                None => return false,
            }
        };
        match rest.strip_prefix(letters) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_codings() {
        for ok in [
            None,
            Some(&b""[..]),
            Some(b"identity"),
            Some(b" IDENTITY\t"),
        ] {
            assert_eq!(headers(ok, None), None, "{ok:?}");
        }
        for bad in [
            &b"gzip"[..],
            b"x-gzip",
            b"deflate",
            b"br",
            b"zstd",
            b"compress",
            b"identity, gzip",
            b"gzip, identity",
            b"identityx",
            b"aes128gcm",
        ] {
            assert_eq!(
                headers(Some(bad), Some(b"application/json")),
                Some(Unreadable::ContentEncoding),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn media_types() {
        for ok in [
            &b"application/json"[..],
            b"Application/JSON",
            b"application/json; charset=utf-8",
            b"application/json;charset=UTF-8",
            b"application/json ; charset=\"utf-8\"",
            b"application/json; charset=\"u\\tf-8\"",
            b"application/json; foo=bar; charset=utf-8",
            b"application/json;",
            b"application/merge-patch+json",
            b"application/vnd.api+json; ext=\"a;b\"",
        ] {
            assert_eq!(
                headers(None, Some(ok)),
                None,
                "{}",
                String::from_utf8_lossy(ok)
            );
        }
        assert_eq!(headers(None, None), None);
        for bad in [
            &b""[..],
            b"text/plain",
            b"text/json",
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
            b"application/jsonx",
            b"application/+json",
            b"application/octet-stream",
            b"application/json; charset=utf-7",
            b"application/json; charset=utf-16",
            b"application/json; charset=\"utf-7\"",
            b"application/json; charset=latin1",
            b"application/json; charset=utf-8; charset=utf-7",
            b"application/json, text/plain",
            b"application/json; charset=utf-8, text/plain",
            b"application/json; charset",
            b"application/json; charset=\"utf-8",
            b"application/json x",
            b"application /json",
            b"*/*",
        ] {
            assert_eq!(
                headers(None, Some(bad)),
                Some(Unreadable::ContentType),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// `testdata/case_partners.txt` lists, per code point, what Python (`lower`, `upper`,
    /// `title`, `casefold`) and Go (`unicode.ToLower`, `ToUpper`, `ToTitle`, `SimpleFold`) map it
    /// to when that is ASCII letters only: the table is their union.
    #[test]
    fn case_partners_are_what_python_and_go_map_to_ascii() {
        let listed = include_str!("../testdata/case_partners.txt");
        let mut from_tools: Vec<(char, String)> = listed
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let mut f = l.split_whitespace();
                let cp = u32::from_str_radix(f.next().unwrap().trim_start_matches("U+"), 16);
                let _tool_and_mapping = f.next().unwrap();
                (
                    char::from_u32(cp.unwrap()).unwrap(),
                    f.next().unwrap().to_string(),
                )
            })
            .collect();
        from_tools.sort();
        from_tools.dedup();
        let table: Vec<(char, String)> = CASE_PARTNERS
            .iter()
            .map(|(c, s)| (*c, s.to_string()))
            .collect();
        assert_eq!(table, from_tools);
    }

    #[test]
    fn spellings_of_a_name() {
        for name in [
            "model",
            "Model",
            "MODEL",
            "mOdEl",
            "model\0",
            "model\0x",
            "MODEL\0\0",
        ] {
            assert!(spells(name, "model"), "{name:?}");
        }
        for name in [
            "stream",
            "ſtream",
            "STREAM",
            "\u{FB06}ream",
            "\u{FB05}REAM",
            "ſTREAM",
        ] {
            assert!(spells(name, "stream"), "{name:?}");
        }
        assert!(spells("ınclude_usage", "include_usage"));
        assert!(spells("İNCLUDE_USAGE", "include_usage"));
        assert!(spells("include_uſage", "include_usage"));
        assert!(spells("\u{212A}", "k"));
        assert!(spells("\u{DF}", "ss") && spells("\u{1E9E}", "ss"));
        for name in [
            "",
            "mode",
            "models",
            "m odel",
            "\0model",
            "modеl", // Cyrillic е: not a case variant
            "ｍodel",
            "mod\u{0065}\u{0301}l",
            "messages",
            "streams",
            "stream_option",
        ] {
            assert!(
                !spells(name, "model") && !spells(name, "stream"),
                "{name:?}"
            );
            assert!(!spells(name, "stream_options"), "{name:?}");
        }
    }

    /// The ASCII shortcut of [`spells`] agrees with its definition (cut at the first NUL, ASCII
    /// letters lower-cased, equal) on every name of up to 4 characters from a small alphabet.
    #[test]
    fn ascii_names_follow_the_definition() {
        let alphabet = ['m', 'M', 'o', 'x', '\0', '_'];
        let mut names = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = names
                .iter()
                .flat_map(|n| alphabet.iter().map(move |c| format!("{n}{c}")))
                .collect();
            names.extend(longer);
        }
        names.sort();
        names.dedup();
        for target in ["mo", "m_o", "mox", "", "m"] {
            for name in &names {
                let cut = name.split('\0').next().unwrap().to_ascii_lowercase();
                assert_eq!(spells(name, target), cut == target, "{name:?} {target:?}");
            }
        }
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<_> = Unreadable::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Unreadable::ALL.len());
    }
}
