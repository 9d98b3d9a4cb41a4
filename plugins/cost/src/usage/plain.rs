//! The captured `usage` objects and `model` / `type` strings in the shapes providers send, read
//! without `serde_json`: serde's generic path cost about 7,100 instructions a response for a
//! 150-byte OpenAI `usage`, this reader about 4,000 (callgrind, the likely chain: the reading of
//! a response's captured members 8.5k → 5.2k; CHANGELOG, 2026-11-30).
//!
//! What is read here ("plain"):
//! - a string: its bytes printable ASCII (0x20 to 0x7f) without `"` or `\`;
//! - `usage`: `null`, or an object whose member names are plain strings; a known member
//!   ([`RawUsage`]'s fields, and [`Details`]' inside the `*_details` objects) at most once;
//!   a count `null` or a whole number without sign, fraction or exponent that fits a u64
//!   (no leading zero); a `*_details` member `null` or such an object; an unknown member any
//!   value of plain strings, numbers (RFC 8259 section 6), `true`, `false`, `null`, objects
//!   and arrays of them nested at most [`MAX_DEPTH`] deep;
//! - whitespace (RFC 8259 section 2) wherever JSON allows it.
//!
//! Anything else (escapes, other bytes, a repeated known member, a negative or fractional count,
//! an array where serde would read a struct from a sequence, an error) is declined (`None`) and
//! the caller reads it with `serde_json`: what is read here is what serde reads, for every
//! input (tests below on generated documents; `fuzz/fuzz_targets/usage_json.rs` on arbitrary
//! bodies through the scanner).

use super::counts::{Details, RawUsage};
use crate::json_scan::lex::{ascii_run, ws_run, Num};

/// How deep an unknown member's value may nest before the reader declines it.
pub const MAX_DEPTH: u8 = 8;

/// A JSON string value, `null` (`Some(None)`), or `None` when it is not plain (see the module
/// docs): `serde_json::from_slice::<Option<String>>`'s reading of the plain ones.
pub fn string(raw: &[u8]) -> Option<Option<String>> {
    let mut c = Cursor { b: raw, at: 0 };
    c.ws();
    let out = if c.peek() == Some(b'n') {
        c.literal(b"null")?;
        None
    } else {
        let text = c.plain_str()?;
        Some(String::from(tollgate_common::bytes::utf8(text).ok()?))
    };
    c.end()?;
    Some(out)
}

/// A `usage` value, `null` (`Some(None)`), or `None` when it is not plain (see the module docs):
/// `serde_json::from_slice::<Option<RawUsage>>`'s reading of the plain ones.
pub fn usage(raw: &[u8]) -> Option<Option<RawUsage>> {
    let mut c = Cursor { b: raw, at: 0 };
    c.ws();
    if c.peek() == Some(b'n') {
        c.literal(b"null")?;
        c.end()?;
        return Some(None);
    }
    let mut u = RawUsage::default();
    let mut seen = 0u16;
    c.object(|c, name| {
        let Some(field) = usage_field(name) else {
            return c.skip(0);
        };
        once(&mut seen, field)?;
        match field {
            0 => c.count_into(&mut u.prompt_tokens),
            1 => c.count_into(&mut u.completion_tokens),
            2 => c.count_into(&mut u.input_tokens),
            3 => c.count_into(&mut u.output_tokens),
            4 => c.count_into(&mut u.cache_read_input_tokens),
            5 => c.count_into(&mut u.cache_creation_input_tokens),
            6 => c.details_into(&mut u.prompt_tokens_details),
            7 => c.details_into(&mut u.completion_tokens_details),
            8 => c.details_into(&mut u.input_tokens_details),
            _ => c.details_into(&mut u.output_tokens_details),
        }
    })?;
    c.end()?;
    Some(Some(u))
}

/// [`RawUsage`]'s member `name`, numbered in its fields' order: one comparison a name, chosen by
/// its length and first byte.
fn usage_field(name: &[u8]) -> Option<u8> {
    let (field, want): (u8, &[u8]) = match (name.len(), name.first()) {
        (13, Some(b'p')) => (0, b"prompt_tokens"),
        (17, _) => (1, b"completion_tokens"),
        (12, _) => (2, b"input_tokens"),
        (13, _) => (3, b"output_tokens"),
        (23, _) => (4, b"cache_read_input_tokens"),
        (27, _) => (5, b"cache_creation_input_tokens"),
        (21, Some(b'p')) => (6, b"prompt_tokens_details"),
        (25, _) => (7, b"completion_tokens_details"),
        (20, _) => (8, b"input_tokens_details"),
        (21, _) => (9, b"output_tokens_details"),
        _ => return None,
    };
    same(name, want).then_some(field)
}

/// [`Details`]' member `name`: 0 `cached_tokens`, 1 `reasoning_tokens`.
fn details_field(name: &[u8]) -> Option<u8> {
    let (field, want): (u8, &[u8]) = match name.len() {
        13 => (0, b"cached_tokens"),
        16 => (1, b"reasoning_tokens"),
        _ => return None,
    };
    same(name, want).then_some(field)
}

/// `a == b`, eight bytes at a time (the names compared are 12 to 27 bytes long).
fn same(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> Option<u64> {
        let w = s.get(at..at.checked_add(8)?)?;
        <[u8; 8]>::try_from(w).ok().map(u64::from_le_bytes)
    }
    let Some(last) = a.len().checked_sub(8) else {
        return a == b;
    };
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    while at < last {
        if word(a, at) != word(b, at) {
            return false;
        }
        at = at.saturating_add(8);
    }
    word(a, last) == word(b, last)
}

/// A known member read once: `None` (declined) when `seen` already has its bit.
fn once(seen: &mut u16, field: u8) -> Option<()> {
    let mask = 1u16.checked_shl(u32::from(field))?;
    if *seen & mask != 0 {
        return None;
    }
    *seen |= mask;
    Some(())
}

/// A position in a captured value.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn bump(&mut self) {
        self.at = self.at.saturating_add(1);
    }

    fn ws(&mut self) {
        let run = ws_run(self.b.get(self.at..).unwrap_or_default());
        self.at = self.at.saturating_add(run);
    }

    /// Only whitespace left.
    fn end(&mut self) -> Option<()> {
        self.ws();
        (self.at == self.b.len()).then_some(())
    }

    /// `want` here (after whitespace).
    fn eat(&mut self, want: u8) -> Option<()> {
        self.ws();
        (self.peek() == Some(want)).then(|| self.bump())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.b.get(self.at..end) == Some(word)).then(|| self.at = end)
    }

    /// A plain string's contents, the cursor on its opening quote.
    fn plain_str(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.at.saturating_add(1);
        let rest = self.b.get(start..)?;
        let len = ascii_run(rest);
        let text = rest.get(..len)?;
        if rest.get(len) != Some(&b'"') {
            return None;
        }
        self.at = start.saturating_add(len).saturating_add(1);
        Some(text)
    }

    /// `{`, then each member's name handed to `member` (the cursor after its colon, to read the
    /// value), then `}`.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.bump();
            return Some(());
        }
        loop {
            self.ws();
            let name = self.plain_str()?;
            self.eat(b':')?;
            self.ws();
            member(self, name)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.bump(),
                Some(b'}') => {
                    self.bump();
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `null` or a whole number that fits a u64, without sign, fraction or exponent.
    fn count(&mut self) -> Option<Option<u64>> {
        match self.peek()? {
            b'n' => {
                self.literal(b"null")?;
                Some(None)
            }
            b'0' => {
                self.bump();
                (!matches!(self.peek(), Some(b'0'..=b'9' | b'.' | b'e' | b'E'))).then_some(Some(0))
            }
            b'1'..=b'9' => {
                // 19 digits never overflow a u64 (no 128-bit multiply per digit); the 20th may.
                let mut n = 0u64;
                let mut len = 0u32;
                while let Some(d) = self
                    .peek()
                    .map(|b| b.wrapping_sub(b'0'))
                    .filter(|d| *d < 10)
                {
                    n = if len < 19 {
                        n.wrapping_mul(10).wrapping_add(u64::from(d))
                    } else {
                        n.checked_mul(10)?.checked_add(u64::from(d))?
                    };
                    len = len.saturating_add(1);
                    self.bump();
                }
                (!matches!(self.peek(), Some(b'.' | b'e' | b'E'))).then_some(Some(n))
            }
            _ => None,
        }
    }

    fn count_into(&mut self, slot: &mut Option<u64>) -> Option<()> {
        *slot = self.count()?;
        Some(())
    }

    fn details_into(&mut self, slot: &mut Option<Details>) -> Option<()> {
        if self.peek() == Some(b'n') {
            return self.literal(b"null");
        }
        let mut d = Details::default();
        let mut seen = 0u16;
        self.object(|c, name| {
            let Some(field) = details_field(name) else {
                return c.skip(0);
            };
            once(&mut seen, field)?;
            match field {
                0 => c.count_into(&mut d.cached_tokens),
                _ => c.count_into(&mut d.reasoning_tokens),
            }
        })?;
        *slot = Some(d);
        Some(())
    }

    /// Any value of the plain kinds (see the module docs), `depth` containers deep.
    fn skip(&mut self, depth: u8) -> Option<()> {
        match self.peek()? {
            b'"' => self.plain_str().map(|_| ()),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'{' if depth < MAX_DEPTH => self.object(|c, _| c.skip(depth.saturating_add(1))),
            b'[' if depth < MAX_DEPTH => {
                self.bump();
                self.ws();
                if self.peek() == Some(b']') {
                    self.bump();
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip(depth.saturating_add(1))?;
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.bump(),
                        Some(b']') => {
                            self.bump();
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            _ => None,
        }
    }

    /// A number (RFC 8259 section 6), read with the scanner's grammar ([`Num`]).
    fn number(&mut self) -> Option<()> {
        let mut n = Num::start(self.peek()?)?;
        self.bump();
        while let Some(next) = self.peek().and_then(|b| n.next(b)) {
            n = next;
            self.bump();
        }
        n.complete().then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_usage(raw: &[u8]) -> Option<Option<RawUsage>> {
        serde_json::from_slice::<Option<RawUsage>>(raw).ok()
    }

    fn serde_string(raw: &[u8]) -> Option<Option<String>> {
        serde_json::from_slice::<Option<String>>(raw).ok()
    }

    #[test]
    fn reads_the_providers_usage_objects() {
        let openai = br#"{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":20,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#;
        let anthropic = br#"{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":7,"cache_creation":{"ephemeral_5m_input_tokens":5,"ephemeral_1h_input_tokens":0},"output_tokens":3,"service_tier":"standard","server_tool_use":null}"#;
        let responses = br#" { "input_tokens" : 36, "input_tokens_details" : {"cached_tokens": 0}, "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 123 } "#;
        for raw in [&openai[..], anthropic, responses, b"null", b" null "] {
            let read = usage(raw);
            assert!(read.is_some(), "{}", String::from_utf8_lossy(raw));
            assert_eq!(read, serde_usage(raw), "{}", String::from_utf8_lossy(raw));
        }
        let u = usage(openai).flatten().unwrap_or_default();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens),
            (Some(120), Some(40))
        );
        assert_eq!(
            u.prompt_tokens_details.and_then(|d| d.cached_tokens),
            Some(20)
        );
        assert_eq!(
            string(br#""gpt-4o-mini""#),
            Some(Some("gpt-4o-mini".into()))
        );
        assert_eq!(string(b"null"), Some(None));
    }

    /// What serde refuses or reads another way is declined, never read differently.
    #[test]
    fn declines_what_it_does_not_read() {
        let declined: [&[u8]; 19] = [
            br#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            br#"{"prompt_tokens":null,"prompt_tokens":2}"#,
            br#"{"prompt_tokens":-1}"#,
            br#"{"prompt_tokens":-0}"#,
            br#"{"prompt_tokens":1.0}"#,
            br#"{"prompt_tokens":1e2}"#,
            br#"{"prompt_tokens":01}"#,
            br#"{"prompt_tokens":18446744073709551616}"#,
            br#"{"prompt_tokens":"1"}"#,
            br#"{"prompt\u005ftokens":1}"#,
            br#"[1,2]"#,
            br#"{"prompt_tokens_details":[1]}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}}"#,
            br#"{"x":"\n"}"#,
            "{\"x\":\"é\"}".as_bytes(),
            br#"{"x":[[[[[[[[[1]]]]]]]]]}"#,
            br#"{"prompt_tokens":1} x"#,
            br#"{"prompt_tokens":1,}"#,
            br#"{"x":-}"#,
        ];
        for raw in declined {
            assert_eq!(usage(raw), None, "{}", String::from_utf8_lossy(raw));
        }
        assert_eq!(string(br#""a\"b""#), None);
        assert_eq!(string(br#""a"b"#), None);
        assert_eq!(string(b"7"), None);
        let ok = br#"{"prompt_tokens":18446744073709551615,"x":[[[[[[[[1]]]]]]]],"y":-0.5e-3}"#;
        assert_eq!(usage(ok), serde_usage(ok));
        assert!(usage(ok).is_some());
    }

    /// On generated documents (valid and damaged; escaped, repeated and unknown names; numbers
    /// of every form), whatever is read is what `serde_json` reads.
    #[test]
    fn agrees_with_serde_on_generated_documents() {
        use crate::json_gen::{document, Rng};
        const NAMES: &[&str] = &[
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "prompt_tokens_details",
            "completion_tokens_details",
            "input_tokens_details",
            "output_tokens_details",
            "cached_tokens",
            "reasoning_tokens",
            "total_tokens",
            "input\\u005ftokens",
            "",
        ];
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut read = 0;
        for _ in 0..60_000 {
            let doc = document(&mut r, NAMES);
            let text = String::from_utf8_lossy(&doc);
            if let Some(u) = usage(&doc) {
                read += 1;
                assert_eq!(Some(u), serde_usage(&doc), "{text}");
            }
        }
        // The generator makes enough plain documents for the comparison to mean something.
        assert!(read > 3_000, "{read} usage objects read");
    }

    /// Every string of up to three pieces (plain text, escapes, multi-byte UTF-8, control and
    /// invalid bytes, quotes), closed or not, with whitespace or not: read as serde reads it.
    #[test]
    fn strings_agree_with_serde() {
        const PIECES: &[&[u8]] = &[
            b"gpt-4o-mini",
            b" ",
            b"\\",
            b"\"",
            b"\\u0041",
            b"\\n",
            "é".as_bytes(),
            b"\x01",
            b"\x7f",
            b"\xff",
            b"\t",
            b"",
        ];
        let mut read = 0;
        for a in PIECES {
            for b in PIECES {
                for c in PIECES {
                    for (open, close) in [("\"", "\""), (" \"", "\" "), ("\"", ""), ("", "\"")] {
                        let raw = [open.as_bytes(), a, b, c, close.as_bytes()].concat();
                        if let Some(s) = string(&raw) {
                            read += 1;
                            assert_eq!(
                                Some(s),
                                serde_string(&raw),
                                "{}",
                                String::from_utf8_lossy(&raw)
                            );
                        }
                    }
                }
            }
        }
        assert!(read > 200, "{read} strings read");
    }
}
