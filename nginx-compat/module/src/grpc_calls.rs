//! `proxy_grpc_call` without blocking the worker: unary calls go to `tollgate-services`'
//! `GrpcRunner` (one background thread per worker, one HTTP/2 connection per address), whose
//! completions wake the worker (its eventfd, `wake.rs`); the worker then delivers them to the
//! `Vm` that made the call (`Vm::on_grpc_call_done`: `proxy_on_grpc_receive` on OK,
//! `proxy_on_grpc_close` otherwise, as Envoy does for a unary call).

use tollgate_host::GrpcCallResult;

use crate::util::{level, log};
use crate::worker::{RequestHandle, Worker};

/// Delivers the completed gRPC calls; returns the requests a `Vm` resumed meanwhile. A failed
/// call (any status but OK) is logged at `error` under `proxy_wasm_log_dispatch_errors on`
/// (ngx_wasm_module's default), with its status and message.
pub fn poll(w: &mut Worker) -> Vec<RequestHandle> {
    let done = w
        .host
        .grpc
        .try_borrow_mut()
        .map(|mut r| r.poll())
        .unwrap_or_default();
    let mut resumed = Vec::new();
    for (tag, _, reply) in done {
        if let Ok(mut ids) = w.host.grpc_ids.try_borrow_mut() {
            ids.remove(&(tag.vm_slot, tag.generation, tag.token));
        }
        if reply.status != 0 && tag.log_errors {
            log(
                level::ERR,
                w.log,
                &format!(
                    "tollgate: grpc call to \"{}\" failed: status {}: {}",
                    tag.upstream, reply.status, reply.message
                ),
            );
        }
        let result = GrpcCallResult {
            status: reply.status,
            message: reply.message,
            body: reply.body.unwrap_or_default(),
        };
        let token = tag.token;
        resumed.extend(crate::calls::deliver(
            w,
            &tag,
            "grpc call completion",
            |vm| vm.grpc_call_context(token),
            |vm, stream| match stream {
                Some(s) => vm.on_grpc_call_done_with_stream(token, result, s),
                None => vm.on_grpc_call_done(token, result),
            },
        ));
    }
    resumed
}
