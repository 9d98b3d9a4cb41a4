//! The per-request state a chain of filters shares ([`Stream`]), what it is made of, and the
//! stream callbacks ([`StreamCallback`]) that see it.

/// What a filter callback returned (spec: `proxy_action_t`): 0 is `Continue`, anything else
/// (`Pause`, Envoy's `StopAllIteration*`) is `Pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

use crate::deferred_headers::DeferredMap;
use crate::header_map::HeaderMap;

/// A local response requested with `proxy_send_local_response`: HTTP status, the details
/// string (Envoy's response code details), the body, extra headers (names lower-case) and the
/// gRPC status. The embedding answers a gRPC request with a trailers-only gRPC response made
/// of it instead (Envoy's `sendLocalReply`; `tollgate_services::grpc_status::grpc_local_reply`
/// in nginx).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub details: Vec<u8>,
    pub body: Vec<u8>,
    pub headers: HeaderMap,
    /// The ABI's `grpc_status` argument when it counts as set: 0 (OK) to 16 (UNAUTHENTICATED),
    /// as Envoy reads it (`Context::sendLocalResponse`, source/extensions/common/wasm/context.cc:
    /// `Ok <= grpc_status <= MaximumKnown`, anything else `nullopt`). The SDKs pass -1 for
    /// "none" (the Rust SDK's `send_http_response`); `send_grpc_response` passes its code.
    pub grpc_status: Option<u32>,
}

impl LocalResponse {
    /// The gRPC status argument of `proxy_send_local_response` (an `i32` on the ABI) as
    /// [`LocalResponse::grpc_status`]: `Some` for 0 to 16, `None` for anything else.
    pub fn grpc_status_arg(arg: i32) -> Option<u32> {
        u32::try_from(arg).ok().filter(|s| *s <= 16)
    }
}

/// Properties computed on demand by the embedding (e.g. `request.path`, `source.address`,
/// `response.code`). `path` is the property path as the ABI passes it, segments joined by `\0`
/// (e.g. `b"request\0path"`). Values use Envoy's encodings (strings as bytes, integers as
/// 8-byte little-endian where Envoy does so; the Tollgate filters parse decimal text too).
/// `Any`: an embedding can take its own source back from a finished stream and reuse its
/// allocation.
pub trait PropertySource: std::any::Any {
    /// Writes the value of `path` into `value` (cleared first: the host core passes one buffer,
    /// reused from read to read); false when the source has no such property.
    fn property(&self, path: &[u8], value: &mut Vec<u8>) -> bool;
}

/// Per-request state shared by the filters of a chain.
#[derive(Default)]
pub struct Stream {
    /// The request's headers; while `request_headers_deferred` is set, not built (empty).
    pub request_headers: HeaderMap,
    pub request_trailers: HeaderMap,
    /// The response's headers; while `response_headers_deferred` is set, not built (empty).
    pub response_headers: HeaderMap,
    pub response_trailers: HeaderMap,
    /// Set by the embedding instead of `request_headers` / `response_headers`: the map read in
    /// place from the embedding's list, with the filters' edits, until a filter needs it built
    /// ([`Stream::load_headers`]; see [`crate::deferred_headers`]).
    pub request_headers_deferred: Option<DeferredMap>,
    pub response_headers_deferred: Option<DeferredMap>,
    /// The body chunk the current `on_*_body` callback sees (`proxy_get_buffer_bytes` of
    /// `HttpRequestBody`/`HttpResponseBody`); filters may replace it.
    pub request_body: Vec<u8>,
    pub response_body: Vec<u8>,
    /// Set when a filter changed the corresponding map or buffer, so the embedding copies back.
    pub request_headers_changed: bool,
    pub request_trailers_changed: bool,
    pub response_headers_changed: bool,
    pub response_trailers_changed: bool,
    pub request_body_changed: bool,
    pub response_body_changed: bool,
    /// Properties set by filters (`proxy_set_property`), keyed by `\0`-joined path; read first.
    /// An embedding may start a stream with a cleared store of an earlier one (its
    /// allocations reused).
    pub properties: crate::property_store::PropertyStore,
    /// Fallback for properties the filters did not set.
    pub property_source: Option<Box<dyn PropertySource>>,
    /// Set by `proxy_send_local_response`; the embedding sends it and stops the chain.
    pub local_response: Option<LocalResponse>,
    /// Set by `proxy_continue_stream` (resume after `Action::Pause`).
    pub resumed: bool,
    /// Set by `proxy_close_stream` (Envoy resets the stream): the embedding closes the
    /// connection (nginx: 444) or fails the request. (Added to the contract.)
    pub closed: bool,
    /// Set by an embedding that never has request trailers (nginx discards them): the map
    /// reads as empty and writes to it return `BadArgument`, Envoy's status for a trailer map
    /// the stream does not have. (Added.)
    pub request_trailers_unavailable: bool,
}

impl Stream {
    /// Builds the request headers (`response: false`) or the response headers (`true`) if
    /// they are deferred (the source's map with the edits applied), replacing whatever the map
    /// held.
    pub fn load_headers(&mut self, response: bool) {
        let (map, deferred) = if response {
            (
                &mut self.response_headers,
                &mut self.response_headers_deferred,
            )
        } else {
            (
                &mut self.request_headers,
                &mut self.request_headers_deferred,
            )
        };
        if let Some(d) = deferred.take() {
            *map = d.build();
        }
    }

    /// The first value of request header `name` (lower-case, or a pseudo-header), built or
    /// deferred: the request as the filters see it now, their edits included.
    pub fn request_header(&self, name: &[u8]) -> Option<&[u8]> {
        match &self.request_headers_deferred {
            Some(d) => d.first(name),
            None => self
                .request_headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice()),
        }
    }

    /// The entry count of the request headers (`response: false`) or the response headers,
    /// built or not.
    pub fn headers_len(&self, response: bool) -> usize {
        let (map, deferred) = if response {
            (&self.response_headers, &self.response_headers_deferred)
        } else {
            (&self.request_headers, &self.request_headers_deferred)
        };
        deferred.as_ref().map_or(map.len(), DeferredMap::len)
    }
}

/// The HTTP stream callbacks a module may export (proxy-wasm ABI 0.2.1, `proxy_on_<name>`). Every
/// one is optional: this host skips the callback a module does not export (as proxy-wasm-cpp-host,
/// Envoy, does; Kong's ngx_wasm_module calls it anyway) or exports as a constant stub (stubs.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamCallback {
    /// `proxy_on_request_headers`.
    RequestHeaders,
    /// `proxy_on_request_body`.
    RequestBody,
    /// `proxy_on_request_trailers`.
    RequestTrailers,
    /// `proxy_on_response_headers`.
    ResponseHeaders,
    /// `proxy_on_response_body`.
    ResponseBody,
    /// `proxy_on_response_trailers`.
    ResponseTrailers,
    /// `proxy_on_log`.
    Log,
    /// `proxy_on_done`.
    Done,
}

impl StreamCallback {
    /// The export's name: `proxy_on_<name>`.
    pub fn name(self) -> &'static str {
        match self {
            StreamCallback::RequestHeaders => "proxy_on_request_headers",
            StreamCallback::RequestBody => "proxy_on_request_body",
            StreamCallback::RequestTrailers => "proxy_on_request_trailers",
            StreamCallback::ResponseHeaders => "proxy_on_response_headers",
            StreamCallback::ResponseBody => "proxy_on_response_body",
            StreamCallback::ResponseTrailers => "proxy_on_response_trailers",
            StreamCallback::Log => "proxy_on_log",
            StreamCallback::Done => "proxy_on_done",
        }
    }

    /// Every stream callback, in the order of a request.
    pub const ALL: [StreamCallback; 8] = [
        StreamCallback::RequestHeaders,
        StreamCallback::RequestBody,
        StreamCallback::RequestTrailers,
        StreamCallback::ResponseHeaders,
        StreamCallback::ResponseBody,
        StreamCallback::ResponseTrailers,
        StreamCallback::Log,
        StreamCallback::Done,
    ];
}
