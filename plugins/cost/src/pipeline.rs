//! One request through cost (wasm32), phase by phase (README, "How a request is priced"):
//! 1. [`admission`]: the request headers: the tenant, its spend (one shared-data read; a tenant
//!    with a budget and no record yet gets one), the budget check (locally, or on the rate limit
//!    service in global mode), then the body held to be read; a call that starts billable work
//!    the filter cannot price refused ([`unpriced_calls`]: by path here, a background Responses
//!    call with the body).
//! 2. [`request_body`]: the whole request body: its `model` (refused when it has no price and
//!    `unknown_model` says so, or when a token limit that applies to it is spent:
//!    [`token_limits`]), the request's estimate reserved against a budget ([`reservation`]:
//!    refused when spend + reserved has reached it), and for a stream on an OpenAI completions
//!    path without `stream_options.include_usage`, the body rewritten to ask for it
//!    (`crate::request`).
//! 3. [`response`]: the response headers and body, read as they pass
//!    (`crate::response_reader`), the usage event the filter caused removed.
//! 4. [`booking`]: when the body is complete as the client sees it (or the stream ends
//!    without that): the charge (`crate::charge`) booked in the ledger, the reservation
//!    released in the same write (or alone when nothing is charged) and, in global mode,
//!    queued for the service; the outcome published for the metrics filter and access logs.

mod admission;
mod booking;
mod request_body;
mod reservation;
mod response;
mod token_limits;
mod unpriced_calls;

use crate::global::Period;
use crate::ledger::{Budget, Hold, Spend};
use crate::response_reader::ResponseReader;
use crate::token_limits::window::TokenHold;
use crate::unreadable::Unreadable;

/// Refusal header: seconds until the exhausted budget resets (delay-seconds, as Retry-After).
pub(crate) const BUDGET_RESET_HEADER: &str = "x-tollgate-budget-reset";

/// One request's state.
#[derive(Default)]
pub(crate) struct Request {
    tenant: String,
    /// The tenant's spend read at the request headers.
    spend: Option<Spend>,
    /// The tenant's ledger key, made at the request headers (taken by the booking).
    ledger_key: Option<String>,
    /// The tenant's own ledger record and CAS token as read at the request headers (taken by
    /// the reservation, which starts from it).
    ledger_read: Option<(Vec<u8>, u32)>,
    /// Whether the tenant has a budget.
    budgeted: bool,
    /// Whether the tenant has token limits (`crate::token_limits`).
    token_limited: bool,
    /// The RateLimit-Policy and RateLimit values read at admission, for the response.
    token_headers: Option<(String, String)>,
    /// The keys of the token limits checked at admission, in the order of the tenant's limits
    /// that apply (`None`: not checked, nothing is counted).
    token_keys: Option<Vec<String>>,
    /// The reservations held in those windows since admission, in the same order (released by
    /// the booking, or when the request is refused).
    token_holds: Vec<Option<TokenHold>>,
    /// Whether a request body this filter cannot read is refused (`Request::admitted`).
    must_read: bool,
    /// Why the request headers make the body unreadable (`content-encoding`, `content-type`;
    /// only looked at when `must_read`): refused at the body's first bytes.
    unreadable_headers: Option<Unreadable>,
    /// The request body is being held to be read.
    hold_request: bool,
    /// The path is an OpenAI completions API (`request::stream_usage_on_request`).
    completions_path: bool,
    /// The path is `…/responses`, and the tenant's requests must be read: a body with
    /// `background: true` is an unpriced call (`crate::unpriced_calls`).
    responses_path: bool,
    /// The request body's `model`.
    request_model: Option<String>,
    /// The request body's size (bytes).
    request_bytes: u64,
    /// The filter added `include_usage`: the usage event is removed from the response.
    strip_usage: bool,
    /// The response status is 2xx.
    success: bool,
    /// The response being read.
    response: ResponseReader,
    /// The host's clock at this filter's request headers, once the tenant is known.
    started: Option<tollgate_common::clock::UnixNanos>,
    /// Microseconds from `started` to the first response body bytes this filter passed on
    /// (published as `first_byte_us` for the metrics filter's time to first token).
    first_byte_us: Option<u64>,
    /// The first response body bytes were seen (their time read once).
    first_byte_seen: bool,
    /// Signals set and spend booked (or the request refused).
    done: bool,
    /// The global check in flight, the request paused.
    check: Option<Check>,
    /// The global token limits' check in flight (end of the request body), the request paused.
    token_check: Option<TokenCheck>,
    /// The reservation held since the end of the request body (released by the booking).
    hold: Option<Hold>,
}

/// A global token limits' check in flight (`token_limits::global`).
struct TokenCheck {
    token: u32,
    /// Descriptors sent (one per limit that applies, in the tenant's order).
    descriptors: usize,
    /// The request's declared output bound, for the reservation that follows.
    declared: Option<u64>,
}

/// A global check in flight.
struct Check {
    token: u32,
    /// The descriptors' periods, in order.
    periods: Vec<Period>,
    /// The tenant's budget (for `on_error: local`).
    budget: Budget,
    /// The request headers ended the stream.
    end_of_stream: bool,
}
