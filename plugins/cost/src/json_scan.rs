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

/// Deepest nesting accepted (`serde_json`'s default recursion limit is 128).
pub const MAX_DEPTH: usize = 256;
/// Longest member name compared (bytes); longer names match nothing.
const MAX_KEY: usize = 16;
/// Bytes of `choices` kept: enough to tell an empty array (the rest is cut, marked `...`).
const CHOICES_HEAD: usize = 16;
/// The capture buffer's first capacity (bytes): an OpenAI response's `model`, `choices` head and
/// `usage` (~150 bytes with its details) in one allocation.
const CAPTURE_START: usize = 256;

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

/// Every field, in [`Field::index`] order.
const ALL_FIELDS: [Field; FIELDS] = [
    Field::Usage,
    Field::Model,
    Field::Type,
    Field::Choices,
    Field::MessageUsage,
    Field::MessageModel,
    Field::ResponseUsage,
    Field::ResponseModel,
];

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

impl Num {
    /// The state after `b`, or `None` when `b` is not part of the number.
    fn next(self, b: u8) -> Option<Num> {
        let digit = b.is_ascii_digit();
        match (self, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus | Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, _) if digit => Some(Num::ExpDigits),
            _ => None,
        }
    }

    /// Whether a number can end in this state.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
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

/// The members captured by a complete scan: their raw JSON text, in one buffer.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    text: Vec<u8>,
    /// Each field's value in `text` (start, end), by [`Field::index`].
    ranges: [Option<(usize, usize)>; FIELDS],
}

impl Captured {
    /// The raw JSON text of `field`'s value, if the document had it.
    pub fn get(&self, field: Field) -> Option<&[u8]> {
        let (start, end) = (*self.ranges.get(field.index())?)?;
        self.text.get(start..end)
    }

    /// Forgets `field`'s value (a member given again: the last one wins), compacting the buffer
    /// so that it never holds more than one value per field.
    fn forget(&mut self, field: Field) {
        let Some((start, end)) = self.ranges.get_mut(field.index()).and_then(Option::take) else {
            return;
        };
        if end >= self.text.len() {
            self.text.truncate(start);
            return;
        }
        if start <= end {
            self.text.drain(start..end);
        }
        let gone = end.saturating_sub(start);
        for (s, e) in self.ranges.iter_mut().flatten() {
            if *s >= end {
                *s = s.saturating_sub(gone);
                *e = e.saturating_sub(gone);
            }
        }
    }
}

impl PartialEq for Captured {
    /// The same members with the same text (wherever each is in the buffer).
    fn eq(&self, other: &Captured) -> bool {
        ALL_FIELDS.iter().all(|&f| self.get(f) == other.get(f))
    }
}

impl Eq for Captured {}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes that end a run of plain string bytes: the quote, the backslash, control characters.
fn string_stop(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// The length of the run of plain string bytes `bytes` starts with. Eight bytes at a time:
/// in each 64-bit word, a byte that is `"`, `\` or below 0x20 sets its top bit in the mask (the
/// usual zero-byte test on the word XOR the quote or the backslash, and on the word minus
/// 0x20 in every byte); the first such byte is the lowest bit set, exact (a borrow only
/// disturbs the bytes above a true match).
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = bytes.chunks_exact(8);
    let mut run = 0usize;
    for word in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES.wrapping_mul(u64::from(b'"')));
        let backslash = w ^ (ONES.wrapping_mul(u64::from(b'\\')));
        let stops = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES.wrapping_mul(0x20)) & !w);
        let stops = stops & HIGH;
        if stops != 0 {
            return run.saturating_add((stops.trailing_zeros() / 8) as usize);
        }
        run = run.saturating_add(8);
    }
    let tail = words.remainder();
    run.saturating_add(
        tail.iter()
            .position(|&c| string_stop(c))
            .unwrap_or(tail.len()),
    )
}

/// The length of the run of whitespace `bytes` starts with.
fn ws_run(bytes: &[u8]) -> usize {
    bytes.iter().position(|&c| !is_ws(c)).unwrap_or(bytes.len())
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

    /// Whether the innermost open container is an object (`None`: none is open).
    fn in_object(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        let word = self.stack.get(d / 64)?;
        Some(word.wrapping_shr((d % 64) as u32) & 1 == 1)
    }

    /// Copies the captured bytes of `chunk` not yet copied, up to `end`, into the capture (cut
    /// at the head for `choices`, dropped past the bound).
    fn copy_captured(&mut self, chunk: &[u8], end: usize) {
        let Some(c) = self.capturing else {
            return;
        };
        let bytes = chunk.get(self.mark..end).unwrap_or_default();
        self.mark = end;
        let text = &mut self.captured.text;
        let total = text
            .len()
            .saturating_sub(c.start)
            .saturating_add(bytes.len());
        if c.field == Field::Choices && total > CHOICES_HEAD {
            // Only whether it is empty matters: keep its head, mark it cut, stop.
            let room = CHOICES_HEAD.saturating_sub(text.len().saturating_sub(c.start));
            text.extend_from_slice(bytes.get(..room).unwrap_or(bytes));
            text.extend_from_slice(b"...");
            self.end_capture();
            return;
        }
        if total > self.max_value {
            text.truncate(c.start);
            self.capturing = None;
            self.too_large = true;
            return;
        }
        text.extend_from_slice(bytes);
    }

    /// The captured value is complete: its range is recorded.
    fn end_capture(&mut self) {
        if let Some(c) = self.capturing.take() {
            let end = self.captured.text.len();
            if let Some(slot) = self.captured.ranges.get_mut(c.field.index()) {
                *slot = Some((c.start, end));
            }
        }
    }

    /// Inside a string (`key`: a member name) at `at`: its plain bytes in one run, then what
    /// ends the run. A name's colon right after it is read in the same step.
    fn string(&mut self, chunk: &[u8], at: usize, key: bool) -> usize {
        let rest = chunk.get(at..).unwrap_or_default();
        let run = plain_run(rest);
        let plain = rest.get(..run).unwrap_or_default();
        let next = at.saturating_add(run).saturating_add(1);
        match rest.get(run) {
            Some(b'"') if key => {
                if !self.key_live {
                    self.member_named(None);
                } else if self.key_len == 0 {
                    // The whole name is in this chunk, without escapes: compared where it is.
                    self.member_named(Some(plain));
                } else {
                    self.key_bytes(plain);
                    let key = self.key;
                    self.member_named(key.get(..self.key_len).filter(|_| self.key_live));
                }
                if chunk.get(next) == Some(&b':') {
                    self.st = St::Value;
                    return next.saturating_add(1);
                }
                self.st = St::Colon;
                next
            }
            Some(b'"') => {
                self.value_end(chunk, next);
                next
            }
            Some(b'\\') => {
                if key && self.key_live {
                    self.key_bytes(plain);
                }
                self.in_key = key;
                self.st = St::Escape;
                next
            }
            Some(_) => self.fail(chunk),
            None => {
                if key && self.key_live {
                    self.key_bytes(plain);
                }
                chunk.len()
            }
        }
    }

    /// Inside a number, at `at`: its bytes in one run; a byte that is not part of it ends it
    /// (if it can end there) and is read in the next state.
    fn number(&mut self, chunk: &[u8], mut at: usize) -> usize {
        let mut n = self.num;
        while let Some(&b) = chunk.get(at) {
            match n.next(b) {
                Some(next) => {
                    n = next;
                    at = at.saturating_add(1);
                }
                None if n.complete() => {
                    self.num = n;
                    self.value_end(chunk, at);
                    return at;
                }
                None => return self.fail(chunk),
            }
        }
        self.num = n;
        self.st = St::Number;
        at
    }

    /// A byte of an escape or a literal.
    fn in_token(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        let key = self.in_key;
        match self.st {
            St::Escape => {
                let plain = match b {
                    b'"' | b'\\' | b'/' => b,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.st = St::Hex;
                        self.hex_left = 4;
                        self.hex_code = 0;
                        return next;
                    }
                    _ => return self.fail(chunk),
                };
                if key && self.key_live {
                    self.key_bytes(&[plain]);
                }
                self.st = if key { St::Key } else { St::Str };
            }
            St::Hex => {
                let Some(digit) = (b as char).to_digit(16) else {
                    return self.fail(chunk);
                };
                self.hex_code = self.hex_code.wrapping_shl(4) | digit as u16;
                self.hex_left = self.hex_left.saturating_sub(1);
                if self.hex_left > 0 {
                    return next;
                }
                if key {
                    // Names compared are ASCII; any other code point matches nothing.
                    match u8::try_from(self.hex_code) {
                        Ok(c) if c.is_ascii() && self.key_live => self.key_bytes(&[c]),
                        _ => self.key_live = false,
                    }
                }
                self.st = if key { St::Key } else { St::Str };
            }
            St::Literal => {
                if self.literal.get(self.literal_at) != Some(&b) {
                    return self.fail(chunk);
                }
                self.literal_at = self.literal_at.saturating_add(1);
                if self.literal_at == self.literal.len() {
                    self.value_end(chunk, next);
                }
            }
            _ => return self.fail(chunk),
        }
        next
    }

    /// Where a value (or, after `[`, the `]`) is expected.
    fn value(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b'"' => {
                self.value_start(at);
                self.st = St::Str;
                next
            }
            b'0'..=b'9' | b'-' => {
                self.value_start(at);
                self.num = match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => Num::Int,
                };
                self.number(chunk, next)
            }
            b'{' | b'[' => {
                self.value_start(at);
                self.open(chunk, b == b'{', next)
            }
            b't' | b'f' | b'n' => {
                self.value_start(at);
                self.literal = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.literal_at = 1;
                self.st = St::Literal;
                next
            }
            b']' if self.st == St::ArrFirst => self.close(chunk, false, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    /// After a value: `,`, or the bracket that closes its container.
    fn after(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b',' => match self.in_object() {
                Some(true) => {
                    if self.depth == 1 {
                        self.top = None;
                    }
                    self.st = St::ObjKey;
                    // The next member's name right after the comma: read in the same step.
                    match chunk.get(next) {
                        Some(b'"') => self.name(chunk, b'"', next),
                        _ => next,
                    }
                }
                Some(false) => {
                    self.st = St::Value;
                    next
                }
                None => self.fail(chunk),
            },
            b'}' => self.close(chunk, true, next),
            b']' => self.close(chunk, false, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    /// Where a member name (or, after `{`, the `}`) is expected.
    fn name(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b'"' => {
                self.key_len = 0;
                // Names are compared at the top level and inside `message` / `response`.
                self.key_live = self.depth == 1 || (self.depth == 2 && self.inner_parent.is_some());
                self.st = St::Key;
                self.string(chunk, next, true)
            }
            b'}' if self.st == St::ObjFirst => self.close(chunk, true, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    fn key_bytes(&mut self, bytes: &[u8]) {
        let end = self.key_len.saturating_add(bytes.len());
        match self.key.get_mut(self.key_len..end) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.key_len = end;
            }
            None => self.key_live = false,
        }
    }

    /// A member name is complete (`None`: one that matches nothing): which field or parent it
    /// is.
    fn member_named(&mut self, name: Option<&[u8]>) {
        self.key_live = false;
        let name = name.unwrap_or(b"\0");
        match self.depth {
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

    /// A value starts at `at`: capture it if its member is one.
    fn value_start(&mut self, at: usize) {
        let field = match self.depth {
            1 => match self.top {
                Some(Ok(field)) => Some(field),
                Some(Err(parent)) => {
                    // A parent given again: only its last value counts, as for any member.
                    for f in parent.fields() {
                        self.captured.forget(f);
                    }
                    None
                }
                None => None,
            },
            2 if self.inner_parent.is_some() => self.inner,
            _ => return,
        };
        // Only the value of a member (after its colon), not array elements.
        if let (Some(field), Some(true), None) = (field, self.in_object(), self.capturing) {
            self.captured.forget(field);
            if self.captured.text.capacity() == 0 {
                // One allocation for the usual values, not a doubling per few bytes.
                self.captured
                    .text
                    .reserve(CAPTURE_START.min(self.max_value));
            }
            self.capturing = Some(Capture {
                field,
                depth: self.depth,
                start: self.captured.text.len(),
            });
            self.mark = at;
        }
    }

    /// A value has ended just before `end` in `chunk` (the scalar, or the container that
    /// closed).
    fn value_end(&mut self, chunk: &[u8], end: usize) {
        if let Some(c) = self.capturing {
            if c.depth == self.depth {
                self.copy_captured(chunk, end);
                self.end_capture();
            }
        }
        self.st = if self.depth == 0 { St::Done } else { St::After };
    }

    /// `{` (`object`) or `[` opens a container; `next`: just after it.
    fn open(&mut self, chunk: &[u8], object: bool, next: usize) -> usize {
        let d = self.depth;
        let Some(word) = self.stack.get_mut(d / 64) else {
            return self.fail(chunk);
        };
        let bit = 1u64.wrapping_shl((d % 64) as u32);
        if object {
            *word |= bit;
        } else {
            *word &= !bit;
        }
        // Entering the object of a top-level `message` / `response` member.
        if object && d == 1 {
            self.inner_parent = match self.top {
                Some(Err(parent)) => Some(parent),
                _ => None,
            };
            self.inner = None;
        }
        self.depth = d.saturating_add(1);
        self.st = if object { St::ObjFirst } else { St::ArrFirst };
        next
    }

    /// `]` or `}` (`object`) closes the innermost container; `next`: just after it.
    fn close(&mut self, chunk: &[u8], object: bool, next: usize) -> usize {
        if self.in_object() != Some(object) {
            return self.fail(chunk);
        }
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 1 {
            self.inner_parent = None;
        }
        self.value_end(chunk, next);
        next
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
