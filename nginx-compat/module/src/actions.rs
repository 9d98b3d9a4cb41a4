//! The one place where how a run of filter callbacks ended ([`Outcome`]) becomes what the
//! request side does in nginx: pause, send a local response, refuse with 500, close (444),
//! or go on.

use ngx::ffi::{ngx_http_request_t, ngx_int_t};

use crate::base::rc;
use crate::request::callbacks::Outcome;
use crate::request::context::{Phase, RequestCtx};
use crate::request::local_response::send_local;
use crate::util::{level, log};
use crate::worker::with_worker;

pub(crate) unsafe fn finalize(r: *mut ngx_http_request_t, code: ngx_int_t) -> ngx_int_t {
    // SAFETY: the phase handler finalizes itself and tells the checker it is done (the same in
    // the rewrite and access phases, whose checkers treat NGX_OK differently).
    unsafe { nginx_sys::ngx_http_finalize_request(r, code) };
    rc::DONE
}

/// The name of a filter among the first `upto` of the request that cannot run any more.
fn failed_filter(ctx: &RequestCtx, upto: usize) -> Option<String> {
    let f = ctx.slots.iter().take(upto).find(|s| s.failed)?.filter;
    Some(
        with_worker(|w| w.filters.get(f).map(|d| d.name.clone()))
            .flatten()
            .unwrap_or_default(),
    )
}

/// Logs why a request is refused (the request's log) and finalizes it with 500.
pub(crate) unsafe fn refuse(r: *mut ngx_http_request_t, why: &str) -> ngx_int_t {
    // SAFETY: a live request.
    unsafe {
        log(
            level::ERR,
            (*(*r).connection).log,
            &format!("tollgate: {why}"),
        );
        finalize(r, rc::HTTP_INTERNAL_SERVER_ERROR)
    }
}

/// What the request side does when a run of callbacks ended with `out`: `None` to go on
/// (`Continue`), else the handler's return code. `paused` is the phase that waits for a
/// resume before filter `next`.
///
/// # Safety
/// `r` must be the live request of `ctx`.
pub(crate) unsafe fn stop_action(
    r: *mut ngx_http_request_t,
    ctx: &mut RequestCtx,
    out: Outcome,
    paused: fn(usize) -> Phase,
) -> Option<ngx_int_t> {
    // SAFETY: as the caller guarantees.
    unsafe {
        match out {
            Outcome::Continue => None,
            Outcome::Paused(next) => {
                ctx.phase = paused(next);
                Some(rc::DONE)
            }
            Outcome::Local(lr) => {
                let code = send_local(r, ctx, lr);
                Some(finalize(r, code))
            }
            Outcome::Failed => {
                ctx.phase = Phase::Forward;
                ctx.refused = true;
                Some(finalize(r, rc::HTTP_INTERNAL_SERVER_ERROR))
            }
            Outcome::Closed => {
                ctx.phase = Phase::Forward;
                Some(finalize(r, rc::HTTP_CLOSE))
            }
        }
    }
}

/// Before a run from the request side: a filter among the first `upto` that cannot run any
/// more refuses the request (500); a local response or a close that a callback outside the
/// request's own run left (an HTTP call's response, a tick) is carried out. `None`: run.
///
/// # Safety
/// `r` must be the live request of `ctx`.
pub(crate) unsafe fn pending_action(
    r: *mut ngx_http_request_t,
    ctx: &mut RequestCtx,
    upto: usize,
) -> Option<ngx_int_t> {
    // SAFETY: as the caller guarantees.
    unsafe {
        if let Some(name) = failed_filter(ctx, upto) {
            ctx.phase = Phase::Forward;
            ctx.refused = true;
            return Some(refuse(r, &format!("filter \"{name}\" cannot run on this request any more (its instance trapped and was replaced): refusing it")));
        }
        if let Some(lr) = ctx.stream.local_response.take() {
            return stop_action(r, ctx, Outcome::Local(lr), Phase::Paused);
        }
        if ctx.stream.closed {
            return stop_action(r, ctx, Outcome::Closed, Phase::Paused);
        }
        None
    }
}
