//! proxy-wasm host calls made on the raw ABI where the proxy-wasm Rust SDK (0.2.5) would trap
//! the filter: its `hostcalls` wrappers `panic!` on any status they do not expect, and a host
//! may answer these calls with other statuses for reasons the filter cannot control (a full
//! metrics zone: `InternalFailure` from the nginx host; ngx_wasm_module answers `NotFound` in
//! other cases). Here every status comes back as an `Err` with its code (proxy-wasm ABI 0.2.1,
//! `proxy_status_t`), and the filter carries on. Reading a status outside the SDK's `Status`
//! enum into it would also be undefined behaviour; here it stays a `u32`.
//!
//! One call stays on the SDK: `dispatch_http_call`, whose wrapper registers the call's token
//! with the SDK's dispatcher (so that `on_http_call_response` reaches the right context). It
//! traps only on statuses other than `Ok`, `BadArgument` and `InternalFailure`.
#![allow(unsafe_code)] // The ABI imports themselves; each call's SAFETY is stated.

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use crate::abi_codec::{decode_map, encode_map, encode_path};

/// The ABI's `NotFound` status.
const NOT_FOUND: u32 = 1;
/// The ABI's `SerializationFailure` status (here: a host's map that does not decode).
/// The ABI's `SerializationFailure` status.
pub const SERIALIZATION_FAILURE: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_log(level: u32, message: *const u8, message_len: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_len: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_len: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_property(
        path: *const u8,
        path_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_call_foreign_function(
        name: *const u8,
        name_len: usize,
        argument: *const u8,
        argument_len: usize,
        results: *mut *mut u8,
        results_len: *mut usize,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
}

/// Takes ownership of bytes the host returned through an out-pointer pair.
///
/// # Safety
/// `data` is null or points to `size` bytes the host allocated through this module's
/// `proxy_on_memory_allocate` (the SDK's allocator: a `Vec<u8>` of exactly that capacity,
/// forgotten), whose ownership the ABI hands to the guest, as the SDK's own wrappers assume.
unsafe fn owned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    // SAFETY: the caller's contract.
    (!data.is_null()).then(|| unsafe { Vec::from_raw_parts(data, size, size) })
}

/// A call that returns bytes: `Ok(None)` for `NotFound`.
fn bytes_of(status: u32, data: *mut u8, size: usize) -> Result<Option<Vec<u8>>, u32> {
    // SAFETY: `data`/`size` come from the host's answer to the call just made; on a status
    // other than Ok the host wrote nothing (and a non-null pointer is still ours to free).
    let value = unsafe { owned(data, size) };
    match status {
        // Ok without data: present and empty (a header or property with an empty value).
        0 => Ok(Some(value.unwrap_or_default())),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

fn status_of(status: u32) -> Result<(), u32> {
    match status {
        0 => Ok(()),
        s => Err(s),
    }
}

/// `proxy_log`: the host's status (a log line that cannot be written is dropped).
pub fn log(level: LogLevel, message: &str) -> Result<(), u32> {
    // SAFETY: `message` is live for the call; the host copies it.
    status_of(unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) })
}

/// `proxy_get_current_time_nanoseconds`: Unix time in nanoseconds.
pub fn current_time_nanos() -> Result<u64, u32> {
    let mut t = 0u64;
    // SAFETY: `t` is a live local; the host writes 8 bytes.
    status_of(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// `proxy_set_tick_period_milliseconds`.
pub fn set_tick_period_ms(period_ms: u32) -> Result<(), u32> {
    // SAFETY: a plain integer.
    status_of(unsafe { proxy_set_tick_period_milliseconds(period_ms) })
}

/// `proxy_get_buffer_bytes`: at most `max` bytes from `start`; `Ok(None)` when the buffer does
/// not exist.
pub fn buffer(buffer: BufferType, start: usize, max: usize) -> Result<Option<Vec<u8>>, u32> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the out-pointers are live locals.
    let status = unsafe { proxy_get_buffer_bytes(buffer as u32, start, max, &mut data, &mut size) };
    bytes_of(status, data, size)
}

/// `proxy_set_buffer_bytes`: replaces `size` bytes from `start` with `data`.
pub fn set_buffer(buffer: BufferType, start: usize, size: usize, data: &[u8]) -> Result<(), u32> {
    // SAFETY: `data` is live for the call; the host copies it.
    status_of(unsafe {
        proxy_set_buffer_bytes(buffer as u32, start, size, data.as_ptr(), data.len())
    })
}

/// `proxy_get_header_map_pairs`: every (name, value) of `map`, in order. A map the host encoded
/// wrongly is `Err(SerializationFailure)`.
pub fn header_map(map: MapType) -> Result<Vec<(String, Vec<u8>)>, u32> {
    decode_map(&header_map_bytes(map)?).ok_or(SERIALIZATION_FAILURE)
}

/// `proxy_get_header_map_pairs` in the ABI's encoding, undecoded (read it with
/// [`crate::abi_codec::for_each_entry`]: one allocation for the whole map).
pub fn header_map_bytes(map: MapType) -> Result<Vec<u8>, u32> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the out-pointers are live locals.
    let status = unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    Ok(bytes_of(status, data, size)?.unwrap_or_default())
}

/// `proxy_get_header_map_value`: the value of `name` in `map`, `Ok(None)` when absent.
pub fn header_value(map: MapType, name: &str) -> Result<Option<Vec<u8>>, u32> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `name` and the out-pointers are live for the call.
    let status = unsafe {
        proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    bytes_of(status, data, size)
}

/// `proxy_replace_header_map_value` (`Some`) or `proxy_remove_header_map_value` (`None`).
pub fn set_header_value(map: MapType, name: &str, value: Option<&str>) -> Result<(), u32> {
    // SAFETY: `name` and `value` are live for the call; the host copies them.
    status_of(unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(
                map as u32,
                name.as_ptr(),
                name.len(),
                v.as_ptr(),
                v.len(),
            ),
            None => proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()),
        }
    })
}

/// `proxy_add_header_map_value`.
pub fn add_header_value(map: MapType, name: &str, value: &str) -> Result<(), u32> {
    // SAFETY: `name` and `value` are live for the call; the host copies them.
    status_of(unsafe {
        proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// `proxy_get_property`: the value at `path`, `Ok(None)` when the host has none.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, u32> {
    property_encoded(&encode_path(path))
}

/// [`property`] of a path already in the ABI's encoding (`crate::abi_codec::encode_path`: the
/// segments joined by NUL; a one-segment path is its own bytes), for paths fixed at compile time.
pub fn property_encoded(path: &[u8]) -> Result<Option<Vec<u8>>, u32> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `path` and the out-pointers are live for the call.
    let status = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) };
    bytes_of(status, data, size)
}

/// `proxy_call_foreign_function`: foreign function `name`'s answer to `argument` (empty when the
/// host returned none). Envoy answers `NotFound` for a name it does not know.
pub fn call_foreign_function(name: &str, argument: &[u8]) -> Result<Vec<u8>, u32> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `name`, `argument` and the out-pointers are live for the call.
    let status = unsafe {
        proxy_call_foreign_function(
            name.as_ptr(),
            name.len(),
            argument.as_ptr(),
            argument.len(),
            &mut data,
            &mut size,
        )
    };
    match bytes_of(status, data, size)? {
        Some(answer) => Ok(answer),
        None => Err(NOT_FOUND),
    }
}

/// `proxy_set_property`.
pub fn set_property(path: &[&str], value: &[u8]) -> Result<(), u32> {
    let path = encode_path(path);
    // SAFETY: `path` and `value` are live for the call; the host copies them.
    status_of(unsafe { proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len()) })
}

/// `proxy_send_local_response` with no gRPC status (-1) and empty details.
pub fn send_local_response(status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> Result<(), u32> {
    let headers = encode_map(headers).ok_or(SERIALIZATION_FAILURE)?;
    // SAFETY: every buffer is live for the call; the host copies them.
    status_of(unsafe {
        proxy_send_local_response(
            status,
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}
/// `proxy_define_metric`: the metric's id, or the host's status code.
pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, u32> {
    let mut id = 0u32;
    // SAFETY: `name` and `id` are live for the duration of the call; the host writes 4 bytes.
    let status = unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
    if status == 0 {
        Ok(id)
    } else {
        Err(status)
    }
}

/// `proxy_increment_metric`: `Err` with the host's status code.
pub fn increment_metric(id: u32, offset: i64) -> Result<(), u32> {
    // SAFETY: plain integers.
    match unsafe { proxy_increment_metric(id, offset) } {
        0 => Ok(()),
        s => Err(s),
    }
}

/// `proxy_record_metric`: `Err` with the host's status code.
pub fn record_metric(id: u32, value: u64) -> Result<(), u32> {
    // SAFETY: plain integers.
    match unsafe { proxy_record_metric(id, value) } {
        0 => Ok(()),
        s => Err(s),
    }
}
