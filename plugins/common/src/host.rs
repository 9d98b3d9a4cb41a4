//! Thin helpers over the proxy-wasm ABI, shared by the filters' glue. They never trap: the SDK's
//! trait helpers (`get_http_request_header`, `get_shared_data`, `get_plugin_configuration`, ...)
//! `unwrap()` host errors and non-UTF-8 header values, which a client controls, so filters call
//! these instead.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};

/// The host's wall clock in Unix seconds (0 if the host answers before 1970 or not at all).
pub fn now_unix_secs() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Sends a local response with a JSON error body (`{"error":…,"message":…}`) and
/// `extra_headers`; the request stops here.
pub fn send_json_error(status: u32, extra_headers: &[(&str, &str)], error: &str, message: &str) {
    let body = crate::http::json_error_body(error, message);
    let mut headers: Vec<(&str, &str)> = Vec::with_capacity(extra_headers.len().saturating_add(1));
    headers.push(("content-type", "application/json"));
    headers.extend_from_slice(extra_headers);
    if let Err(e) = hostcalls::send_http_response(status, headers, Some(&body)) {
        log::error!("could not send the local response {status}: {e:?}");
    }
}

/// Defines a metric (idempotent in the hosts: the same name gives the same id). `None` if the
/// host refuses (e.g. its metrics zone is full); the filter then simply does not record it and
/// carries on (the raw ABI: the SDK would trap on that status).
pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    match crate::raw::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(status) => {
            log::warn!("could not define metric {name}: host status {status}");
            None
        }
    }
}

/// Defines a counter, see [`define_metric`].
pub fn define_counter(name: &str) -> Option<u32> {
    define_metric(MetricType::Counter, name)
}

/// Adds 1 to a counter defined with [`define_counter`].
pub fn count(id: Option<u32>) {
    if let Some(id) = id {
        let _ = crate::raw::increment_metric(id, 1);
    }
}

/// Adds `n` to a counter defined with [`define_counter`].
pub fn count_n(id: Option<u32>, n: u64) {
    if let (Some(id), Ok(n)) = (id, i64::try_from(n)) {
        if n > 0 {
            let _ = crate::raw::increment_metric(id, n);
        }
    }
}

/// Records `value` in a histogram (or sets a gauge) defined with [`define_metric`].
pub fn record(id: Option<u32>, value: u64) {
    if let Some(id) = id {
        let _ = crate::raw::record_metric(id, value);
    }
}

/// The host's wall clock in Unix milliseconds (0 if unavailable).
pub fn now_unix_millis() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The plugin configuration bytes (empty if none or on a host error).
pub fn plugin_configuration() -> Vec<u8> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// A request header's raw value; `None` when absent or on a host error.
pub fn request_header_bytes(name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
}

/// A request header's value as text: bytes that are not UTF-8 (obs-text, RFC 9110 section 5.5)
/// become U+FFFD, so such a value can never equal a configured ASCII string or parse as a token.
pub fn request_header(name: &str) -> Option<String> {
    request_header_bytes(name).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Sets (`Some`) or removes (`None`) a request header; a host error is logged.
pub fn set_request_header(name: &str, value: Option<&str>) {
    if let Err(e) = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value) {
        log::warn!("could not set request header {name}: {e:?}");
    }
}

/// Adds a response header; a host error is logged.
pub fn add_response_header(name: &str, value: &str) {
    if let Err(e) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
        log::warn!("could not add response header {name}: {e:?}");
    }
}

/// A header of the response to a `dispatch_http_call`, as text (see [`request_header`]).
/// `None` when absent, and when the call got no response at all (Envoy then answers a status the
/// SDK's wrapper panics on: `crate::raw`).
pub fn http_call_response_header(name: &str) -> Option<String> {
    crate::raw::header_map_value(MapType::HttpCallResponseHeaders, name)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The body of the response to a `dispatch_http_call`, at most `max` bytes (bytes).
pub fn http_call_response_body(max: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, max)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Refuses a request whose target path normalisation rejected: 400 with a JSON body
/// (`invalid_path`) and a log line naming the filter.
pub fn refuse_path(filter: &str, error: crate::path::PathError) {
    log::info!("{filter}: 400 invalid_path: {error}");
    send_json_error(400, &[], "invalid_path", error.description());
}

/// Makes the request carry the path its rules matched: rewrites `:path` to the normal form
/// when it differs from the one received. Envoy forwards the rewritten `:path`; the nginx host
/// does not apply `:path` writes, nginx proxies its own normalised URI instead (README).
pub fn forward_normal_path(path: &crate::path::RequestPath<'_>) {
    if path.changed {
        set_request_header(":path", Some(&path.target()));
    }
}
