//! logfmt: `key=value` pairs separated by one space, the line format of Heroku's logfmt that
//! Grafana Loki (`| logfmt`), Vector and Go's `log/slog` text handler read. The filters publish
//! what they decided on a request as one such line (`crate::signals`): one property per filter,
//! readable as is in an access log, parsed by the metrics filter.
//!
//! Keys are written as given (the callers use fixed snake-case names). A value is written bare
//! unless it is empty or holds a space, a control byte, `"`, `=` or `\`; then it is quoted, with
//! `\"`, `\\`, `\n`, `\r`, `\t` and `\u00XX` for the other control bytes (Go's `strconv.Quote`
//! escapes, as slog writes them). Bytes outside ASCII pass unchanged (the values are UTF-8).

use std::borrow::Cow;

/// One logfmt line being built.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Line {
    text: String,
}

impl Line {
    /// An empty line (room for a typical one: no reallocation while it is built).
    pub fn new() -> Self {
        Line {
            text: String::with_capacity(192),
        }
    }

    /// Appends `key=value`, quoting `value` where it must be. Inlined, as [`Line::int`] is, so
    /// that a caller's literal key is copied as a constant-length store instead of through the
    /// guest's `memory.copy` (a call out of the guest: about 60 instructions for a few bytes).
    #[inline(always)]
    pub fn text(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        if needs_quotes(value) {
            quote_into(&mut self.text, value);
        } else {
            self.text.push_str(value);
        }
        self
    }

    /// Appends `key=<decimal>` (inlined: see [`Line::text`]).
    #[inline(always)]
    pub fn int(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key);
        self.text.push_str(itoa::Buffer::new().format(value));
        self
    }

    #[inline(always)]
    fn key(&mut self, key: &str) {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        self.text.push_str(key);
        self.text.push('=');
    }

    /// The line (no trailing newline).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// The line of `fields` (key, value) written into `buf`, as [`Line`] would write it, when every
/// value is written bare and the line fits; `None` otherwise (then build a [`Line`]). No
/// allocation: for the per-request path.
pub fn bare_line<'a>(buf: &'a mut [u8], fields: &[(&str, &str)]) -> Option<&'a [u8]> {
    let mut end = 0usize;
    for (i, (key, value)) in fields.iter().enumerate() {
        if needs_quotes(value) {
            return None;
        }
        let sep: &[u8] = if i == 0 { b"" } else { b" " };
        for part in [sep, key.as_bytes(), b"=", value.as_bytes()] {
            let next = end.checked_add(part.len())?;
            buf.get_mut(end..next)?.copy_from_slice(part);
            end = next;
        }
    }
    buf.get(..end)
}

fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || b == b'"' || b == b'=' || b == b'\\')
}

fn quote_into(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' || c == '\u{7f}' => {
                out.push_str("\\u00");
                let b = c as u32;
                for nibble in [b >> 4, b & 0xf] {
                    out.push(char::from_digit(nibble, 16).unwrap_or('0'));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The pairs of a logfmt line, in order. A line that is not UTF-8 has none; the pairs stop at
/// the first malformed one (a key without `=`, an unterminated quote, an unknown escape).
pub fn pairs(line: &[u8]) -> Pairs<'_> {
    Pairs {
        rest: crate::bytes::utf8(line).unwrap_or_default(),
    }
}

/// The value of `key` in a logfmt line (its first occurrence).
pub fn value<'a>(line: &'a [u8], key: &str) -> Option<Cow<'a, str>> {
    pairs(line)
        .find(|(k, _)| crate::bytes::same_bytes(k.as_bytes(), key.as_bytes()))
        .map(|(_, v)| v)
}

/// Iterator over the pairs of a line ([`pairs`]).
#[derive(Debug, Clone)]
pub struct Pairs<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a str, Cow<'a, str>);

    // One pass over the bytes, each looked at once (the delimiters are ASCII, so every cut is
    // on a character boundary): `str` pattern searches cost several times more per byte.
    fn next(&mut self) -> Option<Self::Item> {
        let parsed = next_pair(self.rest);
        self.rest = parsed.as_ref().map_or("", |(_, _, rest)| rest);
        parsed.map(|(key, value, _)| (key, value))
    }
}

/// The first pair of `line` and what follows it; `None` at the end or at a malformed pair.
/// The delimiters are found with `memchr` (a word at a time): the lines are read on every
/// request, and a byte-by-byte loop cost about 380 instructions a pair in the guest (an 8-byte
/// step of our own measured slower than `memchr` here, its code not inlined as well).
fn next_pair(line: &str) -> Option<(&str, Cow<'_, str>, &str)> {
    let bytes = line.as_bytes();
    let start = bytes.iter().position(|&b| b != b' ')?;
    let key_len = memchr::memchr2(b'=', b' ', bytes.get(start..)?)?;
    let eq = start.checked_add(key_len)?;
    if key_len == 0 || bytes.get(eq) != Some(&b'=') {
        return None;
    }
    let key = line.get(start..eq)?;
    let value_start = eq.checked_add(1)?;
    let tail = bytes.get(value_start..)?;
    if tail.first() == Some(&b'"') {
        let (value, rest) = unquote(line.get(value_start.checked_add(1)?..)?)?;
        return Some((key, value, rest));
    }
    let end = memchr::memchr(b' ', tail).map_or(bytes.len(), |i| value_start.saturating_add(i));
    Some((
        key,
        Cow::Borrowed(line.get(value_start..end)?),
        line.get(end..)?,
    ))
}

/// The value of a quoted string after its opening quote, and what follows its closing quote.
fn unquote(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let end = memchr::memchr2(b'"', b'\\', s.as_bytes())?;
    let (head, tail) = (s.get(..end)?, s.get(end..)?);
    if let Some(rest) = tail.strip_prefix('"') {
        return Some((Cow::Borrowed(head), rest));
    }
    let mut out = String::from(head);
    let mut chars = tail.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((Cow::Owned(out), tail.get(i..)?.strip_prefix('"')?)),
            '\\' => match chars.next()?.1 {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'u' => {
                    let mut code = 0u32;
                    for _ in 0..4 {
                        code = (code << 4) | chars.next()?.1.to_digit(16)?;
                    }
                    out.push(char::from_u32(code)?);
                }
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(line: &str) -> Vec<(String, String)> {
        pairs(line.as_bytes())
            .map(|(k, v)| (k.to_string(), v.into_owned()))
            .collect()
    }

    /// The stack-built line is the one `Line` writes; a value that must be quoted, or a line
    /// that does not fit, is left to `Line`.
    #[test]
    fn a_bare_line_on_the_stack_is_the_lines_text() {
        let mut buf = [0u8; 128];
        for fields in [
            &[("outcome", "ok")][..],
            &[("outcome", "store_failure_denied"), ("rule", "per-tenant")][..],
        ] {
            let line = bare_line(&mut buf, fields).map(<[u8]>::to_vec);
            let mut expected = Line::new();
            for (k, v) in fields {
                expected.text(k, v);
            }
            assert_eq!(line.as_deref(), Some(expected.as_str().as_bytes()));
        }
        assert_eq!(
            bare_line(&mut buf, &[("outcome", "ok"), ("rule", "a b")]),
            None
        );
        assert_eq!(bare_line(&mut buf, &[("outcome", "")]), None);
        let long = "x".repeat(120);
        assert!(bare_line(&mut buf, &[("outcome", &long)]).is_some());
        assert_eq!(
            bare_line(&mut buf, &[("outcome", &long), ("rule", "r")]),
            None
        );
    }

    #[test]
    fn bare_and_quoted_values() {
        let mut line = Line::new();
        line.text("outcome", "priced")
            .text("model", "gpt-4o-mini")
            .int("input_tokens", 1000)
            .text("tenant", "a b=\"c\"\\")
            .text("empty", "")
            .text("ctl", "x\ny\t\u{1}\u{7f}")
            .text("utf8", "zoë");
        assert_eq!(
            line.as_str(),
            "outcome=priced model=gpt-4o-mini input_tokens=1000 tenant=\"a b=\\\"c\\\"\\\\\" \
             empty=\"\" ctl=\"x\\ny\\t\\u0001\\u007f\" utf8=zoë"
        );
        assert_eq!(
            all(line.as_str()),
            [
                ("outcome", "priced"),
                ("model", "gpt-4o-mini"),
                ("input_tokens", "1000"),
                ("tenant", "a b=\"c\"\\"),
                ("empty", ""),
                ("ctl", "x\ny\t\u{1}\u{7f}"),
                ("utf8", "zoë"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(
            value(line.as_str().as_bytes(), "model").as_deref(),
            Some("gpt-4o-mini")
        );
        assert_eq!(value(line.as_str().as_bytes(), "absent"), None);
    }

    /// Every value a filter could publish (tenants come from tokens and headers) reads back as
    /// written, whatever bytes it holds.
    #[test]
    fn every_value_round_trips() {
        let samples = [
            "",
            " ",
            "=",
            "\"",
            "\\",
            "\\u0041",
            "a\"b",
            "tab\there",
            "\u{0}",
            "k=v x=y",
            "ü ß",
            "\"quoted\"",
            "trailing\\",
        ];
        for a in samples {
            for b in samples {
                let mut line = Line::new();
                line.text("a", a).text("b", b).int("n", u64::MAX);
                let got = all(line.as_str());
                assert_eq!(
                    got,
                    [("a", a), ("b", b), ("n", "18446744073709551615")]
                        .map(|(k, v)| (k.to_string(), v.to_string())),
                    "{}",
                    line.as_str()
                );
            }
        }
    }

    /// A malformed line yields the pairs before the fault and nothing after it; no input
    /// panics.
    #[test]
    fn malformed_lines_stop() {
        assert_eq!(all("a=1 b"), [("a".to_string(), "1".to_string())]);
        assert_eq!(all("a=1 b=\"open"), [("a".to_string(), "1".to_string())]);
        assert_eq!(all("a=\"\\q\" b=2"), []);
        assert_eq!(all("a=\"\\u00zz\""), []);
        assert_eq!(all("=1"), []);
        assert!(pairs(b"a=\xff").next().is_none());
        for cut in 0..40 {
            let line = "a=\"x\\\"y\\u0001\" b=c d=\"\"";
            let _ = all(line.get(..cut).unwrap_or(line));
        }
    }
}
