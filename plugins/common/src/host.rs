//! Thin helpers over the proxy-wasm ABI (`proxy_get_current_time_nanoseconds`,
//! `proxy_send_local_response`, `proxy_define_metric`), shared by the filters' glue.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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

/// Defines a counter (idempotent in the hosts: the same name gives the same id). `None` if the
/// host refuses; the filter then simply does not count.
pub fn define_counter(name: &str) -> Option<u32> {
    match hostcalls::define_metric(MetricType::Counter, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("could not define metric {name}: {e:?}");
            None
        }
    }
}

/// Adds 1 to a counter defined with [`define_counter`].
pub fn count(id: Option<u32>) {
    if let Some(id) = id {
        let _ = hostcalls::increment_metric(id, 1);
    }
}
