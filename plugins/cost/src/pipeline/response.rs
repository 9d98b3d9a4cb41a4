//! Phase 3, the response: the spend headers, the status, then the body read as it passes
//! (`crate::response_reader`), the chunk replaced when the usage event the filter caused is
//! removed, and the booking made once the body is complete for the client.

use proxy_wasm::types::{Action, BufferType, MapType};
use tollgate_common::clock::{micros, UnixNanos};
use tollgate_common::host_calls::{self as host_calls, add_response_header};
use tollgate_common::prefetch::HostReader;

use crate::response_reader::{ReadLimits, ResponseHead};
use crate::worker::{PhaseReads as R, Shared};

use super::Request;

impl Request {
    /// The response headers phase.
    pub(crate) fn response_headers(&mut self, shared: &Shared, end_of_stream: bool) -> Action {
        if self.done {
            return Action::Continue;
        }
        let config = &shared.config;
        self.spend_headers(shared);
        self.token_limit_headers();
        use MapType::HttpResponseHeaders as H;
        // In one host call where the host offers it (else each when used).
        let values = shared.reads.response.fetch(HostReader);
        let status = values.get(R::STATUS).unwrap_or_default();
        self.success = status.len() == 3 && status.first() == Some(&b'2');
        if end_of_stream {
            self.finish(shared);
            return Action::Continue;
        }
        let (length, coding, media) = (
            values.get(R::CONTENT_LENGTH),
            values.get(R::RESPONSE_ENCODING),
            values.get(R::MEDIA_TYPE),
        );
        let head = ResponseHead {
            content_length: length.as_deref(),
            content_encoding: coding.as_deref(),
            content_type: media.as_deref(),
        };
        let limits = ReadLimits {
            max_event_bytes: config.max_event_bytes,
            max_decoded_bytes: config.max_decoded_bytes,
        };
        if self.response.start(&head, self.strip_usage, limits) {
            // The stream changes size: the host frames it anew.
            host_calls::set_header(H, "content-length", None);
        }
        Action::Continue
    }

    /// The response body phase: the chunk read (and replaced when the usage event is
    /// removed); the booking made before the chunk that completes the body is passed on.
    pub(crate) fn response_body(
        &mut self,
        shared: &Shared,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        if self.done {
            return Action::Continue;
        }
        // The clock, read at most once in this callback (a one-chunk body's first byte and end).
        let mut clock = None;
        if body_size > 0 && !self.first_byte_seen {
            // Passed on by this callback's answer (every chunk continues).
            self.first_byte_seen = true;
            clock = host_calls::now();
            self.first_byte_us = micros(self.started, clock);
        }
        let chunk = host_calls::buffer(BufferType::HttpResponseBody, body_size);
        let fed = self.response.feed(
            &chunk,
            body_size,
            end_of_stream,
            shared.config.max_event_bytes,
        );
        if let Some(out) = fed.replacement {
            if let Err(e) = host_calls::replace_body(BufferType::HttpResponseBody, body_size, &out)
            {
                log::warn!("could not remove the usage event: host status {e}");
            }
        }
        if fed.complete {
            self.finish_at(shared, clock.map(UnixNanos::millis));
        }
        Action::Continue
    }

    /// `x-tollgate-spend-*` on the response, with `spend_headers`.
    fn spend_headers(&self, shared: &Shared) {
        if let (true, Some(s)) = (shared.config.spend_headers, self.spend) {
            add_response_header("x-tollgate-spend-day-nano-usd", &s.day.to_string());
            add_response_header("x-tollgate-spend-month-nano-usd", &s.month.to_string());
            add_response_header("x-tollgate-spend-total-nano-usd", &s.total.to_string());
        }
    }
}
