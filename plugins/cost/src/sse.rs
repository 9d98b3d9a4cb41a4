//! An incremental parser of the `text/event-stream` format (WHATWG HTML Living Standard,
//! "Server-sent events", section 9.2.6 "Interpreting an event stream") and the usage
//! accumulator fed by its events.
//!
//! The stream arrives in chunks split anywhere (inside a line, between CR and LF). Lines end with
//! LF, CRLF or CR; a leading U+FEFF BOM is skipped; lines starting with `:` are comments; `data`
//! lines are joined with LF; a blank line dispatches the event (when it had a `data` line);
//! fields other than `data` and `event` (`id`, `retry`) are ignored; an unterminated last event
//! is discarded, as the standard requires.
//!
//! **No size bound skips an event**: a `data` value is never buffered. Its bytes go, as they
//! arrive, into the event's [`JsonScan`], which keeps only the members a price needs (bounded by
//! `max_event_bytes` each) and whether the payload is well-formed JSON; the parser itself keeps
//! the first 16 bytes of the payload (to recognise `[DONE]`), the event type (64 bytes at most)
//! and at most 8 bytes of a field name. So a stream of any length, with events of any size, is
//! read in bounded memory and still priced.

use crate::json_scan::{Captured, JsonScan, ScanError};
use crate::usage::{Body, RawUsage, Usage};

/// Default bound on a captured member (`usage`, `model`) of an event (bytes).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

/// Longest `event:` value kept (bytes); longer names are truncated (they match nothing).
const MAX_EVENT_NAME: usize = 64;
/// Bytes of a data payload kept as they are (enough for `[DONE]`).
const DATA_HEAD: usize = 16;
/// Longest field name read (`event` and `data` are shorter).
const MAX_FIELD: usize = 8;

/// The UTF-8 byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";
/// The member name whose presence makes a payload worth pricing.
const USAGE_NEEDLE: &[u8] = b"\"usage\"";

/// What the parser is doing with the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line.
    Start,
    /// Reading the field name (`field` so far).
    Field,
    /// In the value of a `data` field; `skip_space`: a single leading space is still to drop.
    Data { skip_space: bool },
    /// In the value of an `event` field.
    Event { skip_space: bool },
    /// In a comment or the value of an ignored field.
    Ignore,
}

/// One dispatched event, as the accumulator sees it.
#[derive(Debug)]
pub struct Event<'a> {
    /// The event type (`message` when the event had no `event` field).
    pub kind: &'a [u8],
    /// Whether the data payload is exactly `[DONE]`.
    pub done: bool,
    /// The first bytes of the payload (at most 16).
    pub head: &'a [u8],
    /// Whether the payload contains `"usage"`.
    pub mentions_usage: bool,
    /// The payload scanned as JSON.
    pub json: Result<&'a Captured, ScanError>,
}

/// The incremental event-stream parser (bounded state, see the module docs).
#[derive(Debug)]
pub struct SseParser {
    line: Line,
    field: Vec<u8>,
    /// The previous byte was a CR that ended a line (a LF right after it belongs to it).
    after_cr: bool,
    /// The BOM check is done; before that, `bom` holds the first bytes.
    started: bool,
    bom: Vec<u8>,
    event: Vec<u8>,
    /// The `event` value being read on this line.
    event_value: Vec<u8>,
    data_lines: u64,
    data_head: Vec<u8>,
    data_len: u64,
    /// The last bytes of the payload, to find `"usage"` across chunks.
    tail: Vec<u8>,
    mentions_usage: bool,
    /// The current event's payload, scanned (reset, its buffer kept, for each event).
    scan: JsonScan,
}

impl SseParser {
    /// A parser whose captured members are bounded by `max_event_bytes` each.
    pub fn new(max_event_bytes: usize) -> Self {
        SseParser {
            line: Line::Start,
            field: Vec::new(),
            after_cr: false,
            started: false,
            bom: Vec::new(),
            event: Vec::new(),
            event_value: Vec::new(),
            data_lines: 0,
            data_head: Vec::new(),
            data_len: 0,
            tail: Vec::new(),
            mentions_usage: false,
            scan: JsonScan::new(max_event_bytes),
        }
    }

    /// Feeds the next chunk; `on_event(end, event)` is called for each complete event, `end`
    /// being the offset in `chunk` just after the line end that dispatched it.
    pub fn feed(&mut self, chunk: &[u8], on_event: &mut dyn FnMut(usize, Event<'_>)) {
        if self.started {
            return self.feed_started(chunk, 0, on_event);
        }
        // The BOM may itself be split across chunks: keep the first bytes until it is decided.
        let had = self.bom.len();
        let take = BOM.len().saturating_sub(had).min(chunk.len());
        let (head, _) = chunk.split_at(take);
        self.bom.extend_from_slice(head);
        if self.bom.len() < BOM.len() && BOM.starts_with(&self.bom) {
            return;
        }
        self.started = true;
        let held = std::mem::take(&mut self.bom);
        if held.as_slice() == BOM {
            // Skip the BOM; its bytes of this chunk are consumed.
            return self.feed_started(chunk.get(take..).unwrap_or(&[]), take, on_event);
        }
        // Not a BOM: the bytes held from earlier chunks (a prefix of the BOM, so no line end
        // among them) are stream bytes, then the whole chunk.
        self.feed_started(held.get(..had).unwrap_or(&[]), 0, on_event);
        self.feed_started(chunk, 0, on_event);
    }

    /// `base`: the offset of `chunk` in the caller's chunk.
    fn feed_started(
        &mut self,
        chunk: &[u8],
        base: usize,
        on_event: &mut dyn FnMut(usize, Event<'_>),
    ) {
        let mut at = 0usize;
        while let Some(rest) = chunk.get(at..).filter(|r| !r.is_empty()) {
            if self.after_cr {
                self.after_cr = false;
                if rest.first() == Some(&b'\n') {
                    at = at.saturating_add(1);
                    continue;
                }
            }
            let eol = rest.iter().position(|&b| b == b'\n' || b == b'\r');
            let (body, tail) = rest.split_at(eol.unwrap_or(rest.len()));
            self.line_bytes(body);
            let Some(&end) = tail.first() else {
                return;
            };
            at = at.saturating_add(body.len()).saturating_add(1);
            self.after_cr = end == b'\r';
            // A CRLF whose LF is in this chunk ends here (one split across chunks leaves its LF
            // at the start of the next event's bytes, which reads the same).
            if self.after_cr && chunk.get(at) == Some(&b'\n') {
                self.after_cr = false;
                at = at.saturating_add(1);
            }
            self.line_end(base.saturating_add(at), on_event);
        }
    }

    /// Bytes of the current line (no line end among them).
    fn line_bytes(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.line {
                Line::Start if bytes.first() == Some(&b':') => {
                    self.line = Line::Ignore;
                    return;
                }
                Line::Start | Line::Field => {
                    self.line = Line::Field;
                    let colon = bytes.iter().position(|&b| b == b':');
                    let (name, rest) = bytes.split_at(colon.unwrap_or(bytes.len()));
                    if self.field.len().saturating_add(name.len()) > MAX_FIELD {
                        self.line = Line::Ignore;
                        return;
                    }
                    self.field.extend_from_slice(name);
                    if rest.is_empty() {
                        return;
                    }
                    // The colon: the value follows.
                    self.line = match self.field.as_slice() {
                        b"data" => {
                            self.data_line();
                            Line::Data { skip_space: true }
                        }
                        b"event" => {
                            self.event_value.clear();
                            Line::Event { skip_space: true }
                        }
                        _ => Line::Ignore,
                    };
                    bytes = rest.get(1..).unwrap_or(&[]);
                }
                Line::Data { skip_space } => {
                    if skip_space && bytes.first() == Some(&b' ') {
                        bytes = bytes.get(1..).unwrap_or(&[]);
                    }
                    self.line = Line::Data { skip_space: false };
                    self.data(bytes);
                    return;
                }
                Line::Event { skip_space } => {
                    if skip_space && bytes.first() == Some(&b' ') {
                        bytes = bytes.get(1..).unwrap_or(&[]);
                    }
                    self.line = Line::Event { skip_space: false };
                    let room = MAX_EVENT_NAME.saturating_sub(self.event_value.len());
                    self.event_value
                        .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
                    return;
                }
                Line::Ignore => return,
            }
        }
    }

    /// A `data` line starts: lines after the first are joined with LF.
    fn data_line(&mut self) {
        if self.data_lines > 0 {
            self.data(b"\n");
        }
        self.data_lines = self.data_lines.saturating_add(1);
    }

    /// Payload bytes.
    fn data(&mut self, bytes: &[u8]) {
        let room = DATA_HEAD.saturating_sub(self.data_head.len());
        self.data_head
            .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
        self.data_len = self
            .data_len
            .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        if !self.mentions_usage {
            let mut window = std::mem::take(&mut self.tail);
            window.extend_from_slice(bytes.get(..USAGE_NEEDLE.len()).unwrap_or(bytes));
            self.mentions_usage = contains(&window, USAGE_NEEDLE) || contains(bytes, USAGE_NEEDLE);
            let keep = USAGE_NEEDLE.len().saturating_sub(1);
            let source: &[u8] = if bytes.len() >= keep { bytes } else { &window };
            self.tail = source
                .get(source.len().saturating_sub(keep)..)
                .unwrap_or(&[])
                .to_vec();
        }
        self.scan.feed(bytes);
    }

    fn line_end(&mut self, offset: usize, on_event: &mut dyn FnMut(usize, Event<'_>)) {
        let line = std::mem::replace(&mut self.line, Line::Start);
        let field = std::mem::take(&mut self.field);
        match line {
            Line::Start => return self.dispatch(offset, on_event),
            // A field without a colon: an empty value.
            Line::Field => match field.as_slice() {
                b"data" => self.data_line(),
                b"event" => self.event.clear(),
                _ => {}
            },
            Line::Event { .. } => self.event = std::mem::take(&mut self.event_value),
            Line::Data { .. } | Line::Ignore => {}
        }
        self.field = field;
        self.field.clear();
    }

    fn dispatch(&mut self, offset: usize, on_event: &mut dyn FnMut(usize, Event<'_>)) {
        if self.data_lines > 0 {
            let event: &[u8] = if self.event.is_empty() {
                b"message"
            } else {
                &self.event
            };
            on_event(
                offset,
                Event {
                    kind: event,
                    done: self.data_len == 6 && self.data_head.as_slice() == b"[DONE]",
                    head: &self.data_head,
                    mentions_usage: self.mentions_usage,
                    json: self.scan.finished(),
                },
            );
        }
        self.event.clear();
        self.data_lines = 0;
        self.data_head.clear();
        self.data_len = 0;
        self.tail.clear();
        self.mentions_usage = false;
        self.scan.reset();
    }
}

/// Whether `hay` contains `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Accumulates the usage reported by an event stream:
/// - OpenAI Chat Completions: the chunk whose `usage` is an object (the final one, sent when
///   the request set `stream_options.include_usage`; the others carry `"usage":null`);
///   `data: [DONE]` ends the stream and is not JSON.
/// - OpenAI Responses: the final event, `response.completed`, `response.incomplete` (stopped
///   at `max_output_tokens` or by the content filter) or `response.failed`, each carrying the
///   response object with its `usage` (OpenAI API reference, "Streaming events"; the earlier
///   `response.created` / `response.in_progress` carry `"usage":null`).
/// - Anthropic Messages: `message_start` (`message.usage`: input and cache counts, an initial
///   output count) then `message_delta` (`usage`, cumulative: its members replace the earlier
///   ones). A stream is complete only once a `message_delta` with usage was seen.
///
/// A stream that ends without its final usage may still have reported part of it: Anthropic's
/// `message_start` gives the input and cache counts before any output. [`StreamUsage::partial`]
/// returns that part, for the charge of an incomplete stream (`crate::partial`).
///
/// Only payloads containing `"usage"` are read; one that contains it and is not valid JSON (or
/// whose usage does not fit the bound) poisons the stream (unpriced).
///
/// The stream's last event is recognised ([`StreamUsage::ended`]): `data: [DONE]` (OpenAI Chat
/// Completions), `event: message_stop` (Anthropic), `event: response.completed`,
/// `response.incomplete` or `response.failed` (OpenAI Responses). A client may act on it before the connection-level end of the response, so the
/// filter books when it sees it. Neither can be forged by a model's output: text inside a JSON
/// string cannot start an SSE line nor equal a whole data payload.
#[derive(Debug, Default)]
pub struct StreamUsage {
    raw: Option<RawUsage>,
    anthropic: bool,
    complete: bool,
    poisoned: bool,
    ended: bool,
    model: Option<String>,
}

impl StreamUsage {
    /// Whether the stream's final event has been seen (see the type docs).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Whether a payload that mentions usage could not be read (the stream is unpriced).
    pub fn poisoned(&self) -> bool {
        self.poisoned
    }

    /// Takes one event; returns whether it is an OpenAI usage-only chunk (`"choices":[]` and a
    /// `usage` object: the one `stream_options.include_usage` adds).
    pub fn on_event(&mut self, event: &Event<'_>) -> bool {
        if event.done || event.kind == b"message_stop" || RESPONSES_FINAL.contains(&event.kind) {
            self.ended = true;
        }
        if !event.mentions_usage {
            return false;
        }
        let Some((body, choices_empty)) = event.json.as_ref().ok().and_then(|c| {
            let body = Body::from_captured(c)?;
            Some((
                body,
                Body::empty_array(c.get(crate::json_scan::Field::Choices)),
            ))
        }) else {
            self.poisoned = true;
            return false;
        };
        let anthropic = body.is_anthropic();
        let kind = body.kind.as_deref().unwrap_or("");
        match kind {
            "message_start" => {
                if let Some(message) = body.message {
                    self.anthropic = true;
                    self.model = message.model.or(self.model.take());
                    self.raw = message.usage;
                }
            }
            "message_delta" => {
                if let Some(usage) = body.usage {
                    self.anthropic = true;
                    self.raw.get_or_insert_with(RawUsage::default).merge(&usage);
                    self.complete = true;
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(response) = body.response {
                    if let Some(usage) = response.usage {
                        self.raw = Some(usage);
                        self.model = response.model.or(self.model.take());
                        self.complete = true;
                    }
                }
            }
            _ if !anthropic => {
                if let Some(usage) = body.usage {
                    self.raw = Some(usage);
                    self.model = body.model.or(self.model.take());
                    self.complete = true;
                    return choices_empty;
                }
            }
            _ => {}
        }
        false
    }

    /// The part of the usage the stream reported before it ended without its final usage (its
    /// input count known: Anthropic's `message_start`); `None` when it reported none, when
    /// its usage is complete (see [`StreamUsage::finish`]) or when a usage could not be read.
    pub fn partial(&self, request_model: Option<&str>) -> Option<Usage> {
        if self.poisoned || self.complete {
            return None;
        }
        let model = self
            .model
            .clone()
            .or_else(|| request_model.map(str::to_string));
        self.raw.as_ref()?.normalise(self.anthropic, model)
    }

    /// The stream's usage, if it reported a complete one (see the type docs).
    pub fn finish(&self, request_model: Option<&str>) -> Option<Usage> {
        if self.poisoned || !self.complete {
            return None;
        }
        let model = self
            .model
            .clone()
            .or_else(|| request_model.map(str::to_string));
        self.raw.as_ref()?.normalise(self.anthropic, model)
    }
}

/// The final events of an OpenAI Responses stream (each carries the response and its usage).
const RESPONSES_FINAL: [&[u8]; 3] = [
    b"response.completed",
    b"response.incomplete",
    b"response.failed",
];

/// A parser and an accumulator together: what the filter keeps per streaming response.
#[derive(Debug)]
pub struct StreamState {
    /// The parser.
    pub parser: SseParser,
    /// The accumulator.
    pub usage: StreamUsage,
}

impl StreamState {
    /// A fresh state bounded by `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        StreamState {
            parser: SseParser::new(max_event_bytes),
            usage: StreamUsage::default(),
        }
    }

    /// Feeds a chunk of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.feed_events(chunk, &mut |_, _| {});
    }

    /// Feeds a chunk; `on_event(end, usage_only)` for each event: its end offset in `chunk` (see
    /// [`SseParser::feed`]) and whether it is the usage-only chunk (see
    /// [`StreamUsage::on_event`]).
    pub fn feed_events(&mut self, chunk: &[u8], on_event: &mut dyn FnMut(usize, bool)) {
        let usage = &mut self.usage;
        self.parser
            .feed(chunk, &mut |end, e| on_event(end, usage.on_event(&e)));
    }

    /// Whether the stream's final event has been seen ([`StreamUsage::ended`]).
    pub fn ended(&self) -> bool {
        self.usage.ended()
    }

    /// The usage at the end of the stream (`None`: unpriced).
    pub fn finish(&self, request_model: Option<&str>) -> Option<Usage> {
        self.usage.finish(request_model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]], max: usize) -> Vec<(String, String)> {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |_, e| {
                out.push((
                    String::from_utf8_lossy(e.kind).into_owned(),
                    String::from_utf8_lossy(e.head).into_owned(),
                ))
            });
        }
        out
    }

    #[test]
    fn whatwg_field_rules() {
        let ev = events(
            &[b"\xEF\xBB\xBF: comment\nevent: ping\ndata:a\ndata: b\nid: 1\nretry: 5\n\ndata\n\n\n\nevent: x\n\ndata: tail"],
            1024,
        );
        // "data" alone gives an empty data line: data buffer "\n" → dispatched as "".
        assert_eq!(
            ev,
            vec![
                ("ping".into(), "a\nb".into()),
                ("message".into(), "".into()),
            ]
        );
        // The BOM split across chunks, and a stream that starts like one but is not.
        let ev = events(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"], 1024);
        assert_eq!(ev, vec![("message".into(), "x".into())]);
        let ev = events(&[b"\xEF", b"data: x\n\n"], 1024);
        assert_eq!(ev, vec![], "\\xEFdata is not the data field");
        let ev = events(&[b"da", b"ta", b":", b" ", b"y\n", b"\n"], 1024);
        assert_eq!(ev, vec![("message".into(), "y".into())]);
        let ev = events(&[b"event", b"\ndata:  z\n\n"], 1024);
        assert_eq!(ev, vec![("message".into(), " z".into())], "one space only");
    }

    #[test]
    fn cr_lf_split_between_chunks_is_one_line_end() {
        let ev = events(&[b"data: a\r", b"\ndata: b\r", b"\r", b"data: c\r\r"], 1024);
        assert_eq!(
            ev,
            vec![
                ("message".into(), "a\nb".into()),
                ("message".into(), "c".into())
            ]
        );
    }

    #[test]
    fn events_end_where_their_blank_line_ends() {
        let mut p = SseParser::new(64);
        let mut ends = Vec::new();
        let chunk = b"data: 1\n\ndata: 2\r\n\r\ndata: 3\r\r";
        p.feed(chunk, &mut |end, _| ends.push(end));
        assert_eq!(ends, vec![9, 20, 29]);
        assert_eq!(ends.last(), Some(&chunk.len()));
    }

    #[test]
    fn final_events_end_the_stream_and_text_cannot_forge_them() {
        let ended = |stream: &[u8]| {
            let mut st = StreamState::new(1024);
            st.feed(stream);
            st.ended()
        };
        assert!(ended(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"));
        assert!(ended(
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        ));
        assert!(ended(b"event: response.completed\ndata: {}\n\n"));
        assert!(!ended(b"data: [DONE]\n"), "not dispatched yet");
        assert!(!ended(b"data: [DONE] \n\n"));
        // A model's text is a JSON string: its newlines are escaped, it cannot start a line.
        assert!(!ended(
            b"data: {\"delta\":\"\\n\\nevent: message_stop\\ndata: [DONE]\\n\\n\"}\n\n"
        ));
        assert!(!ended(
            b"event: content_block_delta\ndata: {\"type\":\"message_stop\"}\n\n"
        ));
    }

    #[test]
    fn events_of_any_size_are_read_in_bounded_memory() {
        let mut st = StreamState::new(256);
        st.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"");
        for _ in 0..4096 {
            st.feed(&[b'x'; 1024]);
        }
        st.feed(b"\"}}],\"model\":\"m\",\"usage\":{\"prompt_tokens\":7}}\n\ndata: [DONE]\n\n");
        assert!(st.ended());
        assert_eq!(st.finish(None).map(|u| u.input_tokens), Some(7));
        assert!(st.parser.data_head.capacity() <= 64);
        // A usage larger than the bound: unpriced, not guessed.
        let mut st = StreamState::new(8);
        st.feed(b"data: {\"usage\":{\"prompt_tokens\":7}}\n\n");
        assert!(st.usage.poisoned());
        assert_eq!(st.finish(None), None);
    }

    #[test]
    fn the_usage_only_chunk_is_recognised() {
        let mut st = StreamState::new(1024);
        let mut seen = Vec::new();
        st.feed_events(
            b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n\
              data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n\
              data: {\"choices\":[ ],\"usage\":{\"prompt_tokens\":1}}\n\n\
              data: {\"choices\":[{}],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n",
            &mut |_, usage_only| seen.push(usage_only),
        );
        assert_eq!(seen, vec![false, true, true, false, false]);
    }

    const ANTHROPIC: &[u8] = include_bytes!("../testdata/anthropic_messages_stream.sse");
    const RESPONSES: &[u8] = include_bytes!("../testdata/openai_responses_stream.sse");

    fn fed(stream: &[u8]) -> StreamState {
        let mut st = StreamState::new(1024);
        st.feed(stream);
        st
    }

    #[test]
    fn an_anthropic_stream_cut_after_message_start_reports_its_input_in_part() {
        let cut = ANTHROPIC
            .windows(21)
            .position(|w| w == b"event: message_delta\n")
            .expect("message_delta");
        let st = fed(ANTHROPIC.get(..cut).expect("cut"));
        assert!(!st.ended());
        assert_eq!(st.finish(Some("req")), None, "no final usage");
        let got = st.usage.partial(Some("req")).expect("partial");
        // 25 + 3 cache creations + 5 cache reads; the 1 output token message_start announces.
        assert_eq!(
            (got.input_tokens, got.output_tokens, got.cached_input_tokens),
            (33, 1, 5)
        );
        assert_eq!(got.model.as_deref(), Some("claude-sonnet-4"));
        // The whole stream is complete: no partial usage, the final one.
        let whole = fed(ANTHROPIC);
        assert_eq!(whole.usage.partial(None), None);
        assert_eq!(whole.finish(None).map(|u| u.output_tokens), Some(15));
        // `message_stop` without a `message_delta` usage: ended, still only the part.
        let text = std::str::from_utf8(ANTHROPIC).expect("utf-8");
        let delta = text.find("event: message_delta").expect("delta");
        let stop = text.find("event: message_stop").expect("stop");
        let skipped = [text.get(..delta), text.get(stop..)]
            .map(|part| part.expect("split"))
            .concat();
        let st = fed(skipped.as_bytes());
        assert!(st.ended());
        assert_eq!(st.finish(None), None);
        assert_eq!(st.usage.partial(None).map(|u| u.input_tokens), Some(33));
        // Nothing reported (cut before message_start's usage): nothing in part either.
        assert_eq!(fed(b"event: ping\ndata: {}\n\n").usage.partial(None), None);
        // A usage that cannot be read poisons the partial usage too.
        let bad = fed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":-1}}}\n\n");
        assert_eq!(bad.usage.partial(None), None);
    }

    #[test]
    fn responses_streams_end_with_any_final_event_and_carry_its_usage() {
        let st = fed(RESPONSES);
        assert!(st.ended());
        let got = st.finish(None).expect("usage");
        assert_eq!((got.input_tokens, got.output_tokens), (37, 11));
        assert_eq!(got.model.as_deref(), Some("gpt-4.1-2025-04-14"));
        let text = std::str::from_utf8(RESPONSES).expect("utf-8");
        for last in ["response.incomplete", "response.failed"] {
            let st = fed(text.replace("response.completed", last).as_bytes());
            assert!(st.ended(), "{last} ends the stream");
            let got = st.finish(None).expect(last);
            assert_eq!((got.input_tokens, got.output_tokens), (37, 11), "{last}");
        }
        // Cut before the final event: the earlier events' `"usage":null` report nothing.
        let cut = text.find("event: response.completed").expect("final event");
        let st = fed(text.get(..cut).expect("cut").as_bytes());
        assert!(!st.ended());
        assert_eq!(st.finish(None), None);
        assert_eq!(st.usage.partial(None), None);
        // `response.failed` without usage (`"usage":null`): ended, no usage.
        let st = fed(b"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"usage\":null}}\n\n");
        assert!(st.ended());
        assert_eq!(st.finish(None), None);
    }

    #[test]
    fn chat_usage_before_a_cut_is_the_final_usage() {
        // The usage chunk arrived; the connection closed before `[DONE]`: priced from it.
        let st = fed(b"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n");
        assert!(!st.ended());
        assert_eq!(st.finish(None).map(|u| u.output_tokens), Some(3));
    }
}
