//! `proxy_dispatch_http_call` without blocking the worker: calls go to `tollgate-services`'
//! `CallRunner` (background threads started on first use in each worker, after fork); the
//! worker polls the completions with a short timer while calls are pending and delivers
//! `on_http_call_response` to the `Vm` that made the call.

use tollgate_host::HttpCallResponse;
use tollgate_services::http_client::CallResult;

use crate::request::from_handle;
use crate::util::{level, log};
use crate::worker::{RequestHandle, Worker};
use crate::worker_host::CallTag;

/// Delivers the completed calls (`on_http_call_response`, with the dispatching request's
/// stream when the call came from an HTTP context); returns the requests a `Vm` resumed
/// meanwhile. Called from the worker's poll timer.
pub fn poll(w: &mut Worker) -> Vec<RequestHandle> {
    let done: Vec<(CallTag, CallResult)> = w
        .host
        .runner
        .try_borrow_mut()
        .map(|mut r| r.poll())
        .unwrap_or_default();
    let mut resumed = Vec::new();
    for (tag, response) in done {
        let m = tag.vm_slot;
        let Some(slot) = w.vms.get_mut(m) else {
            continue;
        };
        if slot.generation != tag.generation {
            continue;
        }
        let Some(vm) = slot.vm.as_mut() else { continue };
        if let (Err(failure), true) = (&response, tag.log_errors) {
            // `proxy_wasm_log_dispatch_errors on` (ngx_wasm_module's default).
            log(
                level::ERR,
                w.log,
                &format!(
                    "tollgate: dispatch_http_call to \"{}\" failed: {failure}",
                    tag.upstream
                ),
            );
        }
        let response = response.ok().map(|r| HttpCallResponse {
            headers: r.headers,
            body: r.body,
            trailers: r.trailers,
        });
        let token = tag.token;
        let ctx = vm
            .http_call_context(token)
            .and_then(|h| w.live.get(&(m, h.0)).copied());
        let res = match ctx {
            // SAFETY: live-map entries are removed before their request is freed.
            Some(p) => match unsafe { from_handle(p) } {
                Some(c) => {
                    // Calls the callback makes take the request's location's directives.
                    let entered = w.host.enter_request(c.r);
                    let r = vm.on_http_call_response_with_stream(token, response, &mut c.stream);
                    drop(entered);
                    // The filter resumed its request (`proxy_continue_stream` with the stream
                    // loaded) or answered it with a local response: the request goes on from
                    // where it paused (a request that is not paused is left alone, and the flag
                    // is cleared so that a later pause is not taken for resumed).
                    let resume = std::mem::take(&mut c.stream.resumed);
                    if resume || c.stream.local_response.is_some() || c.stream.closed {
                        resumed.push(p);
                    }
                    r
                }
                None => vm.on_http_call_response(token, response),
            },
            None => vm.on_http_call_response(token, response),
        };
        if let Err(e) = res {
            log(
                level::ERR,
                w.log,
                &format!("tollgate: on_http_call_response: {}", e.0),
            );
        }
        w.check_poisoned(m);
        resumed.extend(w.take_resumed(m));
    }
    resumed
}

/// Calls are in flight in this worker (the poll timer keeps running).
pub fn inflight(w: &Worker) -> bool {
    w.host
        .runner
        .try_borrow()
        .map(|r| r.pending() > 0)
        .unwrap_or(false)
}
