//! An incremental parser of the `text/event-stream` format (WHATWG HTML Living Standard,
//! "Server-sent events", section 9.2.6 "Interpreting an event stream") and the usage
//! accumulator fed by its events.
//!
//! The stream arrives in chunks split anywhere (inside a line, between CR and LF). The parser
//! keeps only the current line and the current event's `data` and `event` fields, each bounded
//! by `max_event_bytes`: a longer line or event stops parsing for good ([`SseParser::overflowed`])
//! and the response counts as unpriced. It never holds more than that, whatever the stream's
//! length. Lines end with LF, CRLF or CR; a leading U+FEFF BOM is skipped; lines starting with
//! `:` are comments; `data` lines are joined with LF; a blank line dispatches the event; fields
//! other than `data` and `event` (`id`, `retry`) are ignored; an unterminated last event is
//! discarded, as the standard requires.

use crate::usage::{Body, RawUsage, Usage};

/// Default bound on a line and on an event's data (bytes).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

/// Longest `event:` value kept (bytes); longer names are truncated (they match nothing).
const MAX_EVENT_NAME: usize = 64;

/// The UTF-8 byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The incremental event-stream parser (bounded state, see the module docs).
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    event: Vec<u8>,
    after_cr: bool,
    started: bool,
    overflow: bool,
    max: usize,
}

impl SseParser {
    /// A parser whose line and event data are bounded by `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        SseParser {
            line: Vec::new(),
            data: Vec::new(),
            event: Vec::new(),
            after_cr: false,
            started: false,
            overflow: false,
            max: max_event_bytes,
        }
    }

    /// Whether a line or an event exceeded the bound (parsing stopped).
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Feeds the next chunk; `on_event(event_type, data)` is called for each complete event
    /// (`event_type` is `message` when the event had no `event` field; `data` without the final
    /// LF).
    pub fn feed(&mut self, chunk: &[u8], on_event: &mut dyn FnMut(&[u8], &[u8])) {
        if self.overflow {
            return;
        }
        if !self.started {
            // The BOM may itself be split across chunks: join the first bytes (once per stream).
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(chunk);
            if head.len() < BOM.len() && BOM.starts_with(&head) {
                self.line = head;
                return;
            }
            self.started = true;
            let rest = head.strip_prefix(BOM).unwrap_or(&head);
            return self.feed_started(rest, on_event);
        }
        self.feed_started(chunk, on_event);
    }

    fn feed_started(&mut self, mut chunk: &[u8], on_event: &mut dyn FnMut(&[u8], &[u8])) {
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while !chunk.is_empty() {
            let Some(end) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') else {
                if self.line.len().saturating_add(chunk.len()) > self.max {
                    self.stop();
                } else {
                    self.line.extend_from_slice(chunk);
                }
                return;
            };
            let (head, tail) = chunk.split_at(end);
            let cr = tail.first() == Some(&b'\r');
            let mut rest = tail.get(1..).unwrap_or(&[]);
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = rest.get(1..).unwrap_or(&[]),
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if self.line.is_empty() {
                self.line_done(head, on_event);
            } else {
                if self.line.len().saturating_add(head.len()) > self.max {
                    return self.stop();
                }
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                self.line_done(&line, on_event);
                line.clear();
                self.line = line;
            }
            if self.overflow {
                return;
            }
            chunk = rest;
        }
    }

    fn stop(&mut self) {
        self.overflow = true;
        self.line = Vec::new();
        self.data = Vec::new();
        self.event = Vec::new();
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut dyn FnMut(&[u8], &[u8])) {
        if line.is_empty() {
            if !self.data.is_empty() {
                // The data buffer ends with the LF appended after each data line.
                let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
                let event: &[u8] = if self.event.is_empty() {
                    b"message"
                } else {
                    &self.event
                };
                on_event(event, data);
            }
            self.data.clear();
            self.event.clear();
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(at) => {
                let (f, v) = line.split_at(at);
                let v = v.get(1..).unwrap_or(&[]);
                (f, v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        match field {
            b"data" => {
                if self
                    .data
                    .len()
                    .saturating_add(value.len())
                    .saturating_add(1)
                    > self.max
                {
                    return self.stop();
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.event.clear();
                self.event
                    .extend_from_slice(value.get(..MAX_EVENT_NAME).unwrap_or(value));
            }
            _ => {}
        }
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
/// - OpenAI Responses: `response.completed` (its `response.usage`).
/// - Anthropic Messages: `message_start` (`message.usage`: input and cache counts, an initial
///   output count) then `message_delta` (`usage`, cumulative: its members replace the earlier
///   ones). A stream is complete only once a `message_delta` with usage was seen.
///
/// Only payloads containing `"usage"` are parsed as JSON; one that contains it and is not
/// valid JSON poisons the stream (unpriced).
///
/// The stream's last event is recognised ([`StreamUsage::ended`]): `data: [DONE]` (OpenAI Chat
/// Completions), `event: message_stop` (Anthropic), `event: response.completed` (OpenAI
/// Responses). A client may act on it before the connection-level end of the response, so the
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

    /// Takes one event (`event` type, `data` payload).
    pub fn on_event(&mut self, event: &[u8], data: &[u8]) {
        if data == b"[DONE]" || event == b"message_stop" || event == b"response.completed" {
            self.ended = true;
        }
        if !contains(data, b"\"usage\"") {
            return;
        }
        let Ok(body) = serde_json::from_slice::<Body>(data) else {
            self.poisoned = true;
            return;
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
            "response.completed" => {
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
                }
            }
            _ => {}
        }
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
        let usage = &mut self.usage;
        self.parser.feed(chunk, &mut |e, d| usage.on_event(e, d));
    }

    /// Whether the stream's final event has been seen ([`StreamUsage::ended`]).
    pub fn ended(&self) -> bool {
        self.usage.ended()
    }

    /// The usage at the end of the stream (`None`: unpriced).
    pub fn finish(&self, request_model: Option<&str>) -> Option<Usage> {
        if self.parser.overflowed() {
            return None;
        }
        self.usage.finish(request_model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]], max: usize) -> (Vec<(String, String)>, bool) {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |e, d| {
                out.push((
                    String::from_utf8_lossy(e).into_owned(),
                    String::from_utf8_lossy(d).into_owned(),
                ))
            });
        }
        (out, p.overflowed())
    }

    #[test]
    fn whatwg_field_rules() {
        let (ev, over) = events(
            &[b"\xEF\xBB\xBF: comment\nevent: ping\ndata:a\ndata: b\nid: 1\nretry: 5\n\ndata\n\n\n\nevent: x\n\ndata: tail"],
            1024,
        );
        assert!(!over);
        assert_eq!(
            ev,
            vec![
                ("ping".into(), "a\nb".into()),
                ("message".into(), "".into()),
            ]
        );
        // "data" alone gives an empty data line: data buffer "\n" → dispatched as "".
    }

    #[test]
    fn cr_lf_split_between_chunks_is_one_line_end() {
        let (ev, _) = events(&[b"data: a\r", b"\ndata: b\r", b"\r", b"data: c\r\r"], 1024);
        assert_eq!(
            ev,
            vec![
                ("message".into(), "a\nb".into()),
                ("message".into(), "c".into())
            ]
        );
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
    fn long_lines_stop_parsing() {
        let (ev, over) = events(&[b"data: 0123456789", b"0123456789\n\n"], 16);
        assert!(over);
        assert!(ev.is_empty());
        let (_, over) = events(&[b"data: 01234\ndata: 56789\n", b"data: abcdef\n\n"], 16);
        assert!(over, "the event's data is bounded too");
    }
}
