//! `proxy_dispatch_http_call` without blocking the worker: calls go to `tollgate-services`'
//! `CallRunner` (background threads started on first use in each worker, after fork), whose
//! completions wake the worker (its eventfd, `wake.rs`); the worker then delivers
//! `on_http_call_response` to the `Vm` that made the call. [`deliver`] is the delivery both
//! HTTP and gRPC completions share.

use tollgate_host::{Error, HttpCallResponse, HttpId, Stream, Vm};
use tollgate_services::http_client::CallResult;

use crate::request::context::from_handle;
use crate::util::{level, log};
use crate::worker::{RequestHandle, Worker};
use crate::worker_host::CallTag;

/// Runs `callback` on the `Vm` of slot `m` (when still of `tag`'s generation) with the stream
/// of the request whose HTTP context `ctx` made the call loaded, when that request is live (its
/// location's directives apply to calls the callback makes); returns the requests the `Vm`
/// resumed meanwhile. `what` names the callback in the error log.
pub fn deliver(
    w: &mut Worker,
    tag: &CallTag,
    what: &str,
    ctx: impl FnOnce(&Vm) -> Option<HttpId>,
    callback: impl FnOnce(&mut Vm, Option<&mut Stream>) -> Result<(), Error>,
) -> Vec<RequestHandle> {
    let m = tag.vm_slot;
    let mut resumed = Vec::new();
    let Some(slot) = w.vms.get_mut(m) else {
        return resumed;
    };
    if slot.generation != tag.generation {
        return resumed;
    }
    let Some(vm) = slot.vm.as_mut() else {
        return resumed;
    };
    let live = ctx(vm).and_then(|h| w.live.get(&(m, h.0)).copied());
    // SAFETY: live-map entries are removed before their request is freed.
    let res = match live.and_then(|p| unsafe { from_handle(p) }.map(|c| (p, c))) {
        Some((p, c)) => {
            let entered = w.host.enter_request(c.r);
            let r = callback(vm, Some(&mut c.stream));
            drop(entered);
            // The filter resumed its request (`proxy_continue_stream` with the stream loaded)
            // or answered it with a local response: the request goes on from where it paused
            // (a request that is not paused is left alone, and the flag is cleared so that a
            // later pause is not taken for resumed).
            let resume = std::mem::take(&mut c.stream.resumed);
            if resume || c.stream.local_response.is_some() || c.stream.closed {
                resumed.push(p);
            }
            r
        }
        None => callback(vm, None),
    };
    if let Err(e) = res {
        log(level::ERR, w.log, &format!("tollgate: {what}: {}", e.0));
    }
    w.check_poisoned(m);
    resumed.extend(w.take_resumed(m));
    resumed
}

/// Delivers the completed HTTP calls (`on_http_call_response`, with the dispatching request's
/// stream when the call came from an HTTP context); returns the requests a `Vm` resumed
/// meanwhile.
pub fn poll(w: &mut Worker) -> Vec<RequestHandle> {
    let done: Vec<(CallTag, CallResult)> = w
        .host
        .runner
        .try_borrow_mut()
        .map(|mut r| r.poll())
        .unwrap_or_default();
    let mut resumed = Vec::new();
    for (tag, response) in done {
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
        resumed.extend(deliver(
            w,
            &tag,
            "on_http_call_response",
            |vm| vm.http_call_context(token),
            |vm, stream| match stream {
                Some(s) => vm.on_http_call_response_with_stream(token, response, s),
                None => vm.on_http_call_response(token, response),
            },
        ));
    }
    resumed
}

/// HTTP or gRPC calls are in flight in this worker.
pub fn inflight(w: &Worker) -> bool {
    let http = w.host.runner.try_borrow().map(|r| r.pending() > 0);
    let grpc = w.host.grpc.try_borrow().map(|r| r.pending() > 0);
    http.unwrap_or(false) || grpc.unwrap_or(false)
}
