//! Properties computed from the nginx request (`proxy_get_property` falls back to these when
//! no filter set the property). Names and encodings follow Envoy's attributes
//! (<https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/advanced/attributes>):
//! strings as bytes, integers as 8-byte little-endian, timestamps as nanoseconds since the epoch
//! (8-byte little-endian). `ngx.<variable>` reads any nginx variable, like ngx_wasm_module.

use ngx::ffi::{ngx_connection_t, ngx_http_request_t, ngx_str_t, ngx_uint_t};
use tollgate_host::PropertySource;

use crate::util::bytes;

/// The property source of one request.
pub struct NgxProps {
    /// The request; valid as long as the stream that owns this source (freed with the request).
    pub r: *mut ngx_http_request_t,
    /// `response.code_details` when the response is a filter's local response.
    pub local_details: std::rc::Rc<std::cell::RefCell<Option<Vec<u8>>>>,
}

fn int(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// `ip:port` and port of a socket address, as nginx formats it.
///
/// # Safety
/// `sa` must be a valid sockaddr of `len` bytes.
unsafe fn sockaddr_parts(
    sa: *mut ngx::ffi::sockaddr,
    len: ngx::ffi::socklen_t,
) -> Option<(Vec<u8>, i64)> {
    if sa.is_null() {
        return None;
    }
    let mut buf = [0u8; 128];
    // SAFETY: ngx_sock_ntop writes at most `buf.len()` bytes; ngx_inet_get_port reads the address.
    unsafe {
        let n = ngx::ffi::ngx_sock_ntop(sa, len, buf.as_mut_ptr(), buf.len(), 1);
        let port = i64::from(ngx::ffi::ngx_inet_get_port(sa));
        Some((buf.get(..n)?.to_vec(), port))
    }
}

impl NgxProps {
    fn var(&self, name: &[u8]) -> Option<Vec<u8>> {
        let r = self.r;
        let mut lowered = name.to_ascii_lowercase();
        // SAFETY: the request is live; ngx_http_get_variable reads `name` (not retained).
        unsafe {
            let key = ngx::ffi::ngx_hash_key(lowered.as_mut_ptr(), lowered.len());
            let mut s = ngx_str_t {
                len: lowered.len(),
                data: lowered.as_mut_ptr(),
            };
            let v = ngx::ffi::ngx_http_get_variable(r, &mut s, key);
            if v.is_null() || (*v).not_found() != 0 || (*v).valid() == 0 {
                return None;
            }
            let len = usize::try_from((*v).len()).ok()?;
            if (*v).data.is_null() {
                return Some(Vec::new());
            }
            Some(std::slice::from_raw_parts((*v).data, len).to_vec())
        }
    }

    fn header_in(&self, name: &[u8]) -> Option<Vec<u8>> {
        // SAFETY: the request's header list is live.
        unsafe {
            for h in crate::util::table_elts(&raw mut (*self.r).headers_in.headers) {
                if (*h).hash != 0 && bytes(&(*h).key).eq_ignore_ascii_case(name) {
                    return Some(bytes(&(*h).value).to_vec());
                }
            }
        }
        None
    }

    /// `via_upstream` when the upstream answered; Envoy-like details otherwise.
    fn code_details(&self) -> Option<Vec<u8>> {
        if let Ok(d) = self.local_details.try_borrow() {
            if let Some(d) = d.as_ref() {
                return Some(d.clone());
            }
        }
        // SAFETY: the request and its upstream are live while the request is.
        unsafe {
            let u = (*self.r).upstream;
            if u.is_null() {
                return if (*self.r).headers_out.status == 0 {
                    None
                } else {
                    Some(b"local_reply".to_vec())
                };
            }
            if (*u).headers_in.status_n != 0
                && (*u).headers_in.status_n == (*self.r).headers_out.status
            {
                return Some(b"via_upstream".to_vec());
            }
            Some(b"upstream_reset_before_response_started{connection_failure}".to_vec())
        }
    }

    // C integer types (time_t, off_t, ...) differ across platforms: conversions are explicit.
    #[allow(clippy::useless_conversion)]
    fn get(&self, path: &[u8]) -> Option<Vec<u8>> {
        let r = self.r;
        // SAFETY: `r` is live while the stream holding this source is (both are freed with the
        // request's pool cleanup, the source first).
        unsafe {
            let c: *mut ngx_connection_t = (*r).connection;
            match path {
                b"request\0path" => Some(bytes(&(*r).unparsed_uri).to_vec()),
                b"request\0url_path" => {
                    let u = bytes(&(*r).unparsed_uri);
                    Some(u.split(|b| *b == b'?').next().unwrap_or_default().to_vec())
                }
                b"request\0query" => Some(bytes(&(*r).args).to_vec()),
                b"request\0host" => {
                    let h = (*r).headers_in.host;
                    if h.is_null() {
                        Some(bytes(&(*r).headers_in.server).to_vec())
                    } else {
                        Some(bytes(&(*h).value).to_vec())
                    }
                }
                b"request\0method" => Some(bytes(&(*r).method_name).to_vec()),
                b"request\0scheme" => Some(if c.is_null() || (*c).ssl.is_null() {
                    b"http".to_vec()
                } else {
                    b"https".to_vec()
                }),
                b"request\0protocol" => Some(bytes(&(*r).http_protocol).to_vec()),
                b"request\0id" => self.var(b"request_id"),
                b"request\0time" => {
                    let secs = i64::try_from((*r).start_sec).unwrap_or(0);
                    let ms = i64::try_from((*r).start_msec).unwrap_or(0);
                    Some(int(secs
                        .saturating_mul(1_000_000_000)
                        .saturating_add(ms.saturating_mul(1_000_000))))
                }
                b"request\0size" => Some(int(i64::try_from((*r).headers_in.content_length_n)
                    .unwrap_or(0)
                    .max(0))),
                b"request\0total_size" => {
                    Some(int(i64::try_from((*r).request_length).unwrap_or(0)))
                }
                b"request\0useragent" => self.header_in(b"user-agent"),
                b"request\0referer" => self.header_in(b"referer"),
                b"source\0address" | b"source\0port" => {
                    if c.is_null() {
                        return None;
                    }
                    let (addr, port) = sockaddr_parts((*c).sockaddr, (*c).socklen)?;
                    Some(if path == b"source\0port" {
                        int(port)
                    } else {
                        addr
                    })
                }
                b"destination\0address" | b"destination\0port" => {
                    if c.is_null() {
                        return None;
                    }
                    let mut buf = [0u8; 128];
                    let mut s = ngx_str_t {
                        len: buf.len(),
                        data: buf.as_mut_ptr(),
                    };
                    if ngx::ffi::ngx_connection_local_sockaddr(c, &mut s, 0) != 0 {
                        return None;
                    }
                    let (addr, port) = sockaddr_parts((*c).local_sockaddr, (*c).local_socklen)?;
                    Some(if path == b"destination\0port" {
                        int(port)
                    } else {
                        addr
                    })
                }
                b"connection\0id" => {
                    if c.is_null() {
                        return None;
                    }
                    Some(int(i64::try_from((*c).number).unwrap_or(0)))
                }
                b"connection\0mtls" => Some(vec![0]),
                b"response\0code" => {
                    let s: ngx_uint_t = (*r).headers_out.status;
                    if s == 0 {
                        None
                    } else {
                        Some(int(i64::try_from(s).unwrap_or(0)))
                    }
                }
                b"response\0code_details" => self.code_details(),
                b"response\0size" => {
                    if c.is_null() {
                        return None;
                    }
                    let sent = i64::try_from((*c).sent)
                        .unwrap_or(0)
                        .saturating_sub(i64::try_from((*r).header_size).unwrap_or(0));
                    Some(int(sent.max(0)))
                }
                b"response\0total_size" => {
                    if c.is_null() {
                        return None;
                    }
                    Some(int(i64::try_from((*c).sent).unwrap_or(0)))
                }
                _ => {
                    if let Some(name) = path.strip_prefix(b"request\0headers\0") {
                        return self.header_in(name);
                    }
                    if let Some(name) = path.strip_prefix(b"ngx\0") {
                        return self.var(name);
                    }
                    if let Some(name) = path.strip_prefix(b"ngx.") {
                        return self.var(name);
                    }
                    None
                }
            }
        }
    }
}

impl PropertySource for NgxProps {
    fn property(&self, path: &[u8]) -> Option<Vec<u8>> {
        if self.r.is_null() {
            return None;
        }
        // A dotted single segment (`request.path`) is accepted like the `\0`-joined form.
        if !path.contains(&0) && path.contains(&b'.') && !path.starts_with(b"ngx.") {
            let joined: Vec<u8> = path
                .iter()
                .map(|b| if *b == b'.' { 0 } else { *b })
                .collect();
            return self.get(&joined);
        }
        self.get(path)
    }
}
