//! Phase 2, the request body, held whole by the host: its size bounded
//! (`max_request_body_bytes`), its `model` checked against `unknown_model`, and a stream's
//! request rewritten to ask for its usage (`crate::request`); a body this filter cannot read is
//! refused for a tenant whose requests must be read (`crate::unreadable`).

use proxy_wasm::types::{Action, BufferType};
use tollgate_common::host_calls::{self as host_calls, count, now_unix_millis};
use tollgate_common::signals;

use crate::request::RequestBody;
use crate::unpriced_calls::Endpoint;
use crate::unreadable::Unreadable;
use crate::worker::Shared;

use super::Request;

impl Request {
    /// The request body phase (`body_size`: the bytes the host holds).
    pub(crate) fn request_body(
        &mut self,
        shared: &Shared,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        if !self.hold_request || self.done {
            return Action::Continue;
        }
        if let Some(reason) = self.unreadable_headers {
            // Refused at the first bytes: the rest of the body is never read.
            return self.unreadable(shared, reason);
        }
        let config = &shared.config;
        self.request_bytes = u64::try_from(body_size).unwrap_or(u64::MAX);
        if body_size > config.max_request_body_bytes {
            self.hold_request = false;
            if self.must_read {
                let message = format!(
                    "request bodies over {} bytes cannot be read here, and this tenant's \
                     requests must be read (it has a budget or token limits)",
                    config.max_request_body_bytes
                );
                return self.refuse(
                    shared.counters.request_too_large,
                    "request_too_large",
                    (413, &[], "request_too_large", &message),
                );
            }
            count(shared.counters.request_too_large);
            return Action::Continue;
        }
        if !end_of_stream {
            // Held (buffered by the host) until the whole body is here: its end, or trailers.
            return Action::Pause;
        }
        self.read_body(shared, body_size)
    }

    /// A body followed by trailers (HTTP/2, or HTTP/1.1 chunked where the host passes them on)
    /// never reaches the body callback with `end_of_stream`: Envoy calls this instead, the body
    /// held, and would otherwise send it upstream unread. The body is read here, its size being
    /// the last body callback's.
    pub(crate) fn request_trailers(&mut self, shared: &Shared) -> Action {
        if !self.hold_request || self.done {
            return Action::Continue;
        }
        let body_size = usize::try_from(self.request_bytes).unwrap_or(usize::MAX);
        self.read_body(shared, body_size)
    }

    /// A request body this filter cannot read (`reason`): counted; refused with
    /// `reason.status()` and `{"error":"unreadable_body"}` (logged at most once per interval and
    /// worker) when the tenant's requests must be read, else passed on unread.
    fn unreadable(&mut self, shared: &Shared, reason: Unreadable) -> Action {
        self.hold_request = false;
        count(shared.counters.unreadable_reasons.id(reason));
        if !self.must_read {
            return Action::Continue;
        }
        if let Some(unlogged) = shared.logs.unreadable.due(now_unix_millis()) {
            log::warn!(
                "tenant {}: request refused, its body cannot be read ({}): {} \
                 ({unlogged} more since the last line)",
                self.tenant,
                reason.label(),
                reason.message()
            );
        }
        let headers: &[(&str, &str)] = match reason {
            // RFC 9110 section 12.5.3: the codings the server accepts in a request.
            Unreadable::ContentEncoding => &[("accept-encoding", "identity")],
            _ => &[],
        };
        self.refuse(
            shared.counters.unreadable_body,
            "unreadable_body",
            (
                reason.status(),
                headers,
                "unreadable_body",
                reason.message(),
            ),
        )
    }

    /// The whole request body (`body_size` bytes, held by the host): read, its model checked
    /// against `unknown_model`, and rewritten to ask for a stream's usage (see `request`).
    fn read_body(&mut self, shared: &Shared, body_size: usize) -> Action {
        self.hold_request = false;
        let config = &shared.config;
        let body = host_calls::buffer(BufferType::HttpRequestBody, body_size);
        if body.len() != body_size {
            return self.unreadable(shared, Unreadable::Host);
        }
        if body.is_empty() {
            // No body: nothing for the upstream to read either.
            return Action::Continue;
        }
        let mut request = match RequestBody::parse(&body) {
            Ok(request) => request,
            Err(reason) => return self.unreadable(shared, reason),
        };
        let model = request.take_model();
        if let Some(m) = model
            .as_deref()
            .filter(|m| config.refuses_model(&shared.table(), m, self.budgeted))
        {
            let message = format!("model {m} has no price at this gateway");
            return self.refuse_publishing(
                shared.counters.unknown_model,
                "unknown_model",
                |line| {
                    line.text(signals::field::MODEL, m);
                },
                (
                    config.unknown_model.status,
                    &[],
                    "model_not_priced",
                    &message,
                ),
            );
        }
        self.request_model = model;
        if self.responses_path && request.background() {
            if let Some(refused) = self.unpriced_call(shared, Endpoint::BackgroundResponse) {
                return refused;
            }
        }
        let declared = request.max_output_tokens();
        // Rewritten before the admission, which may pause the request for the service.
        if config.add_stream_usage
            && self.completions_path
            && request.stream()
            && request.include_usage() != Some(true)
        {
            if let Some(rewritten) = request.with_stream_usage() {
                match host_calls::replace_body(BufferType::HttpRequestBody, body_size, &rewritten) {
                    Ok(()) => {
                        self.strip_usage = true;
                        self.request_bytes = u64::try_from(rewritten.len()).unwrap_or(u64::MAX);
                    }
                    Err(e) => {
                        log::warn!("could not add stream_options.include_usage: host status {e}")
                    }
                }
            }
        }
        // The token limits, then the reservation.
        self.admit_body(shared, declared)
            .unwrap_or(Action::Continue)
    }
}
