//! The response side of the chain, as nginx output filters: `on_response_headers` in the
//! header filter, `on_response_body` (and `on_response_trailers` with the last chunk) in the
//! body filter. A failure there fails closed: the response is replaced by a 500 (headers) or
//! cut (body).

use ngx::ffi::{
    ngx_chain_t, ngx_http_output_body_filter_pt, ngx_http_output_header_filter_pt,
    ngx_http_request_t, ngx_int_t,
};

use tollgate_host::DeferredMap;

use crate::headers_in_place::ResponseSource;

use crate::base::{ngx_http_tollgate_wasm_module, rc};
use crate::request::callbacks::Outcome;
use crate::request::context::{RequestCtx, ResponseFailure};
use crate::request::context_lifetime::get_ctx;
use crate::timers::run_chain;
use crate::util::{level, log};

static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY_FILTER: ngx_http_output_body_filter_pt = None;

/// Puts the filters at the top of nginx's header and body filter chains (postconfiguration).
///
/// # Safety
/// Only from the HTTP module's postconfiguration, on nginx's main thread.
pub(crate) unsafe fn install() {
    // SAFETY: as the caller guarantees: nginx's filter chains are set up there.
    unsafe {
        NEXT_HEADER_FILTER = nginx_sys::ngx_http_top_header_filter;
        nginx_sys::ngx_http_top_header_filter = Some(header_filter);
        NEXT_BODY_FILTER = nginx_sys::ngx_http_top_body_filter;
        nginx_sys::ngx_http_top_body_filter = Some(body_filter);
    }
}

unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: a live request in the header filter chain.
    unsafe {
        let next = NEXT_HEADER_FILTER;
        let call_next = |r| match next {
            Some(f) => f(r),
            None => rc::ERROR,
        };
        let Some(ctx) = get_ctx(r) else {
            return call_next(r);
        };
        if ctx.started == 0 || ctx.finished || ctx.response_failed.is_some() {
            return call_next(r);
        }
        // Read in place, built only when a filter needs the whole map (the request's pool,
        // and so `r`, outlives the stream).
        ctx.stream.response_headers.clear();
        ctx.stream.response_headers_deferred = Some(DeferredMap::with_edits(
            crate::request::spares::response_source(ResponseSource::new(r)),
            std::mem::take(&mut ctx.spare_edits.1),
        ));
        let eos = (*r).header_only() != 0 || (*r).headers_out.content_length_n == 0;
        if eos {
            ctx.resp_eos = true;
        }
        // The length as the upstream (or nginx's content handler) declared it: a module that
        // changes the body before this one clears it in its header filter, which ran first.
        ctx.resp_body_left = u64::try_from((*r).headers_out.content_length_n)
            .ok()
            .filter(|_| !eos && r == (*r).main);
        if ctx.wants_response_headers || ctx.wants_response_body {
            ctx.stream.response_trailers = crate::headers::trailers_map(r);
        }
        if !ctx.wants_response_headers && !ctx.slots.iter().any(|s| s.failed) {
            // No filter looks at the response headers (`on_log` may read them later), and
            // none failed (which would replace the response below).
            return call_next(r);
        }
        let out = run_chain(|w| ctx.response_headers(w, eos));
        match out {
            Outcome::Local(_) => log(
                level::WARN,
                (*(*r).connection).log,
                "tollgate: a local response after the response headers is not supported; ignored",
            ),
            Outcome::Failed => {
                // Fail closed: the response is replaced by a 500 (as nginx's own filters do on
                // an error in their header filter), never passed on without the filter.
                ctx.response_failed = Some(ResponseFailure::Replaced);
                log(
                    level::ERR,
                    (*(*r).connection).log,
                    "tollgate: on_response_headers failed: answering 500 instead of the response",
                );
                return nginx_sys::ngx_http_filter_finalize_request(
                    r,
                    &raw mut ngx_http_tollgate_wasm_module,
                    rc::HTTP_INTERNAL_SERVER_ERROR,
                );
            }
            _ => {}
        }
        if std::mem::take(&mut ctx.stream.response_headers_changed) {
            if let Err(e) = crate::headers_in_place::write_back(r, &mut ctx.stream, true) {
                log(
                    level::ERR,
                    (*(*r).connection).log,
                    &format!("tollgate: response headers: {e}"),
                );
            }
        }
        // A filter that sets trailers with the headers announces them, as `add_trailer` does:
        // nginx then chunks an HTTP/1.1 response (dropping its Content-Length) to carry them.
        // Trailers first set later reach HTTP/1.1 clients only if the response is chunked anyway.
        let announced =
            ctx.stream.response_trailers_changed && !ctx.stream.response_trailers.is_empty();
        apply_trailers_if_changed(r, ctx);
        if announced {
            (*r).set_expect_trailers(1);
        }
        call_next(r)
    }
}

/// Writes the response trailers back to `headers_out.trailers` when a filter changed them.
unsafe fn apply_trailers_if_changed(r: *mut ngx_http_request_t, ctx: &mut RequestCtx) {
    if !std::mem::take(&mut ctx.stream.response_trailers_changed) {
        return;
    }
    // SAFETY: a live main request in a response filter, before its last buffer went on.
    unsafe {
        if let Err(e) = crate::headers::apply_trailers(r, &ctx.stream.response_trailers) {
            log(
                level::ERR,
                (*(*r).connection).log,
                &format!("tollgate: response trailers: {e}"),
            );
        }
    }
}

unsafe extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: a live request in the body filter chain.
    unsafe {
        let next = NEXT_BODY_FILTER;
        let call_next = |r, c| match next {
            Some(f) => f(r, c),
            None => rc::ERROR,
        };
        if chain.is_null() {
            return call_next(r, chain);
        }
        let Some(ctx) = get_ctx(r) else {
            return call_next(r, chain);
        };
        match ctx.response_failed {
            Some(ResponseFailure::Cut) => {
                crate::body::consume(chain);
                return rc::ERROR;
            }
            Some(ResponseFailure::Replaced) => return call_next(r, chain),
            None => {}
        }
        if !ctx.wants_response_body {
            // No filter reads the body or the trailers: nothing to copy or call. Trailers that a
            // filter changed meanwhile (an HTTP call's callback) still go out.
            apply_trailers_if_changed(r, ctx);
            return call_next(r, chain);
        }
        if ctx.started == 0 || ctx.finished || ctx.resp_eos && !ctx.resp_buffering {
            return call_next(r, chain);
        }
        // The chunk is appended to what is buffered, or replaces the last chunk (the buffer
        // itself is reused).
        let body = &mut ctx.stream.response_body;
        if !ctx.resp_buffering {
            body.clear();
        }
        let held = body.len();
        let (eos, flush) = crate::body::chain_bytes(chain, body);
        let got = body.len().saturating_sub(held);
        if got == 0 && !eos {
            if ctx.resp_buffering {
                crate::body::consume(chain);
                return rc::OK;
            }
            return call_next(r, chain);
        }
        // The end of the stream for the filters: nginx's last buffer, or the body complete by
        // its Content-Length (an HTTP/1.x response with a length has no trailers to wait for).
        let ended = eos
            || ctx.resp_body_left.as_mut().is_some_and(|left| {
                *left = left.saturating_sub(u64::try_from(got).unwrap_or(u64::MAX));
                *left == 0
            });
        if ended {
            ctx.resp_eos = true;
            // The trailers nginx has by the last buffer: an upstream's (grpc_pass) or a filter's
            // earlier writes (`add_trailer`'s are added after this filter).
            ctx.stream.response_trailers = crate::headers::trailers_map(r);
        }
        let trailers_follow = ended && !ctx.stream.response_trailers.is_empty();
        let was_buffering = ctx.resp_buffering;
        ctx.resp_buffering = false;
        let mut out = run_chain(|w| ctx.response_body(w, ended));
        if trailers_follow && !matches!(out, Outcome::Failed) {
            out = run_chain(|w| ctx.response_trailers(w));
        }
        if let Outcome::Failed = out {
            // Fail closed: the rest of the response does not go out without the filter; the
            // connection is closed (Envoy resets the stream in this case).
            ctx.response_failed = Some(ResponseFailure::Cut);
            log(
                level::ERR,
                (*(*r).connection).log,
                "tollgate: a response body callback failed: closing the connection",
            );
            crate::body::consume(chain);
            return rc::ERROR;
        }
        apply_trailers_if_changed(r, ctx);
        if ctx.resp_buffering && !ended {
            // Keep the bytes; nothing goes out until the end of the stream.
            crate::body::consume(chain);
            return rc::OK;
        }
        let changed = std::mem::take(&mut ctx.stream.response_body_changed);
        if !changed && !was_buffering {
            ctx.stream.response_body.clear();
            return call_next(r, chain);
        }
        crate::body::consume(chain);
        // nginx's last buffer only where nginx gave one: after a body complete by its length,
        // nginx still sends its own.
        let out_chain = crate::body::memory_chain(r, &ctx.stream.response_body, eos, flush);
        ctx.stream.response_body.clear();
        let Some(out_chain) = out_chain else {
            return rc::ERROR;
        };
        call_next(r, out_chain)
    }
}
