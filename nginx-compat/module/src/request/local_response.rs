//! A filter's local response sent in place of the upstream's: an HTTP response with the
//! filter's status, fields and body, or on a gRPC request a trailers-only gRPC response, as
//! Envoy's local replies.

use ngx::ffi::{ngx_buf_t, ngx_chain_t, ngx_http_request_t, ngx_int_t, ngx_uint_t};
use tollgate_host::LocalResponse;

use super::context::{Phase, RequestCtx};
use crate::base::rc;
use crate::util::{level, log};
/// Sends a filter's local response and finalizes the request (the phase handler then returns
/// `NGX_DONE`). Like Envoy's local replies (`Http::Utility::sendLocalReply`,
/// source/common/http/utility.cc):
/// - on a gRPC request (its `content-type`, as the filters see it now, is `application/grpc` or
///   `application/grpc+...`: `tollgate_services::grpc_status::is_grpc_content_type`), a
///   trailers-only gRPC response: `:status 200`, `content-type: application/grpc`,
///   `grpc-status` (the filter's, else its HTTP status mapped), `grpc-message` (the body,
///   percent-encoded) and the filter's other fields, no body
///   (`tollgate_services::grpc_status::grpc_local_reply`). Over HTTP/2 the fields go out as one
///   HEADERS frame with END_STREAM and no `content-length`; over HTTP/1.x (no trailers-only
///   form) with `Content-Length: 0`, as Envoy's HTTP/1 codec ends a headers-only response;
/// - otherwise the filter's status, fields and body; a body without `content-type` gets
///   `content-type: text/plain`.
///
/// # Safety
/// `r` must be a live request whose header was not sent.
pub unsafe fn send_local(
    r: *mut ngx_http_request_t,
    ctx: &mut RequestCtx,
    lr: LocalResponse,
) -> ngx_int_t {
    ctx.phase = Phase::Forward;
    if let Ok(mut d) = ctx.local_details.try_borrow_mut() {
        *d = Some(if lr.details.is_empty() {
            b"wasm_local_reply".to_vec()
        } else {
            lr.details.clone()
        });
    }
    let grpc = ctx
        .stream
        .request_header(b"content-type")
        .is_some_and(tollgate_services::grpc_status::is_grpc_content_type);
    // SAFETY: standard response sending on a live request.
    unsafe {
        if (*r).header_sent() != 0 {
            return rc::ERROR;
        }
        let _ = nginx_sys::ngx_http_discard_request_body(r);
        let (map, body) = if grpc {
            let head = (*r).method == nginx_sys::NGX_HTTP_HEAD as ngx_uint_t;
            let map = tollgate_services::grpc_status::grpc_local_reply(
                lr.status,
                lr.grpc_status,
                &lr.body,
                &lr.headers,
                head,
            );
            (map, Vec::new())
        } else {
            (http_local_reply(&lr), lr.body)
        };
        (*r).headers_out.status = 0;
        if let Err(e) = crate::headers::apply_response_map(r, &map) {
            log(
                level::ERR,
                (*(*r).connection).log,
                &format!("tollgate: local response: {e}"),
            );
            return rc::HTTP_INTERNAL_SERVER_ERROR;
        }
        if (*r).headers_out.status == 0 {
            (*r).headers_out.status = 500;
        }
        if grpc && (*r).http_version >= nginx_sys::NGX_HTTP_VERSION_20 as ngx_uint_t {
            // Trailers-only: nginx's HTTP/2 header filter sets END_STREAM on the HEADERS frame
            // of a header-only response and writes no content-length for a length of -1.
            (*r).headers_out.content_length_n = -1;
            (*r).set_header_only(1);
        } else if grpc {
            (*r).headers_out.content_length_n = 0;
        }
        let rcode = nginx_sys::ngx_http_send_header(r);
        if rcode == rc::ERROR || rcode > rc::OK || (*r).header_only() != 0 {
            return rcode;
        }
        if body.is_empty() {
            return nginx_sys::ngx_http_send_special(r, 1 /* NGX_HTTP_LAST */);
        }
        let b: *mut ngx_buf_t = nginx_sys::ngx_create_temp_buf((*r).pool, body.len());
        if b.is_null() {
            return rc::ERROR;
        }
        std::ptr::copy_nonoverlapping(body.as_ptr(), (*b).last, body.len());
        (*b).last = (*b).last.add(body.len());
        (*b).set_last_buf(if r == (*r).main { 1 } else { 0 });
        (*b).set_last_in_chain(1);
        let mut out = ngx_chain_t {
            buf: b,
            next: std::ptr::null_mut(),
        };
        nginx_sys::ngx_http_output_filter(r, &mut out)
    }
}

/// The response fields of a local response to a request that is not gRPC: `:status`, the
/// filter's fields but `content-length` (nginx's, from the body), `content-type: text/plain`
/// for a body without one.
fn http_local_reply(lr: &LocalResponse) -> tollgate_host::HeaderMap {
    let mut map: tollgate_host::HeaderMap = Vec::with_capacity(lr.headers.len().saturating_add(3));
    map.push((b":status".to_vec(), lr.status.to_string().into_bytes()));
    for (k, v) in &lr.headers {
        if !k.eq_ignore_ascii_case(b"content-length") {
            map.push((k.clone(), v.clone()));
        }
    }
    if !lr.body.is_empty()
        && !lr
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(b"content-type"))
    {
        map.push((b"content-type".to_vec(), b"text/plain".to_vec()));
    }
    map.push((
        b"content-length".to_vec(),
        lr.body.len().to_string().into_bytes(),
    ));
    map
}
