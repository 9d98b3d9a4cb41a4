//! Thin helpers over the proxy-wasm ABI, shared by the filters' glue. They never trap: the SDK's
//! trait helpers (`get_http_request_header`, `get_shared_data`, `get_plugin_configuration`, ...)
//! `unwrap()` host errors and non-UTF-8 header values, which a client controls, and its
//! `hostcalls` wrappers `panic!` on statuses they do not expect (a host may answer `NotFound`
//! or `Unimplemented` where Envoy answers `Ok`), so filters call these, made on the raw ABI
//! (`crate::raw`), instead. A host error is logged or read as "absent", as each says.

use std::cell::{Cell, RefCell};

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use crate::clock::UnixNanos;
use crate::error_envelope::{self, ErrorFormat};
use crate::{abi_codec, raw};

/// The host's wall clock in Unix seconds (0 if the host does not answer).
pub fn now_unix_secs() -> u64 {
    now().map_or(0, UnixNanos::secs)
}

/// The host's wall clock (`None` if the host does not answer).
pub fn now() -> Option<UnixNanos> {
    raw::current_time_nanos().ok().map(UnixNanos)
}

/// Installs the filters' logger at `level`: the `log` crate's macros write through
/// `proxy_log`, and a line the host refuses is dropped (the SDK's logger unwraps that status).
/// A panic, which the lints forbid but a dependency could still raise, is logged at critical
/// before the guest traps. Idempotent.
pub fn init_log(level: log::LevelFilter) {
    static LOGGER: HostLogger = HostLogger;
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| {
            let _ = raw::log(LogLevel::Critical, &info.to_string());
        }));
    }
    log::set_max_level(level);
}

struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        let _ = raw::log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

std::thread_local! {
    /// The `error_format` of the filter whose HTTP callback runs now ([`enter_request`]).
    static ERROR_FORMAT: Cell<ErrorFormat> = const { Cell::new(ErrorFormat::Auto) };
    /// The request target its filter kept during this request ([`keep_request_target`]).
    static KEPT_TARGET: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Begins one HTTP callback of a request (the skeleton calls it): the refusals sent until
/// [`leave_request`] use `format` and the target the request's filter kept earlier, if any.
/// A VM serves several requests, and may hold several plugin configurations, in turn: what a
/// request keeps lives in its HTTP context between callbacks.
pub fn enter_request(format: ErrorFormat, kept_target: Option<Vec<u8>>) {
    ERROR_FORMAT.with(|f| f.set(format));
    KEPT_TARGET.with(|t| *t.borrow_mut() = kept_target);
}

/// Ends the HTTP callback begun with [`enter_request`]: the target kept so far, for the
/// request's context to hold until its next callback. The state is the default again (`auto`,
/// no target), which the callbacks that skip [`enter_request`] rely on.
pub fn leave_request() -> Option<Vec<u8>> {
    ERROR_FORMAT.with(|f| f.set(ErrorFormat::Auto));
    KEPT_TARGET.with(|t| t.borrow_mut().take())
}

/// Keeps the request target (`:path`, as read in the request headers callback) for a refusal
/// in a later callback of the same request: Envoy gives a body callback neither the request
/// headers nor the attributes made of them (`request.path`), so a filter that reads the target
/// anyway and may refuse from the body hands it over here (a move, nothing computed). Only a
/// filter with `KEEPS_REQUEST_TARGET` (the skeleton's `Filter`) may call it.
pub fn keep_request_target(target: Vec<u8>) {
    KEPT_TARGET.with(|t| *t.borrow_mut() = Some(target));
}

/// Sends a local response with a JSON error body and `extra_headers` (a `content-type:
/// application/json` first); the request stops here. The body is in the envelope of the
/// request's API (`crate::error_envelope`: OpenAI's on its paths, Anthropic's on the Messages
/// API, else `{"error":"<error>","message":"<message>"}`), or the one configured with
/// `error_format`. The target is read only here, on a refusal, and only for `auto`.
pub fn send_json_error(status: u32, extra_headers: &[(&str, &str)], error: &str, message: &str) {
    let envelope = ERROR_FORMAT.with(Cell::get).envelope(request_path);
    let body = error_envelope::body(envelope, status, error, message);
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(extra_headers.len().saturating_add(1));
    headers.push(("content-type", b"application/json"));
    headers.extend(extra_headers.iter().map(|(n, v)| (*n, v.as_bytes())));
    if let Err(e) = raw::send_local_response(status, &headers, &body) {
        log::error!("could not send the local response {status}: host status {e}");
    }
}

/// The request's path as the filters' rules read it (`crate::path::normalize` under the default
/// policy, query dropped; a target without a normal form, as in the `invalid_path` refusal,
/// gives its path as received): from the target kept for this request
/// ([`keep_request_target`]), else `:path` (Envoy answers an empty value outside the request
/// headers callback), else the `request.path` attribute. `None` without any.
fn request_path() -> Option<String> {
    let target = KEPT_TARGET
        .with(|t| t.borrow().clone())
        .or_else(|| request_header_bytes(":path").filter(|t| !t.is_empty()))
        .or_else(|| property(&["request", "path"]).filter(|t| !t.is_empty()))?;
    if let Ok(normal) = crate::path::normalize(&target, &crate::path::PathPolicy::default()) {
        return Some(normal.path.into_owned());
    }
    let raw = target.split(|&b| b == b'?').next().unwrap_or_default();
    Some(String::from_utf8_lossy(raw).into_owned())
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
    now().map_or(0, UnixNanos::millis)
}

/// Sets the root context's tick period (ms); `Err` with the host's status.
///
/// # Errors
/// The host's status code when it refuses the period.
pub fn set_tick_period_ms(period_ms: u32) -> Result<(), u32> {
    raw::set_tick_period_ms(period_ms)
}

/// The plugin configuration bytes (empty if none or on a host error).
pub fn plugin_configuration() -> Vec<u8> {
    buffer(BufferType::PluginConfiguration, usize::MAX)
}

/// At most `max` bytes of a buffer from its start (a body chunk, the plugin configuration, a
/// call's response body); empty when absent or on a host error.
pub fn buffer(buffer: BufferType, max: usize) -> Vec<u8> {
    // Nothing to read: no host call. Kong's module passes a dispatch response's body length to
    // `on_http_call_response` as 32 bits: an announced 1 TiB reads as 0 while its reader has no
    // body, and reading it then aborts a debug build's worker (`reader->body` assertion).
    if max == 0 {
        return Vec::new();
    }
    raw::buffer(buffer, 0, max)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Replaces the whole of a body buffer (its `size` bytes, as the body callback was given) with
/// `data`, which may be shorter or longer.
///
/// `proxy_set_buffer_bytes(start 0, length, data)` is called with `length = max(size,
/// data.len())`: Envoy and nginx-compat replace the whole buffer for any length at least its
/// size, while Kong's ngx_wasm_module cuts `data` to `length` (`ngx_http_wasm_set_req_body`:
/// `body->len = ngx_min(body->len, max)`) and reads length 0 as "prepend". One call every host
/// reads the same way.
///
/// # Errors
/// The host's status code.
pub fn replace_body(buffer: BufferType, size: usize, data: &[u8]) -> Result<(), u32> {
    raw::set_buffer(buffer, 0, size.max(data.len()), data)
}

/// A header's raw value in `map`; `None` when absent or on a host error.
pub fn header_bytes(map: MapType, name: &str) -> Option<Vec<u8>> {
    raw::header_value(map, name).ok().flatten()
}

/// Every (name, value) of `map` in order; empty on a host error.
pub fn headers(map: MapType) -> Vec<(String, Vec<u8>)> {
    raw::header_map(map).unwrap_or_default()
}

/// A property's value (`["source", "address"]`, `["response", "code_details"]`, a signal's
/// name); `None` when the host has none or answers with an error (e.g. ngx_wasm_module's
/// `NotFound` for a property it does not map).
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    raw::property(path).ok().flatten()
}

/// [`property`] of a path already in the ABI's encoding ([`crate::abi_codec::encode_path`]:
/// segments joined by NUL; a one-segment path, such as a signal's name, is its own bytes).
pub fn property_encoded(path: &[u8]) -> Option<Vec<u8>> {
    raw::property_encoded(path).ok().flatten()
}

/// Refuses a configuration whose state would live in a shared-data zone that evicts, unless it
/// allows it (`crate::eviction`): `false` when the filter must not load (the reason is logged);
/// an allowed evicting zone is logged as a warning.
pub fn eviction_allowed(key: &str, allow_eviction: bool) -> bool {
    let policy = property(&crate::eviction::property_path(key));
    match crate::eviction::check(key, policy.as_deref(), allow_eviction) {
        Ok(None) => true,
        Ok(Some(warning)) => {
            log::warn!("{warning}");
            true
        }
        Err(refusal) => {
            log::error!("{refusal}");
            false
        }
    }
}

/// Sets a property for the current request.
///
/// # Errors
/// The host's status code (ngx_wasm_module answers `NotFound` for keys outside its namespaces).
pub fn set_property(path: &[&str], value: &[u8]) -> Result<(), u32> {
    raw::set_property(path, value)
}

/// A request header's raw value; `None` when absent or on a host error.
pub fn request_header_bytes(name: &str) -> Option<Vec<u8>> {
    header_bytes(MapType::HttpRequestHeaders, name)
}

/// A request header's value as text: bytes that are not UTF-8 (obs-text, RFC 9110 section 5.5)
/// become U+FFFD, so such a value can never equal a configured ASCII string or parse as a token.
pub fn request_header(name: &str) -> Option<String> {
    request_header_bytes(name).map(abi_codec::text)
}

/// The request's header map, read once (`proxy_get_header_map_pairs`), for a filter that looks
/// at several of its fields or at every name (`abi_codec::HeaderList`).
///
/// # Errors
/// The host's status when the map cannot be read (or is not well-formed: `SerializationFailure`).
pub fn request_header_list() -> Result<abi_codec::HeaderList, u32> {
    abi_codec::HeaderList::new(raw::header_map_bytes(MapType::HttpRequestHeaders)?)
        .ok_or(raw::SERIALIZATION_FAILURE)
}

/// Every value of request header `name` and of its CGI spellings (`x_api_key` for `x-api-key`,
/// [`crate::http::cgi_fold`]), in order. One read of the whole map.
///
/// # Errors
/// The host's status when the map cannot be read.
pub fn request_header_values(name: &str) -> Result<Vec<Vec<u8>>, u32> {
    let list = request_header_list()?;
    Ok(list.values(name).into_iter().map(<[u8]>::to_vec).collect())
}

/// Sets (`Some`, replacing the value) or removes (`None`) a header of `map`; a host error is
/// logged.
pub fn set_header(map: MapType, name: &str, value: Option<&str>) {
    if let Err(status) = raw::set_header_value(map, name, value) {
        log::warn!("could not set header {name} ({map:?}): host status {status}");
    }
}

/// Sets (`Some`) or removes (`None`) a request header; a host error is logged.
pub fn set_request_header(name: &str, value: Option<&str>) {
    set_header(MapType::HttpRequestHeaders, name, value);
}

/// Adds a response header; a host error is logged.
pub fn add_response_header(name: &str, value: &str) {
    if let Err(status) = raw::add_header_value(MapType::HttpResponseHeaders, name, value) {
        log::warn!("could not add response header {name}: host status {status}");
    }
}

/// A header of the response to a `dispatch_http_call`, as text (see [`request_header`]).
/// `None` when absent, and when the call got no response at all (Envoy then answers a status the
/// SDK's wrapper panics on: `crate::raw`).
pub fn http_call_response_header(name: &str) -> Option<String> {
    header_bytes(MapType::HttpCallResponseHeaders, name).map(abi_codec::text)
}

/// The body of the response to a `dispatch_http_call`, at most `max` bytes (bytes).
pub fn http_call_response_body(max: usize) -> Vec<u8> {
    buffer(BufferType::HttpCallResponseBody, max)
}

/// Refuses a request whose target path normalisation rejected: 400 with a JSON body
/// (`invalid_path`) and a log line naming the filter.
pub fn refuse_path(filter: &str, error: crate::path::PathError) {
    log::info!("{filter}: 400 invalid_path: {error}");
    send_json_error(400, &[], "invalid_path", error.description());
}

/// Refuses a request whose authority has no canonical host (`crate::authority`): 400 with a
/// JSON body (`invalid_authority`) and a log line naming the filter.
pub fn refuse_authority(filter: &str, error: crate::authority::AuthorityError) {
    log::info!("{filter}: 400 invalid_authority: {error}");
    send_json_error(400, &[], "invalid_authority", error.description());
}

/// Makes the request carry the path its rules matched: rewrites `:path` to the normal form
/// when it differs from the one received. Envoy forwards the rewritten `:path`; the nginx host
/// does not apply `:path` writes, nginx proxies its own normalised URI instead (README).
pub fn forward_normal_path(path: &crate::path::RequestPath<'_>) {
    if path.changed {
        set_request_header(":path", Some(&path.target()));
    }
}
