//! The request side of the chain, in nginx's phases: `on_request_headers` in the rewrite phase
//! (or access, with `proxy_wasm_request_headers_in_access on`), the client body and
//! `on_request_body`, and `on_log` in the log phase. Re-entered after a pause, after the body
//! is read, and after an internal redirect (see `request/mod.rs`).

use ngx::ffi::{ngx_http_core_main_conf_t, ngx_http_request_t, ngx_int_t};
use tollgate_host::DeferredMap;

use crate::headers_in_place::RequestSource;

use crate::actions::{pending_action, refuse, stop_action};
use crate::base::{loc_conf, rc};
use crate::request::context::{Phase, RequestCtx};
use crate::request::context_lifetime::get_ctx;
use crate::timers::{kick_calls, run_chain};
use crate::util::bytes;
use crate::worker::with_worker;

fn has_body(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: reading a live request.
    unsafe { (*r).headers_in.content_length_n > 0 || (*r).headers_in.chunked() != 0 }
}

pub(crate) unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a live request.
    unsafe { request_phase(r, false) }
}

pub(crate) unsafe extern "C" fn access_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: as above.
    unsafe { request_phase(r, true) }
}

/// The request side of the chain, in the rewrite phase (or the access phase with
/// `proxy_wasm_request_headers_in_access on`): `on_request_headers` of the location's filters,
/// then the body and `on_request_body` when a filter reads it. Re-entered after a pause, after
/// the body is read, and after an internal redirect (see `request/mod.rs`).
unsafe fn request_phase(r: *mut ngx_http_request_t, access: bool) -> ngx_int_t {
    // SAFETY: a live request; nginx is never called while the worker state is borrowed.
    unsafe {
        let Some(lcf) = loc_conf(r) else {
            return rc::DECLINED;
        };
        let chain = lcf.chain.as_ref().filter(|c| !c.is_empty());
        if lcf.headers_in_access.unwrap_or(false) != access {
            return rc::DECLINED;
        }
        let ctx: &mut RequestCtx = match (get_ctx(r), chain) {
            (Some(c), _) => c,
            (None, None) => return rc::DECLINED,
            (None, Some(_)) => match RequestCtx::create(r) {
                Some(c) => c,
                None => {
                    return refuse(
                        r,
                        "cannot allocate the request context: refusing the request",
                    )
                }
            },
        };
        if let Some(chain) = chain {
            let isolation = lcf.isolation.unwrap_or_default();
            let Some(added) = with_worker(|w| ctx.enter_chain(w, chain, isolation)) else {
                return refuse(
                    r,
                    "the worker's filter state is unavailable: refusing the request",
                );
            };
            if added {
                // Fresh, or an internal redirect added filters: they see the request as it is
                // now. Hop-by-hop fields the upstream must not get are dropped by writing the
                // map back.
                defer_request_headers(r, ctx);
            }
        }
        loop {
            match ctx.phase {
                Phase::Fresh => return rc::DECLINED,
                Phase::Headers(from) => {
                    if let Some(code) = pending_action(r, ctx, from) {
                        return code;
                    }
                    let eos = !has_body(r);
                    let out = run_chain(|w| ctx.request_headers(w, from, eos));
                    if let Some(code) = stop_action(r, ctx, out, Phase::Paused) {
                        return code;
                    }
                    if std::mem::take(&mut ctx.stream.request_headers_changed) {
                        if let Err(e) =
                            crate::headers_in_place::write_back(r, &mut ctx.stream, false)
                        {
                            ctx.phase = Phase::Forward;
                            return refuse(r, &format!("request headers: {e}"));
                        }
                        flush_header_variables(r);
                    }
                    if has_body(r) && ctx.wants_request_body && !ctx.body_read {
                        return start_body(r, ctx);
                    }
                    ctx.phase = if ctx.body_read && ctx.body_done < ctx.started {
                        Phase::Body(ctx.body_done)
                    } else {
                        Phase::Forward
                    };
                }
                Phase::Paused(_) | Phase::BodyPaused(_) | Phase::ReadingBody => return rc::DONE,
                Phase::Body(from) => {
                    if let Some(code) = pending_action(r, ctx, ctx.started) {
                        return code;
                    }
                    if !ctx.body_loaded {
                        crate::body::read_request_body(r, &mut ctx.stream.request_body);
                        ctx.body_loaded = true;
                    }
                    let out = run_chain(|w| ctx.request_body(w, from));
                    if let Some(code) = stop_action(r, ctx, out, Phase::BodyPaused) {
                        return code;
                    }
                    if std::mem::take(&mut ctx.stream.request_body_changed) {
                        let body = &ctx.stream.request_body;
                        if crate::body::replace_request_body(r, body).is_none() {
                            ctx.phase = Phase::Forward;
                            return refuse(r, "cannot replace the request body");
                        }
                    }
                    ctx.stream.request_body.clear();
                    ctx.body_loaded = false;
                    ctx.phase = Phase::Forward;
                }
                Phase::Forward => return rc::DECLINED,
            }
        }
    }
}

/// Points the stream's request headers at the request as it is now: read in place (deferred:
/// built only when a filter needs the whole map) unless the request has hop-by-hop fields, whose
/// hiding and dropping is decided now.
unsafe fn defer_request_headers(r: *mut ngx_http_request_t, ctx: &mut RequestCtx) {
    // SAFETY: a live request; the stream lives in the request's context, freed with its pool,
    // so the source reads the request while it is live.
    unsafe {
        if let Some(len) = crate::headers::plain_request_count(r) {
            ctx.stream.request_headers.clear();
            ctx.stream.request_headers_changed = false;
            ctx.stream.request_headers_deferred = Some(DeferredMap::with_edits(
                crate::request::spares::request_source(RequestSource::new(r, len)),
                std::mem::take(&mut ctx.spare_edits.0),
            ));
        } else {
            let (map, drops) = crate::headers::request_map(r);
            ctx.stream.request_headers = map;
            ctx.stream.request_headers_changed = drops;
            ctx.stream.request_headers_deferred = None;
        }
    }
}

unsafe fn start_body(r: *mut ngx_http_request_t, ctx: &mut RequestCtx) -> ngx_int_t {
    ctx.phase = Phase::ReadingBody;
    // SAFETY: the standard pattern of reading the body from a phase handler (as
    // ngx_http_mirror_module does): the post handler re-runs the phases.
    unsafe {
        (*r).set_request_body_in_single_buf(1);
        (*r).set_request_body_in_clean_file(1);
        let code = nginx_sys::ngx_http_read_client_request_body(r, Some(body_read));
        if code >= 300 {
            return code;
        }
        nginx_sys::ngx_http_finalize_request(r, rc::DONE);
        rc::DONE
    }
}

unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls the post handler with the live request.
    unsafe {
        if let Some(ctx) = get_ctx(r) {
            ctx.body_read = true;
            ctx.phase = Phase::Body(ctx.body_done);
        }
        (*r).write_event_handler = Some(nginx_sys::ngx_http_core_run_phases);
        nginx_sys::ngx_http_core_run_phases(r);
    }
}

/// Invalidates cached `$http_*` and `$cookie_*` variables after the headers changed.
unsafe fn flush_header_variables(r: *mut ngx_http_request_t) {
    // SAFETY: r->variables has one entry per indexed variable of the core main conf.
    unsafe {
        let cmcf = (*(*r)
            .main_conf
            .add(nginx_sys::ngx_http_core_module.ctx_index))
        .cast::<ngx_http_core_main_conf_t>();
        if cmcf.is_null() || (*r).variables.is_null() {
            return;
        }
        let vars = &(*cmcf).variables;
        let defs = std::slice::from_raw_parts(
            vars.elts.cast::<ngx::ffi::ngx_http_variable_t>(),
            vars.nelts,
        );
        for (i, v) in defs.iter().enumerate() {
            let name = bytes(&v.name);
            if name.starts_with(b"http_") || name.starts_with(b"cookie_") {
                let val = (*r).variables.add(i);
                (*val).set_valid(0);
                (*val).set_not_found(0);
            }
        }
    }
}

pub(crate) unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: a live request (a subrequest's only with `log_subrequest on`; otherwise its
    // filters' on_log runs when the main request's pool is freed).
    unsafe {
        if r == (*r).main {
            crate::metrics_endpoint::count_request();
        }
        if let Some(ctx) = get_ctx(r) {
            with_worker(|w| ctx.finish(w));
            kick_calls();
        }
        rc::DECLINED
    }
}
