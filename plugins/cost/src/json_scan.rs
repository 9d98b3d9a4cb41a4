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
//! is read in memory bounded by `max_value` per captured member plus [`MAX_DEPTH`] bytes of
//! stack. A captured value longer than `max_value` is dropped and reported
//! ([`ScanError::TooLarge`]).
//!
//! Well-formedness: the structure (objects, arrays, members, commas, colons), strings (escapes,
//! no raw control characters), numbers (RFC 8259 section 6 grammar), `true`/`false`/`null`, one
//! value and nothing but whitespace after it. Not checked: UTF-8 validity outside captured
//! values (which `serde_json` parses afterwards) and duplicate member names (the last one wins,
//! as in `serde_json::Value`). A document `serde_json` accepts is therefore always accepted here,
//! with the same members captured (the property the fuzz target `json_scan` checks).

/// Deepest nesting accepted (`serde_json`'s default recursion limit is 128).
pub const MAX_DEPTH: usize = 256;
/// Longest member name compared (bytes); longer names match nothing.
const MAX_KEY: usize = 16;
/// Bytes of `choices` kept: enough to tell an empty array (the rest is cut, marked `...`).
const CHOICES_HEAD: usize = 16;
/// The capture buffer's first capacity (bytes).
const CAPTURE_START: usize = 128;

/// The members captured (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `usage`.
    Usage,
    /// `model`.
    Model,
    /// `type`.
    Type,
    /// `choices`.
    Choices,
    /// `message.usage`.
    MessageUsage,
    /// `message.model`.
    MessageModel,
    /// `response.usage`.
    ResponseUsage,
    /// `response.model`.
    ResponseModel,
}

const FIELDS: usize = 8;

impl Field {
    fn index(self) -> usize {
        match self {
            Field::Usage => 0,
            Field::Model => 1,
            Field::Type => 2,
            Field::Choices => 3,
            Field::MessageUsage => 4,
            Field::MessageModel => 5,
            Field::ResponseUsage => 6,
            Field::ResponseModel => 7,
        }
    }
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// A value is expected.
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
    /// Inside a string; `key`: a member name.
    Str { key: bool },
    /// After `\` in a string.
    Escape { key: bool },
    /// In `\uXXXX`, `left` hex digits to go (`code` so far).
    Hex { key: bool, left: u8, code: u16 },
    /// Inside a number.
    Number(Num),
    /// Inside `true`, `false` or `null`: the literal and the bytes matched.
    Literal { word: &'static [u8], at: u8 },
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

/// The scanner (see the module documentation).
#[derive(Debug, Clone)]
pub struct JsonScan {
    st: St,
    /// Open containers: `true` for an object.
    stack: Vec<bool>,
    /// The member name being read (bounded), its buffer reused from name to name.
    key: Vec<u8>,
    /// Whether `key` is a name worth comparing (not too long, plain ASCII, shallow enough).
    key_live: bool,
    /// The current top-level member: the field it captures, or the parent it opens.
    top: Option<Result<Field, Parent>>,
    /// Inside the object of a top-level `message` / `response` member.
    inner_parent: Option<Parent>,
    /// The current member of that object: the field it captures.
    inner: Option<Field>,
    /// The value being captured: its field and the stack depth it started at.
    capturing: Option<(Field, usize)>,
    /// The value being captured, its buffer reused from capture to capture.
    buf: Vec<u8>,
    captured: Captured,
    too_large: bool,
    max_value: usize,
}

/// The members captured by a complete scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    values: [Option<Vec<u8>>; FIELDS],
}

impl Captured {
    /// The raw JSON text of `field`'s value, if the document had it.
    pub fn get(&self, field: Field) -> Option<&[u8]> {
        self.values.get(field.index())?.as_deref()
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonScan {
    /// A scanner capturing member values of at most `max_value` bytes.
    pub fn new(max_value: usize) -> JsonScan {
        JsonScan {
            st: St::Value,
            stack: Vec::new(),
            key: Vec::with_capacity(MAX_KEY),
            key_live: false,
            top: None,
            inner_parent: None,
            inner: None,
            capturing: None,
            buf: Vec::new(),
            captured: Captured::default(),
            too_large: false,
            max_value,
        }
    }

    /// Whether the text so far is already known not to be JSON.
    pub fn failed(&self) -> bool {
        self.st == St::Failed
    }

    /// Feeds the next bytes of the document.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some((&b, rest)) = chunk.split_first() {
            match self.st {
                St::Failed => return,
                St::Str { key } => {
                    // Fast path: everything up to the next quote, backslash or control byte.
                    let run = chunk
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                        .unwrap_or(chunk.len());
                    let (plain, tail) = chunk.split_at(run);
                    self.text(key, plain);
                    let Some((&c, after)) = tail.split_first() else {
                        return;
                    };
                    self.push_capture(&[c]);
                    match c {
                        b'"' => self.string_end(key),
                        b'\\' => self.st = St::Escape { key },
                        _ => self.fail(),
                    }
                    chunk = after;
                    continue;
                }
                _ => self.byte(b),
            }
            chunk = rest;
        }
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
            St::Number(Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
                if self.stack.is_empty() =>
            {
                Ok(())
            }
            _ => Err(ScanError::Incomplete),
        }?;
        if self.too_large {
            return Err(ScanError::TooLarge);
        }
        Ok(&self.captured)
    }

    fn fail(&mut self) {
        self.st = St::Failed;
        self.capturing = None;
        self.buf = Vec::new();
    }

    /// Stores the captured value of `field` (an exact-size copy: `buf` keeps its capacity for
    /// the next capture).
    fn keep(&mut self, field: Field) {
        if let Some(slot) = self.captured.values.get_mut(field.index()) {
            *slot = Some(self.buf.clone());
        }
        self.buf.clear();
    }

    /// Appends `bytes` to the value being captured, if one is. Called for most bytes of the
    /// document, nearly all outside a capture: the check is inlined, the rest is not.
    #[inline(always)]
    fn push_capture(&mut self, bytes: &[u8]) {
        if self.capturing.is_some() {
            self.capture(bytes);
        }
    }

    fn capture(&mut self, bytes: &[u8]) {
        let Some((field, _)) = self.capturing else {
            return;
        };
        if field == Field::Choices && self.buf.len().saturating_add(bytes.len()) > CHOICES_HEAD {
            // Only whether it is empty matters: keep its head, mark it cut, stop.
            let room = CHOICES_HEAD.saturating_sub(self.buf.len());
            self.buf
                .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
            self.buf.extend_from_slice(b"...");
            self.keep(field);
            self.capturing = None;
            return;
        }
        if self.buf.len().saturating_add(bytes.len()) > self.max_value {
            self.capturing = None;
            self.buf = Vec::new();
            self.too_large = true;
            return;
        }
        match bytes {
            // A structural byte or a digit: no copy call for one byte.
            [one] => self.buf.push(*one),
            _ => self.buf.extend_from_slice(bytes),
        }
    }

    /// Plain string bytes (no quote, backslash or control byte).
    fn text(&mut self, key: bool, bytes: &[u8]) {
        if key {
            self.key_bytes(bytes);
        }
        self.push_capture(bytes);
    }

    fn key_bytes(&mut self, bytes: &[u8]) {
        if self.key_live {
            if self.key.len().saturating_add(bytes.len()) > MAX_KEY {
                self.key_live = false;
            } else {
                self.key.extend_from_slice(bytes);
            }
        }
    }

    fn string_end(&mut self, key: bool) {
        if key {
            self.member_named();
            self.st = St::Colon;
        } else {
            self.value_end();
        }
    }

    /// A member name is complete: which field or parent it is.
    fn member_named(&mut self) {
        let name: &[u8] = if self.key_live { &self.key } else { b"\0" };
        self.key_live = false;
        match self.stack.len() {
            1 => {
                self.top = match name {
                    b"usage" => Some(Ok(Field::Usage)),
                    b"model" => Some(Ok(Field::Model)),
                    b"type" => Some(Ok(Field::Type)),
                    b"choices" => Some(Ok(Field::Choices)),
                    b"message" => Some(Err(Parent::Message)),
                    b"response" => Some(Err(Parent::Response)),
                    _ => None,
                }
            }
            2 => {
                self.inner = match (self.inner_parent, name) {
                    (Some(Parent::Message), b"usage") => Some(Field::MessageUsage),
                    (Some(Parent::Message), b"model") => Some(Field::MessageModel),
                    (Some(Parent::Response), b"usage") => Some(Field::ResponseUsage),
                    (Some(Parent::Response), b"model") => Some(Field::ResponseModel),
                    _ => None,
                }
            }
            _ => {}
        }
    }

    /// A value starts (its first byte is next): capture it if its member is one.
    fn value_start(&mut self) {
        let depth = self.stack.len();
        let field = match depth {
            1 => self.top.and_then(Result::ok),
            2 if self.inner_parent.is_some() => self.inner,
            _ => None,
        };
        // Only the value of a member (after its colon), not array elements.
        let in_object = self.stack.last() == Some(&true);
        if let (Some(field), true, None) = (field, in_object, self.capturing) {
            self.capturing = Some((field, depth));
            self.buf.clear();
            // One allocation for the usual value (a `usage` object is ~100 bytes), not 5 doublings.
            self.buf.reserve(CAPTURE_START.min(self.max_value));
        }
    }

    /// A value has ended (the scalar, or the container that closed).
    fn value_end(&mut self) {
        if let Some((field, depth)) = self.capturing {
            if depth == self.stack.len() {
                self.keep(field);
                self.capturing = None;
            }
        }
        self.st = if self.stack.is_empty() {
            St::Done
        } else {
            St::After
        };
    }

    fn open(&mut self, object: bool) {
        if self.stack.len() >= MAX_DEPTH {
            return self.fail();
        }
        // Entering the object of a top-level `message` / `response` member.
        if object && self.stack.len() == 1 {
            self.inner_parent = match self.top {
                Some(Err(parent)) => Some(parent),
                _ => None,
            };
            self.inner = None;
        }
        self.stack.push(object);
        self.st = if object { St::ObjFirst } else { St::ArrFirst };
    }

    fn close(&mut self, object: bool) {
        if self.stack.pop() != Some(object) {
            return self.fail();
        }
        if self.stack.len() == 1 {
            self.inner_parent = None;
        }
        self.push_capture(if object { b"}" } else { b"]" });
        self.value_end();
    }

    fn byte(&mut self, b: u8) {
        match self.st {
            St::Value
            | St::ArrFirst
            | St::ObjFirst
            | St::ObjKey
            | St::Colon
            | St::After
            | St::Done
                if is_ws(b) =>
            {
                // Whitespace inside a captured container is kept as it is.
                if self.capturing.is_some() {
                    self.push_capture(&[b]);
                }
            }
            St::ArrFirst if b == b']' => self.close(false),
            St::Value | St::ArrFirst => self.value_byte(b),
            St::ObjFirst if b == b'}' => self.close(true),
            St::ObjFirst | St::ObjKey if b == b'"' => {
                self.key.clear();
                self.key_live = self.stack.len() <= 2;
                self.push_capture(&[b]);
                self.st = St::Str { key: true };
            }
            St::Colon if b == b':' => {
                self.push_capture(&[b]);
                self.st = St::Value;
            }
            St::After => match (b, self.stack.last()) {
                (b',', Some(&object)) => {
                    self.push_capture(&[b]);
                    if self.stack.len() == 1 {
                        self.top = None;
                    }
                    self.st = if object { St::ObjKey } else { St::Value };
                }
                (b'}', Some(true)) => self.close(true),
                (b']', Some(false)) => self.close(false),
                _ => self.fail(),
            },
            St::Escape { key } => {
                self.push_capture(&[b]);
                let plain = match b {
                    b'"' | b'\\' | b'/' => Some(b),
                    b'b' => Some(0x08),
                    b'f' => Some(0x0c),
                    b'n' => Some(b'\n'),
                    b'r' => Some(b'\r'),
                    b't' => Some(b'\t'),
                    b'u' => None,
                    _ => return self.fail(),
                };
                match plain {
                    Some(c) => {
                        if key {
                            self.key_bytes(&[c]);
                        }
                        self.st = St::Str { key };
                    }
                    None => {
                        self.st = St::Hex {
                            key,
                            left: 4,
                            code: 0,
                        }
                    }
                }
            }
            St::Hex { key, left, code } => {
                let Some(digit) = (b as char).to_digit(16) else {
                    return self.fail();
                };
                self.push_capture(&[b]);
                let code = code.wrapping_shl(4) | digit as u16;
                if left > 1 {
                    self.st = St::Hex {
                        key,
                        left: left.saturating_sub(1),
                        code,
                    };
                    return;
                }
                if key {
                    // Names compared are ASCII; any other code point matches nothing.
                    match u8::try_from(code) {
                        Ok(c) if c.is_ascii() => self.key_bytes(&[c]),
                        _ => self.key_live = false,
                    }
                }
                self.st = St::Str { key };
            }
            St::Number(n) => self.number_byte(n, b),
            St::Literal { word, at } => {
                let at = usize::from(at);
                if word.get(at) != Some(&b) {
                    return self.fail();
                }
                self.push_capture(&[b]);
                let next = at.saturating_add(1);
                if next == word.len() {
                    self.value_end();
                } else {
                    self.st = St::Literal {
                        word,
                        at: u8::try_from(next).unwrap_or(u8::MAX),
                    };
                }
            }
            // St::Str is handled in `feed`; anything else is out of place.
            _ => self.fail(),
        }
    }

    fn value_byte(&mut self, b: u8) {
        self.value_start();
        match b {
            b'{' => {
                self.push_capture(&[b]);
                self.open(true);
            }
            b'[' => {
                self.push_capture(&[b]);
                self.open(false);
            }
            b'"' => {
                self.push_capture(&[b]);
                self.st = St::Str { key: false };
            }
            b'-' => {
                self.push_capture(&[b]);
                self.st = St::Number(Num::Minus);
            }
            b'0' => {
                self.push_capture(&[b]);
                self.st = St::Number(Num::Zero);
            }
            b'1'..=b'9' => {
                self.push_capture(&[b]);
                self.st = St::Number(Num::Int);
            }
            b't' | b'f' | b'n' => {
                self.push_capture(&[b]);
                let word: &'static [u8] = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.st = St::Literal { word, at: 1 };
            }
            _ => self.fail(),
        }
    }

    fn number_byte(&mut self, n: Num, b: u8) {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, _) if digit => Some(Num::Int),
            (Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, _) if digit => Some(Num::ExpDigits),
            _ => None,
        };
        if let Some(next) = next {
            self.push_capture(&[b]);
            self.st = St::Number(next);
            return;
        }
        // The number ended before `b` (if it could end here); `b` is read in the next state.
        if !matches!(n, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits) {
            return self.fail();
        }
        self.value_end();
        self.byte(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_chunks(chunks: &[&[u8]]) -> Result<Captured, ScanError> {
        let mut s = JsonScan::new(1024);
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
        assert!(s.buf.capacity() <= 64, "{}", s.buf.capacity());
    }
}
