//! proxy-wasm host calls made on the raw ABI where the proxy-wasm Rust SDK (0.2.5) would trap
//! the filter: its `hostcalls` wrappers `panic!` on any status they do not expect, and a host
//! may answer these calls with other statuses for reasons the filter cannot control (a full
//! metrics zone: `InternalFailure` from the nginx host; ngx_wasm_module answers `NotFound` in
//! other cases). Here every status comes back as an `Err` with its code (proxy-wasm ABI 0.2.1,
//! `proxy_status_t`), and the filter carries on.
#![allow(unsafe_code)] // The ABI imports themselves; each call's SAFETY is stated.

use proxy_wasm::types::MetricType;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

/// `proxy_get_header_map_value`: the value (`None`: no such header, status `NotFound`), or the
/// host's status code. Envoy answers another status for the response headers of an HTTP call
/// that got no response (a timeout, a reset), on which the SDK's wrapper panics.
pub fn header_map_value(
    map: proxy_wasm::types::MapType,
    key: &str,
) -> Result<Option<Vec<u8>>, u32> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: `key` is live for the call; the out-pointers are live locals.
    let status = unsafe {
        proxy_get_header_map_value(map as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    };
    match status {
        0 if data.is_null() => Ok(Some(Vec::new())),
        // SAFETY: on Ok the host returns `size` bytes allocated through this module's
        // `proxy_on_memory_allocate` and hands them to the guest (as the SDK's wrapper assumes).
        0 => Ok(Some(unsafe { Vec::from_raw_parts(data, size, size) })),
        1 => Ok(None),
        s => Err(s),
    }
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
