//! Properties computed from the nginx request (`proxy_get_property` falls back to these when
//! no filter set the property): the values of `attributes.rs`'s attributes, read from the
//! request, its connection and its upstream.

use ngx::ffi::{ngx_connection_t, ngx_http_request_t, ngx_str_t, ngx_uint_t};
use tollgate_host::PropertySource;

use crate::attributes::{body_bytes_sent, int, joined, parse, time_ns, url_path, Attribute};
use crate::util::bytes;

/// The property source of one request.
pub struct NgxProps {
    /// The request; valid as long as the stream that owns this source (freed with the request).
    pub r: *mut ngx_http_request_t,
    /// `response.code_details` when the response is a filter's local response: the field of
    /// the request's context (`RequestCtx::local_details`), which owns the stream that owns
    /// this source, so the field outlives every read through it (a pointer, not an `Rc`: one
    /// allocation fewer per request).
    pub local_details: *const std::cell::RefCell<Option<Vec<u8>>>,
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
            for h in crate::table_elts::table_elts(&raw mut (*self.r).headers_in.headers) {
                if (*h).hash != 0 && bytes(&(*h).key).eq_ignore_ascii_case(name) {
                    return Some(bytes(&(*h).value).to_vec());
                }
            }
        }
        None
    }

    /// `via_upstream` when the upstream answered; Envoy-like details otherwise.
    fn code_details(&self) -> Option<Vec<u8>> {
        // SAFETY: see the field; the context outlives its stream's property source.
        let local = unsafe { self.local_details.as_ref() };
        if let Some(Ok(d)) = local.map(std::cell::RefCell::try_borrow) {
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
    fn get(&self, attribute: Attribute<'_>, out: &mut Vec<u8>) -> Option<()> {
        let r = self.r;
        // SAFETY: `r` is live while the stream holding this source is (both are freed with the
        // request's pool cleanup, the source first).
        unsafe {
            let c: *mut ngx_connection_t = (*r).connection;
            match attribute {
                Attribute::RequestPath => put(out, bytes(&(*r).unparsed_uri)),
                Attribute::RequestUrlPath => put(out, url_path(bytes(&(*r).unparsed_uri))),
                Attribute::RequestQuery => put(out, bytes(&(*r).args)),
                Attribute::RequestHost => put(out, crate::headers::authority(r)),
                Attribute::RequestMethod => put(out, bytes(&(*r).method_name)),
                Attribute::RequestScheme => put(
                    out,
                    if c.is_null() || (*c).ssl.is_null() {
                        b"http"
                    } else {
                        b"https"
                    },
                ),
                Attribute::RequestProtocol => put(out, bytes(&(*r).http_protocol)),
                Attribute::RequestId => put(out, &self.var(b"request_id")?),
                Attribute::RequestTime => put_int(
                    out,
                    time_ns(
                        i64::try_from((*r).start_sec).unwrap_or(0),
                        i64::try_from((*r).start_msec).unwrap_or(0),
                    ),
                ),
                Attribute::RequestSize => put_int(
                    out,
                    i64::try_from((*r).headers_in.content_length_n)
                        .unwrap_or(0)
                        .max(0),
                ),
                Attribute::RequestTotalSize => {
                    put_int(out, i64::try_from((*r).request_length).unwrap_or(0))
                }
                Attribute::RequestUserAgent => put(out, &self.header_in(b"user-agent")?),
                Attribute::RequestReferer => put(out, &self.header_in(b"referer")?),
                Attribute::RequestHeader(name) => put(out, &self.header_in(name)?),
                Attribute::SourceAddress | Attribute::SourcePort => {
                    if c.is_null() {
                        return None;
                    }
                    let (addr, port) = sockaddr_parts((*c).sockaddr, (*c).socklen)?;
                    if attribute == Attribute::SourcePort {
                        put_int(out, port)
                    } else {
                        put(out, &addr)
                    }
                }
                Attribute::DestinationAddress | Attribute::DestinationPort => {
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
                    if attribute == Attribute::DestinationPort {
                        put_int(out, port)
                    } else {
                        put(out, &addr)
                    }
                }
                Attribute::ConnectionId => {
                    if c.is_null() {
                        return None;
                    }
                    put_int(out, i64::try_from((*c).number).unwrap_or(0))
                }
                Attribute::ConnectionMtls => put(out, &[0]),
                Attribute::ResponseCode => {
                    let s: ngx_uint_t = (*r).headers_out.status;
                    if s == 0 {
                        None
                    } else {
                        put_int(out, i64::try_from(s).unwrap_or(0))
                    }
                }
                Attribute::ResponseCodeDetails => put(out, &self.code_details()?),
                Attribute::ResponseSize => {
                    if c.is_null() {
                        return None;
                    }
                    put_int(
                        out,
                        body_bytes_sent(
                            i64::try_from((*c).sent).unwrap_or(0),
                            i64::try_from((*r).header_size).unwrap_or(0),
                        ),
                    )
                }
                Attribute::ResponseTotalSize => {
                    if c.is_null() {
                        return None;
                    }
                    put_int(out, i64::try_from((*c).sent).unwrap_or(0))
                }
                Attribute::NgxVariable(name) => put(out, &self.var(name)?),
            }
        }
    }
}

/// Appends `bytes` to `out`.
fn put(out: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    out.extend_from_slice(bytes);
    Some(())
}

/// Appends an integer attribute's value ([`int`]).
fn put_int(out: &mut Vec<u8>, v: i64) -> Option<()> {
    put(out, &int(v))
}

impl PropertySource for NgxProps {
    fn property(&self, path: &[u8], value: &mut Vec<u8>) -> bool {
        value.clear();
        if self.r.is_null() {
            return false;
        }
        let path = joined(path);
        let found = parse(&path).and_then(|a| self.get(a, value)).is_some();
        if !found {
            value.clear();
        }
        found
    }
}
