//! The response as the filter reads it, chunk by chunk, without holding it: the body decoded
//! when it is gzip or deflate (`decode`), read by the parser of its media type (a JSON document
//! scanned as it passes, `json_scan`; server-sent events, `sse`), its end found from its
//! `Content-Length` (`body_end`), and, when the filter added `include_usage` to a stream's
//! request, the usage-only event it caused removed from the stream. At the end, the usage read,
//! or why there is none (`unpriced::Reason`).
//!
//! Host-free: the HTTP phases give it the header values and the chunks.

use crate::body_end::BodyEnd;
use crate::decode::{Coding, DecodeError, Decoder};
use crate::json_scan::{JsonScan, ScanError};
use crate::sse::StreamState;
use crate::unpriced::Reason;
use crate::usage::{scanned_body_usage, Usage};

/// What the response's content type makes the reader parse.
// The scanner (~200 bytes, fixed) lives in the request's state, itself one allocation: boxed,
// it cost an allocation and a free per JSON response.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// No response yet, or one whose content type carries no usage.
    Off,
    /// A JSON document, scanned as it passes.
    Json(JsonScan),
    /// Server-sent events.
    Stream(Box<StreamState>),
}

/// The response's headers the reader needs (values as received, `None` when absent).
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseHead<'a> {
    /// `content-length`.
    pub content_length: Option<&'a [u8]>,
    /// `content-encoding`.
    pub content_encoding: Option<&'a [u8]>,
    /// `content-type`.
    pub content_type: Option<&'a [u8]>,
}

/// Limits of the reader, from the plugin configuration.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// `max_event_bytes`: the largest JSON value or event read (bytes), also the most held
    /// while removing the usage event.
    pub max_event_bytes: usize,
    /// `max_decoded_bytes`: the most a compressed body is decoded to (bytes).
    pub max_decoded_bytes: u64,
}

/// What one chunk did.
#[derive(Debug, PartialEq, Eq)]
pub struct Fed {
    /// The chunk to pass on instead of the one received (the usage event removed, or an
    /// incomplete event held back); `None` to pass it on as it is.
    pub replacement: Option<Vec<u8>>,
    /// The body is complete for the client once this chunk is passed on (its `Content-Length`
    /// reached, the host's end of stream, or a stream's final event): book now.
    pub complete: bool,
}

/// One response being read.
pub struct ResponseReader {
    mode: Mode,
    decoder: Option<Decoder>,
    /// A content coding the filter cannot decode.
    undecodable: bool,
    /// The bytes of the current event, held while the usage event is removed (`Some` while
    /// removing).
    held: Option<Vec<u8>>,
    /// The body's progress against its `Content-Length`.
    body_end: BodyEnd,
    /// Body bytes read (decoded), for the estimate.
    bytes: u64,
}

impl Default for ResponseReader {
    fn default() -> Self {
        ResponseReader {
            mode: Mode::Off,
            decoder: None,
            undecodable: false,
            held: None,
            body_end: BodyEnd::default(),
            bytes: 0,
        }
    }
}

/// Whether `media` (a media type without parameters) is JSON: `application/json` or a
/// `+json` suffix, case-insensitively (RFC 9110 section 8.3.1).
fn is_json(media: &[u8]) -> bool {
    media.eq_ignore_ascii_case(b"application/json")
        || media
            .len()
            .checked_sub(5)
            .and_then(|at| media.get(at..))
            .is_some_and(|suffix| suffix.eq_ignore_ascii_case(b"+json"))
}

fn saturating_len(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

impl ResponseReader {
    /// Sets the reader up from the response's headers. `strip_usage`: the filter added
    /// `include_usage` to the request, so the usage-only event is removed from an event stream
    /// (only an uncompressed one). Returns whether the response's `content-length` must be
    /// removed (the stream changes size: the host frames it anew).
    pub fn start(
        &mut self,
        head: &ResponseHead<'_>,
        strip_usage: bool,
        limits: ReadLimits,
    ) -> bool {
        self.body_end = BodyEnd::new(head.content_length);
        let coding = Coding::of(head.content_encoding);
        self.undecodable = coding == Coding::Unsupported;
        self.decoder = Decoder::new(coding, limits.max_decoded_bytes);
        let content_type = head.content_type.unwrap_or_default();
        let media = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if media.eq_ignore_ascii_case(b"text/event-stream") {
            self.mode = Mode::Stream(Box::new(StreamState::new(limits.max_event_bytes)));
            if strip_usage && coding == Coding::Identity {
                self.held = Some(Vec::new());
                return head.content_length.is_some();
            }
        } else if is_json(media) {
            self.mode = Mode::Json(JsonScan::new(limits.max_event_bytes));
        }
        false
    }

    /// Reads one chunk of the body (`body_size`: the size the host announced, `chunk`: the
    /// bytes read; `end_of_stream`: the host's end of the body).
    pub fn feed(
        &mut self,
        chunk: &[u8],
        body_size: usize,
        end_of_stream: bool,
        max_held: usize,
    ) -> Fed {
        let complete = self.body_end.feed(body_size) || end_of_stream;
        let mut replacement = None;
        if self.held.is_some() {
            let out = self.strip_chunk(chunk, complete, max_held);
            // (`strip_chunk` fed the stream parser.)
            self.bytes = self.bytes.saturating_add(saturating_len(chunk));
            if out != chunk {
                replacement = Some(out);
            }
        } else if let Some(decoder) = self.decoder.as_mut() {
            let (mode, seen) = (&mut self.mode, &mut self.bytes);
            decoder.feed(chunk, &mut |b| inspect(mode, seen, b));
            if complete {
                decoder.finish(&mut |b| inspect(mode, seen, b));
            }
        } else if self.undecodable {
            // Not readable: only its size counts (for the estimate).
            self.bytes = self.bytes.saturating_add(saturating_len(chunk));
        } else {
            inspect(&mut self.mode, &mut self.bytes, chunk);
        }
        let ended = matches!(&self.mode, Mode::Stream(state) if state.ended());
        Fed {
            replacement,
            complete: complete || ended,
        }
    }

    /// Body bytes read so far (decoded), for the estimate of an unpriced response.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The response's usage, or why there is none (`request_model`: the request's `model`,
    /// for a stream that does not name one).
    pub fn outcome(&self, request_model: Option<&str>) -> Result<Usage, Reason> {
        if self.undecodable {
            return Err(Reason::Encoding);
        }
        match self.decoder.as_ref().and_then(Decoder::error) {
            Some(DecodeError::Corrupt) => return Err(Reason::Encoding),
            Some(DecodeError::TooLarge) => return Err(Reason::DecodeLimit),
            None => {}
        }
        match &self.mode {
            Mode::Off => Err(Reason::ContentType),
            Mode::Json(scan) => match scan.finished() {
                Ok(captured) => scanned_body_usage(captured, request_model).ok_or(Reason::NoUsage),
                Err(ScanError::Invalid) => Err(Reason::Malformed),
                Err(ScanError::Incomplete) => Err(Reason::Incomplete),
                Err(ScanError::TooLarge) => Err(Reason::TooLarge),
            },
            Mode::Stream(state) => state
                .finish(request_model)
                .ok_or(if state.usage.poisoned() {
                    Reason::Malformed
                } else if state.ended() {
                    Reason::NoUsage
                } else {
                    Reason::Incomplete
                }),
        }
    }

    /// The usage a stream reported in part before it ended without its final usage (see
    /// [`crate::sse::StreamUsage::partial`]); `None` for anything else, and when the body could
    /// not be decoded.
    pub fn partial(&self, request_model: Option<&str>) -> Option<Usage> {
        if self.undecodable || self.decoder.as_ref().and_then(Decoder::error).is_some() {
            return None;
        }
        match &self.mode {
            Mode::Stream(state) => state.usage.partial(request_model),
            Mode::Off | Mode::Json(_) => None,
        }
    }

    /// Streams with the usage event this filter caused: the chunk as it goes on (events
    /// complete, the usage-only one removed, an incomplete last event held for the next chunk).
    fn strip_chunk(&mut self, chunk: &[u8], end: bool, max_held: usize) -> Vec<u8> {
        let (Mode::Stream(state), Some(held)) = (&mut self.mode, self.held.as_mut()) else {
            return chunk.to_vec();
        };
        let mut out = Vec::with_capacity(chunk.len().saturating_add(held.len()));
        let mut from = 0usize;
        state.feed_events(chunk, &mut |at, usage_only| {
            let piece = chunk.get(from..at).unwrap_or_default();
            if usage_only {
                held.clear();
            } else {
                out.append(held);
                out.extend_from_slice(piece);
            }
            from = at;
        });
        held.extend_from_slice(chunk.get(from..).unwrap_or_default());
        // The end of the body or of the stream (nothing after the final event is read), or an
        // event too large to hold: what is held goes on, and everything after it as it comes.
        if end || state.ended() || held.len() > max_held {
            out.append(held);
            self.held = None;
        }
        out
    }
}

/// Feeds decoded response bytes to the parser of the response's content type.
fn inspect(mode: &mut Mode, seen: &mut u64, bytes: &[u8]) {
    *seen = seen.saturating_add(saturating_len(bytes));
    match mode {
        Mode::Off => {}
        Mode::Json(scan) => scan.feed(bytes),
        Mode::Stream(state) => state.feed(bytes),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    const LIMITS: ReadLimits = ReadLimits {
        max_event_bytes: 64 << 10,
        max_decoded_bytes: 1 << 20,
    };

    /// OpenAI's Chat Completions response as its API reference documents it (usage trimmed to
    /// the counted members).
    const COMPLETION: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}"#;

    /// A streamed completion with the usage-only event `include_usage` adds, then `[DONE]`.
    const STREAM: &[u8] = b"data: {\"id\":\"c\",\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n\
data: [DONE]\n\n";

    fn head<'a>(
        length: Option<&'a [u8]>,
        coding: Option<&'a [u8]>,
        media: &'a [u8],
    ) -> ResponseHead<'a> {
        ResponseHead {
            content_length: length,
            content_encoding: coding,
            content_type: Some(media),
        }
    }

    /// Feeds `body` in chunks of `step` bytes, as the host would; returns what went on and
    /// the chunk index at which the body was complete.
    fn run(
        reader: &mut ResponseReader,
        body: &[u8],
        step: usize,
        eos: bool,
    ) -> (Vec<u8>, Option<usize>) {
        let mut out = Vec::new();
        let mut complete_at = None;
        let chunks: Vec<&[u8]> = body.chunks(step).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i == chunks.len().saturating_sub(1);
            let fed = reader.feed(chunk, chunk.len(), eos && last, LIMITS.max_event_bytes);
            out.extend_from_slice(fed.replacement.as_deref().unwrap_or(chunk));
            if fed.complete && complete_at.is_none() {
                complete_at = Some(i);
            }
        }
        (out, complete_at)
    }

    #[test]
    fn a_json_body_is_read_and_complete_at_its_content_length() {
        let mut reader = ResponseReader::default();
        let length = COMPLETION.len().to_string();
        let strip = reader.start(
            &head(
                Some(length.as_bytes()),
                None,
                b"application/json; charset=utf-8",
            ),
            false,
            LIMITS,
        );
        assert!(!strip);
        let (out, complete_at) = run(&mut reader, COMPLETION, 50, false);
        assert_eq!(out, COMPLETION);
        assert_eq!(
            complete_at,
            Some(COMPLETION.len().div_ceil(50).saturating_sub(1))
        );
        let usage = reader.outcome(Some("gpt-4o-mini")).expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (19, 10));
        assert_eq!(usage.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
        assert_eq!(reader.bytes(), COMPLETION.len() as u64);
    }

    #[test]
    fn a_gzip_body_is_decoded_before_it_is_read() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(COMPLETION).expect("gzip");
        let body = gz.finish().expect("gzip");
        let mut reader = ResponseReader::default();
        reader.start(
            &head(None, Some(b"gzip"), b"application/json"),
            false,
            LIMITS,
        );
        let (out, complete_at) = run(&mut reader, &body, 7, true);
        assert_eq!(out, body, "the compressed body passes on unchanged");
        assert_eq!(complete_at, Some(body.len().div_ceil(7).saturating_sub(1)));
        let usage = reader.outcome(None).expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (19, 10));
        assert_eq!(
            reader.bytes(),
            COMPLETION.len() as u64,
            "decoded bytes are counted"
        );
    }

    #[test]
    fn the_usage_event_the_filter_caused_is_removed_in_any_chunking() {
        let expected: Vec<u8> = {
            let text = std::str::from_utf8(STREAM).expect("utf-8");
            let kept: Vec<&str> = text
                .split_inclusive("\n\n")
                .filter(|e| !e.contains("\"choices\":[]"))
                .collect();
            kept.concat().into_bytes()
        };
        for step in [1, 3, 16, 64, STREAM.len()] {
            let mut reader = ResponseReader::default();
            let length = STREAM.len().to_string();
            let strip = reader.start(
                &head(Some(length.as_bytes()), None, b"text/event-stream"),
                true,
                LIMITS,
            );
            assert!(strip, "the stream changes size: content-length goes");
            let (out, complete_at) = run(&mut reader, STREAM, step, false);
            assert_eq!(out, expected, "chunks of {step}");
            assert!(complete_at.is_some());
            let usage = reader.outcome(Some("gpt-4o-mini")).expect("usage");
            assert_eq!((usage.input_tokens, usage.output_tokens), (7, 3));
        }
    }

    #[test]
    fn a_client_that_asked_for_usage_itself_gets_the_stream_unchanged() {
        let mut reader = ResponseReader::default();
        assert!(!reader.start(&head(None, None, b"Text/Event-Stream"), false, LIMITS));
        let (out, complete_at) = run(&mut reader, STREAM, 10, false);
        assert_eq!(out, STREAM);
        assert!(complete_at.is_some(), "the final event completes the body");
        assert!(reader.outcome(None).is_ok());
    }

    #[test]
    fn what_cannot_be_read_says_why() {
        let mut reader = ResponseReader::default();
        reader.start(&head(None, Some(b"br"), b"application/json"), false, LIMITS);
        run(&mut reader, COMPLETION, 64, true);
        assert_eq!(reader.outcome(None).err(), Some(Reason::Encoding));
        assert_eq!(
            reader.bytes(),
            COMPLETION.len() as u64,
            "its size still counts"
        );

        let mut reader = ResponseReader::default();
        reader.start(&head(None, None, b"text/plain"), false, LIMITS);
        run(&mut reader, COMPLETION, 64, true);
        assert_eq!(reader.outcome(None).err(), Some(Reason::ContentType));

        let mut reader = ResponseReader::default();
        reader.start(
            &head(None, None, b"application/problem+json"),
            false,
            LIMITS,
        );
        run(&mut reader, COMPLETION.get(..40).expect("prefix"), 64, true);
        assert_eq!(reader.outcome(None).err(), Some(Reason::Incomplete));

        let mut reader = ResponseReader::default();
        reader.start(
            &head(None, Some(b"gzip"), b"application/json"),
            false,
            LIMITS,
        );
        run(&mut reader, b"not gzip at all", 64, true);
        assert_eq!(reader.outcome(None).err(), Some(Reason::Encoding));

        let mut reader = ResponseReader::default();
        reader.start(&head(None, None, b"text/event-stream"), false, LIMITS);
        run(&mut reader, STREAM.get(..60).expect("prefix"), 64, true);
        assert_eq!(reader.outcome(None).err(), Some(Reason::Incomplete));
    }

    #[test]
    fn a_stream_cut_after_message_start_gives_its_usage_in_part_only_when_readable() {
        let stream: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"type\":\"message\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":40,\"output_tokens\":1}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n";
        let mut reader = ResponseReader::default();
        reader.start(&head(None, None, b"text/event-stream"), false, LIMITS);
        let (_, complete_at) = run(&mut reader, stream, 7, true);
        assert_eq!(
            complete_at,
            Some(stream.len().div_ceil(7) - 1),
            "host's end"
        );
        assert_eq!(reader.outcome(None), Err(Reason::Incomplete));
        let got = reader.partial(None).expect("partial");
        assert_eq!((got.input_tokens, got.output_tokens), (40, 1));
        // The same bytes as a corrupt gzip body: not read, nothing in part.
        let mut corrupt = ResponseReader::default();
        corrupt.start(
            &head(None, Some(b"gzip"), b"text/event-stream"),
            false,
            LIMITS,
        );
        run(&mut corrupt, stream, 7, true);
        assert_eq!(corrupt.outcome(None), Err(Reason::Encoding));
        assert_eq!(corrupt.partial(None), None);
        // A JSON body never gives a usage in part.
        let mut json = ResponseReader::default();
        json.start(&head(None, None, b"application/json"), false, LIMITS);
        run(&mut json, &COMPLETION[..COMPLETION.len() / 2], 7, true);
        assert_eq!(json.partial(None), None);
    }
}
