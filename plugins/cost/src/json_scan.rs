//! An incremental JSON scanner (RFC 8259) that reads a document of any length chunk by chunk,
//! keeps only a nesting stack and the raw text of a few members, and tells whether the whole
//! text was one well-formed value.
//!
//! It captures, from a top-level object, the raw values of `usage`, `model`, `type` and
//! `choices` (its first 16 bytes only, enough to tell an empty array; a longer one ends with
//! `...`), and of `usage` and `model` inside a top-level `message` or `response` object (where
//! Anthropic's `message_start` and OpenAI's Responses stream events carry them): every place the
//! providers put the numbers a response is priced by (see `usage`). Everything else is checked
//! for well-formedness and dropped as it passes, so a response body or an SSE payload of any size
//! is read in memory bounded by `max_value` per captured member plus a fixed-size state (a
//! [`MAX_DEPTH`]-bit nesting stack, a 16-byte member name). A captured value longer than
//! `max_value` is dropped and reported ([`ScanError::TooLarge`]).
//!
//! Well-formedness: the structure (objects, arrays, members, commas, colons), strings (escapes,
//! no raw control characters), numbers (RFC 8259 section 6 grammar), `true`/`false`/`null`, one
//! value and nothing but whitespace after it. Not checked: UTF-8 validity and the code points of
//! `\u` escapes (lone surrogates) outside captured values (which `serde_json` parses
//! afterwards), the range of numbers, and duplicate member names (the last one wins, as in
//! `serde_json::Value`). A document `serde_json` accepts is therefore always accepted here,
//! with the same members captured (checked against `serde_json` by this module's tests and by the
//! fuzz target `usage_json`).
//!
//! Speed (it reads every byte of every JSON response): a token is read in one step, runs of
//! plain string bytes, digits and whitespace in tight loops, and a captured value is copied
//! from the chunk as one slice when it ends (or when the chunk does), never byte by byte. All
//! captured values share one buffer, allocated once per scanner and kept by [`JsonScan::reset`].
//!
//! One concern a file: this one holds the scanner's state and its API ([`JsonScan::feed`],
//! [`JsonScan::finish`]); `tokens` reads each token (strings and member names, numbers, escapes,
//! literals, what follows a value); `nesting` opens and closes containers; `capture` decides
//! which values are kept and copies their text; `fields` holds what is kept ([`Field`],
//! [`Captured`]); `lex` the byte-level helpers (the number grammar, runs of plain bytes).

mod capture;
mod fields;
pub(crate) mod lex;
mod nesting;
mod tokens;

pub use fields::{Captured, Field};
use lex::{is_ws, ws_run, Num};

/// Deepest nesting accepted (`serde_json`'s default recursion limit is 128).
pub const MAX_DEPTH: usize = 256;
/// Longest member name compared (bytes); longer names match nothing.
const MAX_KEY: usize = 16;
/// Bytes of `choices` kept: enough to tell an empty array (the rest is cut, marked `...`).
const CHOICES_HEAD: usize = 16;
/// The capture buffer's first capacity (bytes): an OpenAI response's `model`, `choices` head and
/// `usage` (~150 bytes with its details) in one allocation.
const CAPTURE_START: usize = 256;

/// Why a scan did not give a complete, well-formed document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// Not JSON (or nested deeper than [`MAX_DEPTH`]).
    Invalid,
    /// The text ended inside the value (truncated), or was empty.
    Incomplete,
    /// A captured member's value was longer than the bound.
    TooLarge,
}

/// What the scanner expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// A value.
    Value,
    /// After `[`: a value or `]`.
    ArrFirst,
    /// After `{`: a member name or `}`.
    ObjFirst,
    /// After `,` in an object: a member name.
    ObjKey,
    /// After a member name: `:`.
    Colon,
    /// After a value: `,`, `]`, `}`, or (at the top) the end.
    After,
    /// Inside a string value.
    Str,
    /// Inside a member name.
    Key,
    /// After `\` in a string (`in_key`: a member name).
    Escape,
    /// In `\uXXXX` (`hex_left` digits to go, `hex_code` so far; `in_key`).
    Hex,
    /// Inside a number (`num`).
    Number,
    /// Inside `true`, `false` or `null` (`literal`, `literal_at` bytes matched).
    Literal,
    /// The top value is complete: whitespace only.
    Done,
    /// Not JSON: everything else is ignored.
    Failed,
}

/// Which top-level member (or member of `message` / `response`) the current value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    Message,
    Response,
}

impl Parent {
    /// The fields captured inside its object.
    fn fields(self) -> [Field; 2] {
        match self {
            Parent::Message => [Field::MessageUsage, Field::MessageModel],
            Parent::Response => [Field::ResponseUsage, Field::ResponseModel],
        }
    }
}

/// The value being captured.
#[derive(Debug, Clone, Copy)]
struct Capture {
    field: Field,
    /// The nesting depth its value starts at (it ends when a value at this depth does).
    depth: usize,
    /// Where its text starts in the capture buffer.
    start: usize,
}

/// The scanner (see the module documentation).
#[derive(Debug, Clone)]
pub struct JsonScan {
    st: St,
    /// `St::Escape` / `St::Hex`: in a member name.
    in_key: bool,
    hex_left: u8,
    hex_code: u16,
    num: Num,
    literal: &'static [u8],
    literal_at: usize,
    /// Open containers, a bit each (set: an object), the outermost at bit 0 of the first word.
    stack: [u64; MAX_DEPTH / 64],
    /// Containers open.
    depth: usize,
    /// The member name being read, when it spans chunks or has escapes: its first `key_len`
    /// bytes (a name read whole from one chunk is compared where it is).
    key: [u8; MAX_KEY],
    key_len: usize,
    /// Whether the name is worth comparing (not too long, plain ASCII, at a depth where a
    /// member is captured or opens a parent).
    key_live: bool,
    /// The current top-level member: the field it captures, or the parent it opens.
    top: Option<Result<Field, Parent>>,
    /// Inside the object of a top-level `message` / `response` member.
    inner_parent: Option<Parent>,
    /// The current member of that object: the field it captures.
    inner: Option<Field>,
    capturing: Option<Capture>,
    /// Where, in the chunk being fed, the captured bytes not yet copied start.
    mark: usize,
    captured: Captured,
    too_large: bool,
    max_value: usize,
}

impl JsonScan {
    /// A scanner capturing member values of at most `max_value` bytes.
    pub fn new(max_value: usize) -> JsonScan {
        JsonScan {
            st: St::Value,
            in_key: false,
            hex_left: 0,
            hex_code: 0,
            num: Num::Zero,
            literal: b"",
            literal_at: 0,
            stack: [0; MAX_DEPTH / 64],
            depth: 0,
            key: [0; MAX_KEY],
            key_len: 0,
            key_live: false,
            top: None,
            inner_parent: None,
            inner: None,
            capturing: None,
            mark: 0,
            captured: Captured::default(),
            too_large: false,
            max_value,
        }
    }

    /// Ready for a new document, as [`JsonScan::new`] with the same bound, keeping the capture
    /// buffer's allocation (an SSE stream scans one payload per event).
    pub fn reset(&mut self) {
        let mut text = std::mem::take(&mut self.captured.text);
        text.clear();
        *self = JsonScan::new(self.max_value);
        self.captured.text = text;
    }

    /// Whether the text so far is already known not to be JSON.
    pub fn failed(&self) -> bool {
        self.st == St::Failed
    }

    /// Feeds the next bytes of the document.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.mark = 0;
        let mut at = 0usize;
        // Each step reads a token, or its part in this chunk, and returns where the next starts
        // (the chunk's end once the text is not JSON).
        while let Some(&b) = chunk.get(at) {
            at = match self.st {
                St::Str => self.string(chunk, at, false),
                St::Key => self.string(chunk, at, true),
                St::Value | St::ArrFirst => self.value(chunk, b, at),
                St::After => self.after(chunk, b, at),
                St::ObjFirst | St::ObjKey => self.name(chunk, b, at),
                St::Number => self.number(chunk, at),
                St::Colon if b == b':' => {
                    self.st = St::Value;
                    at.saturating_add(1)
                }
                St::Escape | St::Hex | St::Literal => self.in_token(chunk, b, at),
                St::Colon | St::Done if is_ws(b) => {
                    at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default()))
                }
                St::Colon | St::Done => self.fail(chunk),
                St::Failed => return,
            };
        }
        // A value captured past this chunk: what the chunk held of it.
        self.copy_captured(chunk, chunk.len());
    }

    /// The captured members, once the document is complete and well-formed.
    ///
    /// # Errors
    /// [`ScanError`]: not JSON, incomplete, or a captured value over the bound.
    pub fn finish(&self) -> Result<Captured, ScanError> {
        self.finished().cloned()
    }

    /// [`JsonScan::finish`], borrowed: what a caller reads once needs no copy.
    ///
    /// # Errors
    /// As [`JsonScan::finish`].
    pub fn finished(&self) -> Result<&Captured, ScanError> {
        match self.st {
            St::Failed => Err(ScanError::Invalid),
            St::Done => Ok(()),
            // A top-level number ends at the end of the text.
            St::Number if self.num.complete() && self.depth == 0 => Ok(()),
            _ => Err(ScanError::Incomplete),
        }?;
        if self.too_large {
            return Err(ScanError::TooLarge);
        }
        Ok(&self.captured)
    }

    /// Not JSON: the scan stops (returns the end of `chunk`, where the next step would start).
    fn fail(&mut self, chunk: &[u8]) -> usize {
        self.st = St::Failed;
        self.capturing = None;
        self.captured = Captured::default();
        chunk.len()
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // tests: an overflow panics, which fails the test
mod tests {
    use super::*;
    use crate::json_gen::{document, Rng};

    /// Names: every captured one and parent, spelled plainly and with escapes, and others.
    const NAMES: &[&str] = &[
        "usage",
        "model",
        "type",
        "choices",
        "message",
        "response",
        "id",
        "us\\u0061ge",
        "mod\\u0065l",
        "\\u0074ype",
        "message_x",
        "usag",
        "prompt_tokens_details_and_more",
        "mod\\u00e9l",
        "",
        "\\\"usage\\\"",
        "model\\n",
    ];

    fn scan_chunks(chunks: &[&[u8]]) -> Result<Captured, ScanError> {
        let mut s = JsonScan::new(1 << 20);
        for c in chunks {
            s.feed(c);
        }
        s.finish()
    }

    fn scan(doc: &[u8]) -> Result<Captured, ScanError> {
        scan_chunks(&[doc])
    }

    fn text(c: &Captured, f: Field) -> Option<String> {
        c.get(f).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn captures_the_members_wherever_they_are_and_only_there() {
        let doc = br#" {"id":"x","choices":[{"usage":{"prompt_tokens":1}}],"nested":{"usage":1,"model":"no"},
            "model" : "gpt-4o" ,"usage": {"prompt_tokens": 10, "details": {"a": [1, 2.5e-3, null]}},
            "message":{"model":"claude","usage":{"input_tokens":3},"deeper":{"usage":9}},
            "type":"message","response":{"usage":{"input_tokens":4}}} "#;
        let c = scan(doc).unwrap();
        assert_eq!(text(&c, Field::Model).as_deref(), Some(r#""gpt-4o""#));
        assert_eq!(
            text(&c, Field::Usage).as_deref(),
            Some(r#"{"prompt_tokens": 10, "details": {"a": [1, 2.5e-3, null]}}"#)
        );
        assert_eq!(text(&c, Field::Type).as_deref(), Some(r#""message""#));
        assert_eq!(
            text(&c, Field::Choices).as_deref(),
            Some(r#"[{"usage":{"prom..."#),
            "cut"
        );
        assert_eq!(
            text(&c, Field::MessageModel).as_deref(),
            Some(r#""claude""#)
        );
        assert_eq!(
            text(&c, Field::MessageUsage).as_deref(),
            Some(r#"{"input_tokens":3}"#)
        );
        assert_eq!(
            text(&c, Field::ResponseUsage).as_deref(),
            Some(r#"{"input_tokens":4}"#)
        );
        assert_eq!(c.get(Field::ResponseModel), None);
        // Split at every byte: the same result.
        for at in 0..doc.len() {
            let (a, b) = doc.split_at(at);
            assert_eq!(scan_chunks(&[a, b]).unwrap(), c, "split at {at}");
        }
    }

    #[test]
    fn escaped_names_and_values() {
        let c = scan(br#"{"us\u0061ge":{"a":"\"}"},"mod\u00e9l":1,"model":"a\\b\n"}"#).unwrap();
        assert_eq!(text(&c, Field::Usage).as_deref(), Some(r#"{"a":"\"}"}"#));
        assert_eq!(text(&c, Field::Model).as_deref(), Some(r#""a\\b\n""#));
    }

    #[test]
    fn well_formedness() {
        for good in [
            &b"{}"[..],
            b"[]",
            b"0",
            b"-0.5e+10",
            b"\"s\"",
            b"true",
            b" null ",
            b"{\"a\":[{},[],\"\",1E2]}",
        ] {
            assert!(scan(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
        for (bad, want) in [
            (&b""[..], ScanError::Incomplete),
            (b"{", ScanError::Incomplete),
            (b"{\"usage\":{\"a\":1}", ScanError::Incomplete),
            (b"{\"a\":1,}", ScanError::Invalid),
            (b"{\"a\" 1}", ScanError::Invalid),
            (b"{\"a\":1 \"b\":2}", ScanError::Invalid),
            (b"[1,]", ScanError::Invalid),
            (b"01", ScanError::Invalid),
            (b"1.", ScanError::Incomplete),
            (b"-", ScanError::Incomplete),
            (b"1.e5", ScanError::Invalid),
            (b"tru", ScanError::Incomplete),
            (b"trux", ScanError::Invalid),
            (b"{} {}", ScanError::Invalid),
            (b"\"a\nb\"", ScanError::Invalid),
            (b"\"\\x\"", ScanError::Invalid),
            (b"\"\\u12g4\"", ScanError::Invalid),
            (b"[}", ScanError::Invalid),
            (b"{]", ScanError::Invalid),
        ] {
            assert_eq!(scan(bad), Err(want), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = [vec![b'['; MAX_DEPTH + 1], vec![b']'; MAX_DEPTH + 1]].concat();
        assert_eq!(scan(&deep), Err(ScanError::Invalid));
        let ok = [vec![b'['; MAX_DEPTH], vec![b']'; MAX_DEPTH]].concat();
        assert!(scan(&ok).is_ok());
    }

    #[test]
    fn captured_values_are_bounded() {
        let mut s = JsonScan::new(8);
        s.feed(br#"{"usage":{"prompt_tokens":1},"model":"m"}"#);
        assert_eq!(s.finish(), Err(ScanError::TooLarge));
        // Big members that are not captured cost nothing.
        let mut s = JsonScan::new(64);
        s.feed(br#"{"choices_x":""#);
        for _ in 0..1000 {
            s.feed(&[b'x'; 1000]);
        }
        s.feed(br#"","usage":{"prompt_tokens":1}}"#);
        let c = s.finish().unwrap();
        assert_eq!(c.get(Field::Usage), Some(&br#"{"prompt_tokens":1}"#[..]));
        assert!(
            s.captured.text.capacity() <= 64,
            "{}",
            s.captured.text.capacity()
        );
    }

    /// The members the scanner should capture, from `serde_json`'s own reading of the document
    /// (the raw text of each member of the top-level object, the last of duplicate names).
    fn reference(doc: &[u8]) -> Option<Captured> {
        use serde_json::value::RawValue;
        use std::collections::BTreeMap;
        type Members = BTreeMap<String, Box<RawValue>>;
        let top: Members = serde_json::from_slice(doc).ok()?;
        let mut c = Captured::default();
        let mut put = |field: Field, raw: Option<&Box<RawValue>>| {
            if let Some(raw) = raw {
                let mut text = raw.get().as_bytes().to_vec();
                if field == Field::Choices && text.len() > CHOICES_HEAD {
                    text.truncate(CHOICES_HEAD);
                    text.extend_from_slice(b"...");
                }
                let start = c.text.len();
                c.text.extend_from_slice(&text);
                c.ranges[field.index()] = Some((start, c.text.len()));
            }
        };
        put(Field::Usage, top.get("usage"));
        put(Field::Model, top.get("model"));
        put(Field::Type, top.get("type"));
        put(Field::Choices, top.get("choices"));
        for (name, usage, model) in [
            ("message", Field::MessageUsage, Field::MessageModel),
            ("response", Field::ResponseUsage, Field::ResponseModel),
        ] {
            let inner: Option<Members> = top
                .get(name)
                .and_then(|raw| serde_json::from_str(raw.get()).ok());
            if let Some(inner) = inner {
                put(usage, inner.get("usage"));
                put(model, inner.get("model"));
            }
        }
        Some(c)
    }

    /// The scanner against `serde_json` on generated documents, whole and in random chunks:
    /// what `serde_json` accepts is accepted with the same members captured (their exact text);
    /// what it refuses (valid UTF-8, numbers in range) is refused; chunks change nothing.
    #[test]
    fn agrees_with_serde_json_on_generated_documents() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..40_000 {
            let doc = document(&mut r, NAMES);
            let whole = scan(&doc);
            for _ in 0..2 {
                let mut cuts: Vec<usize> =
                    (0..r.below(6)).map(|_| r.below(doc.len() + 1)).collect();
                cuts.sort();
                let mut pieces = Vec::new();
                let mut from = 0;
                for cut in cuts {
                    pieces.push(&doc[from..cut]);
                    from = cut;
                }
                pieces.push(&doc[from..]);
                assert_eq!(
                    scan_chunks(&pieces),
                    whole,
                    "{:?} in {pieces:?}",
                    String::from_utf8_lossy(&doc)
                );
            }
            let text = String::from_utf8_lossy(&doc);
            // serde_json's check of the grammar alone (what `IgnoredAny` reads: no UTF-8, code
            // point or number range checks) accepts exactly what the scanner accepts.
            let grammar = serde_json::from_slice::<serde::de::IgnoredAny>(&doc);
            assert_eq!(
                grammar.is_ok(),
                whole.is_ok(),
                "{grammar:?} {whole:?}: {text}"
            );
            if serde_json::from_slice::<serde_json::Value>(&doc).is_ok() {
                accepted += 1;
                if let Some(want) = reference(&doc) {
                    assert_eq!(whole.as_ref(), Ok(&want), "{text}");
                }
            } else {
                refused += 1;
            }
        }
        // The generator covers both sides.
        assert!(accepted > 10_000 && refused > 5_000, "{accepted} {refused}");
    }

    #[test]
    fn a_parent_given_again_keeps_only_its_last_value() {
        let c = scan(br#"{"message":{"usage":{"a":1},"model":"m"},"message":null}"#).unwrap();
        assert_eq!(c.get(Field::MessageUsage), None);
        assert_eq!(c.get(Field::MessageModel), None);
        let c = scan(br#"{"response":{"usage":1},"model":"x","response":{"model":"y"}}"#).unwrap();
        assert_eq!(c.get(Field::ResponseUsage), None);
        assert_eq!(text(&c, Field::ResponseModel).as_deref(), Some(r#""y""#));
        assert_eq!(text(&c, Field::Model).as_deref(), Some(r#""x""#));
    }

    #[test]
    fn members_given_again_keep_one_value_each_in_the_buffer() {
        let mut s = JsonScan::new(64);
        s.feed(br#"{"model":"a","usage":{"x":1},"type":"t","model":"bb","usage":2,"model":"ccc"}"#);
        let c = s.finished().unwrap();
        assert_eq!(text(c, Field::Model).as_deref(), Some(r#""ccc""#));
        assert_eq!(text(c, Field::Usage).as_deref(), Some("2"));
        assert_eq!(text(c, Field::Type).as_deref(), Some(r#""t""#));
        assert_eq!(
            c.text.len(),
            5 + 1 + 3,
            "{:?}",
            String::from_utf8_lossy(&c.text)
        );
        // A thousand repeats hold no more than one value each.
        let mut s = JsonScan::new(64);
        s.feed(b"{");
        for _ in 0..1000 {
            s.feed(br#""usage":{"prompt_tokens":1},"model":"m","#);
        }
        s.feed(br#""type":"x"}"#);
        let c = s.finished().unwrap();
        assert_eq!(c.text.len(), r#"{"prompt_tokens":1}"m""x""#.len());
        // Reset keeps the buffer, not the values.
        s.reset();
        let kept = s.captured.text.capacity();
        s.feed(b"{}");
        assert_eq!(s.finished().unwrap(), &Captured::default());
        assert_eq!(s.captured.text.capacity(), kept);
    }
}
