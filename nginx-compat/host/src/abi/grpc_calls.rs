//! Unary gRPC calls out of a filter: `proxy_grpc_call`, `proxy_grpc_cancel`, `proxy_grpc_close`
//! and `proxy_get_status`, with Envoy's semantics (source/extensions/common/wasm/context.cc,
//! `Context::grpcCall`, `grpcCancel`, `grpcClose`, `getStatus`; proxy-wasm-cpp-host
//! src/exports.cc, `grpc_call`, `grpc_cancel`, `grpc_close`, `get_status`). The completion is
//! delivered by [`crate::Vm::on_grpc_call_done`].
//!
//! Owner: proxy-wasm-cpp-host runs all four on `contextOrEffectiveContext()->root_context()`,
//! so a call belongs to the root context of the context that made it: the callbacks get the
//! root's id, the end of a request does not cancel its calls (Envoy's `~Context` of the request
//! has none), only a context of the same root can cancel one, and `proxy_get_status` reads the
//! status that root's `proxy_on_grpc_close` is delivering, from any of its contexts.
//!
//! Tokens: a unary call's token is 1 modulo 4, as proxy-wasm-cpp-host numbers them
//! (`WasmBase::nextGrpcCallId`, include/proxy-wasm/wasm.h: `CalloutType::GrpcCall = 1`, step 4),
//! so `proxy_grpc_cancel`/`proxy_grpc_close` tell a call from a stream: a call's token that is
//! not pending is `NotFound`; a stream's token (2 modulo 4) is `NotFound` too (this host opens
//! no streams); any other token is `BadArgument`, as Envoy answers.
//!
//! Streams (`proxy_grpc_stream`, `proxy_grpc_send`) are not implemented: they stay linked to the
//! `Unimplemented` stub.

use crate::abi::store::{
    code, guest_str, ms, put, refused_map, return_bytes, Def, BAD_ARGUMENT, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, NOT_FOUND, OK, R,
};
use crate::embedder::{GrpcCall, LogLevel};
use crate::error::Error;
use crate::mem;
use crate::valid;

/// Token kinds modulo 4 (proxy-wasm-cpp-host `CalloutType`).
const GRPC_CALL: u32 = 1;
const GRPC_STREAM: u32 = 2;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_grpc_call",
        |mut c: C<'_>,
         up: u32,
         ul: u32,
         sp: u32,
         sl: u32,
         mp: u32,
         ml: u32,
         hp: u32,
         hl: u32,
         bp: u32,
         bl: u32,
         timeout_ms: u32,
         ret_token: u32|
         -> u32 {
            let names = [(up, ul), (sp, sl), (mp, ml)].map(|(p, l)| guest_str(&mut c, p, l));
            let [upstream, service, method] = names;
            let (upstream, service, method) = match (upstream, service, method) {
                (Ok(u), Ok(s), Ok(m)) => (u, s, m),
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return e,
            };
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(metadata), Some(message)) =
                (mem::slice(mem, hp, hl), mem::slice(mem, bp, bl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            let Some(metadata) = mem::deserialize(metadata, true) else {
                return BAD_ARGUMENT;
            };
            const F: &str = "proxy_grpc_call";
            if let Some(code) = refused_map(state, F, &metadata) {
                return code;
            }
            if mem::slice(mem, ret_token, 4).is_none() {
                return INVALID_MEMORY_ACCESS;
            }
            if state.grpc_calls.len() >= valid::MAX_PENDING_CALLS {
                let msg = format!(
                    "{F}: refused: {} gRPC calls of this instance are pending",
                    valid::MAX_PENDING_CALLS
                );
                state.log(LogLevel::Warn, msg.as_bytes());
                return INTERNAL_FAILURE;
            }
            let token = next_token(state);
            let call = GrpcCall {
                token,
                upstream,
                service,
                method,
                initial_metadata: metadata,
                message: message.to_vec(),
                timeout_ms,
            };
            if let Err(s) = state.host.dispatch_grpc_call(call) {
                return code(s);
            }
            let owner = state.root().map_or(state.effective, |r| r.id);
            state.grpc_calls.insert(token, (owner, state.effective));
            state.dispatched = state.dispatched.wrapping_add(1);
            if mem::write_u32(mem, ret_token, token) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            }
        },
    )?;
    // For a unary call both drop it (Envoy: `request_->cancel()` in either).
    d.env("proxy_grpc_cancel", |mut c: C<'_>, token: u32| -> u32 {
        cancel(&mut c, token)
    })?;
    d.env("proxy_grpc_close", |mut c: C<'_>, token: u32| -> u32 {
        cancel(&mut c, token)
    })?;
    d.env(
        "proxy_get_status",
        |mut c: C<'_>, code_ptr: u32, ret_ptr: u32, ret_size: u32| -> R {
            let (status, message) = c.data().grpc_status.clone();
            if !put(&mut c, code_ptr, &status.to_le_bytes()) {
                return Ok(INVALID_MEMORY_ACCESS);
            }
            return_bytes(&mut c, ret_ptr, ret_size, &message)
        },
    )?;
    Ok(())
}

/// The next free unary-call token: 1 modulo 4, never 0, not pending.
fn next_token(state: &mut crate::abi::store::State) -> u32 {
    loop {
        let token = state.next_grpc_token;
        state.next_grpc_token = token.wrapping_add(4);
        if !state.grpc_calls.contains_key(&token) {
            return token;
        }
    }
}

fn cancel(c: &mut C<'_>, token: u32) -> u32 {
    match token % 4 {
        GRPC_CALL => {
            let state = c.data_mut();
            // The calls of the effective context's root only (Envoy keeps them per root).
            let root = state.root().map(|r| r.id);
            if state.grpc_calls.get(&token).map(|(owner, _)| *owner) != root || root.is_none() {
                return NOT_FOUND;
            }
            state.grpc_calls.remove(&token);
            state.host.cancel_grpc_call(token);
            OK
        }
        GRPC_STREAM => NOT_FOUND,
        _ => BAD_ARGUMENT,
    }
}

#[cfg(test)]
mod tests {
    //! A hand-written module (WAT) driving every function of this area and both callbacks.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat, LOG};
    use crate::testing::MemoryHost;
    use crate::{GrpcCallResult, Stream, StreamCallback, Vm};

    /// `on_request_headers` dispatches three calls (the third to an unknown upstream when the
    /// context is the second one), cancels the second, probes cancel's statuses; the callbacks
    /// log what they receive. Numbers are logged as 4 little-endian bytes, texts as text.
    fn module() -> Vec<u8> {
        wat(
            "0_2_1",
            &format!(
                r#"{LOG}
               (import "env" "proxy_grpc_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_grpc_cancel" (func $cancel (param i32) (result i32)))
               (import "env" "proxy_grpc_close" (func $close (param i32) (result i32)))
               (import "env" "proxy_get_status" (func $status (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))"#
            ),
            r#"(data (i32.const 100) "ratelimit")
               (data (i32.const 120) "svc")
               (data (i32.const 130) "M")
               (data (i32.const 140) "hello")
               (data (i32.const 160) "\01\00\00\00\01\00\00\00\01\00\00\00k\00v\00")
               (func $n (param $v i32)
                 (i32.store (i32.const 200) (local.get $v))
                 (drop (call $log (i32.const 2) (i32.const 200) (i32.const 4))))
               (func $dispatch (param $up i32) (param $ul i32)
                 (call $n (call $call (local.get $up) (local.get $ul) (i32.const 120) (i32.const 3)
                   (i32.const 130) (i32.const 1) (i32.const 160) (i32.const 16) (i32.const 140) (i32.const 5)
                   (i32.const 250) (i32.const 300)))
                 (call $n (i32.load (i32.const 300))))
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (call $dispatch (i32.const 100) (i32.const 9))
                 (call $dispatch (i32.const 100) (i32.const 9))
                 (call $n (call $cancel (i32.load (i32.const 300))))
                 (call $n (call $cancel (i32.load (i32.const 300))))
                 (call $n (call $close (i32.load (i32.const 300))))
                 (call $n (call $cancel (i32.const 3)))
                 (call $n (call $cancel (i32.const 2)))
                 (call $dispatch (i32.const 100) (i32.const 9))
                 (call $dispatch (i32.const 120) (i32.const 3))
                 (i32.const 1))
               (func (export "proxy_on_grpc_receive") (param i32 i32 i32)
                 (call $n (local.get 0))
                 (call $n (local.get 1))
                 (call $n (local.get 2))
                 (call $n (call $buf (i32.const 5) (i32.const 0) (local.get 2) (i32.const 400) (i32.const 404)))
                 (drop (call $log (i32.const 2) (i32.load (i32.const 400)) (i32.load (i32.const 404)))))
               (func (export "proxy_on_grpc_close") (param i32 i32 i32)
                 (call $n (local.get 0))
                 (call $n (local.get 1))
                 (call $n (local.get 2))
                 (call $n (call $status (i32.const 500) (i32.const 504) (i32.const 508)))
                 (call $n (i32.load (i32.const 500)))
                 (drop (call $log (i32.const 2) (i32.load (i32.const 504)) (i32.load (i32.const 508)))))"#,
        )
    }

    fn drain(host: &MemoryHost) -> Vec<String> {
        host.logs
            .borrow_mut()
            .drain(..)
            .map(|l| match <[u8; 4]>::try_from(l.message.as_bytes()) {
                Ok(b) => u32::from_le_bytes(b).to_string(),
                Err(_) => l.message,
            })
            .collect()
    }

    #[test]
    fn unary_calls_dispatch_cancel_and_complete_as_in_envoy() {
        let m = compile(&module()).unwrap();
        let host = Rc::new(MemoryHost::new());
        host.upstreams.borrow_mut().push("ratelimit".into());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let id = vm.create_http(root).unwrap();
        let mut s = Stream::default();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        // Tokens 1, 5 (cancelled: Ok, then NotFound for cancel and close), 3 is BadArgument,
        // 2 (a stream's) NotFound, token 9, then ParseFailure (4) for the unknown upstream.
        assert_eq!(
            drain(&host),
            ["0", "1", "0", "5", "0", "1", "1", "2", "1", "0", "9", "4", "9"]
        );
        assert_eq!(*host.grpc_cancelled.borrow(), [5]);
        {
            let calls = host.grpc_calls.borrow();
            assert_eq!(calls.len(), 3);
            let c = &calls[0];
            assert_eq!(
                (
                    c.token,
                    c.upstream.as_str(),
                    c.service.as_str(),
                    c.method.as_str()
                ),
                (1, "ratelimit", "svc", "M")
            );
            assert_eq!(c.initial_metadata, [(b"k".to_vec(), b"v".to_vec())]);
            assert_eq!((c.message.as_slice(), c.timeout_ms), (&b"hello"[..], 250));
        }
        assert_eq!(vm.grpc_call_context(1), Some(id));
        // Success: proxy_on_grpc_receive(root, 1, 5) (the root context, 1, owns the call the
        // HTTP context, 2, made) and the reply in buffer 5.
        let ok = GrpcCallResult {
            status: 0,
            message: String::new(),
            body: b"world".to_vec(),
        };
        vm.on_grpc_call_done(1, ok.clone()).unwrap();
        assert_eq!(drain(&host), ["1", "1", "5", "0", "world"]);
        // Delivered once; a cancelled call is never delivered.
        vm.on_grpc_call_done(1, ok.clone()).unwrap();
        vm.on_grpc_call_done(5, ok).unwrap();
        assert!(drain(&host).is_empty());
        // Failure: proxy_on_grpc_close(root, 9, 14) and proxy_get_status during it.
        let failed = GrpcCallResult {
            status: 14,
            message: "upstream request timeout".into(),
            body: b"ignored".to_vec(),
        };
        vm.on_grpc_call_done(9, failed).unwrap();
        assert_eq!(
            drain(&host),
            ["1", "9", "14", "0", "14", "upstream request timeout"]
        );
        assert_eq!(vm.grpc_call_context(9), None);
        assert!(!vm.is_poisoned());
    }

    #[test]
    fn calls_outlive_the_request_that_made_them() {
        // proxy-wasm-cpp-host makes the call on the root context: the request's end does not
        // cancel it, and its completion still reaches the root (without the request's stream).
        let m = compile(&module()).unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let id = vm.create_http(root).unwrap();
        let mut s = Stream::default();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        // Any upstream is known here: 1 and 5 (cancelled), 9 and 13 pending.
        assert_eq!(*host.grpc_cancelled.borrow(), [5]);
        assert_eq!(vm.grpc_call_context(9), Some(id));
        vm.on_log_and_delete(id, &mut s).unwrap();
        assert_eq!(*host.grpc_cancelled.borrow(), [5]);
        assert_eq!(vm.grpc_call_context(9), None);
        host.logs.borrow_mut().clear();
        let ok = GrpcCallResult {
            body: b"later".to_vec(),
            ..GrpcCallResult::default()
        };
        vm.on_grpc_call_done(9, ok).unwrap();
        assert_eq!(drain(&host), ["1", "9", "5", "0", "later"]);
    }

    #[test]
    fn hostile_arguments_get_statuses_not_traps() {
        // Out-of-bounds name, metadata that does not parse, a CR in a metadata value, a token
        // pointer out of bounds: InvalidMemoryAccess (6), BadArgument (2), 2, 6.
        let m = compile(&wat(
            "0_2_1",
            &format!(
                r#"{LOG}
               (import "env" "proxy_grpc_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_get_status" (func $status (param i32 i32 i32) (result i32)))"#
            ),
            r#"(data (i32.const 100) "up")
               (data (i32.const 160) "\01\00\00\00\01\00\00\00\03\00\00\00k\00a\0db\00")
               (data (i32.const 180) "\05\00\00\00")
               (func $n (param $v i32)
                 (i32.store (i32.const 200) (local.get $v))
                 (drop (call $log (i32.const 2) (i32.const 200) (i32.const 4))))
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (call $n (call $call (i32.const 100) (i32.const 70000) (i32.const 100) (i32.const 2)
                   (i32.const 100) (i32.const 2) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)
                   (i32.const 10) (i32.const 300)))
                 (call $n (call $call (i32.const 100) (i32.const 2) (i32.const 100) (i32.const 2)
                   (i32.const 100) (i32.const 2) (i32.const 180) (i32.const 4) (i32.const 0) (i32.const 0)
                   (i32.const 10) (i32.const 300)))
                 (call $n (call $call (i32.const 100) (i32.const 2) (i32.const 100) (i32.const 2)
                   (i32.const 100) (i32.const 2) (i32.const 160) (i32.const 18) (i32.const 0) (i32.const 0)
                   (i32.const 10) (i32.const 300)))
                 (call $n (call $call (i32.const 100) (i32.const 2) (i32.const 100) (i32.const 2)
                   (i32.const 100) (i32.const 2) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)
                   (i32.const 10) (i32.const 65535)))
                 ;; get_status outside a close: Ok, code 0, no message; then a bad pointer.
                 (call $n (call $status (i32.const 500) (i32.const 504) (i32.const 508)))
                 (call $n (i32.load (i32.const 508)))
                 (call $n (call $status (i32.const 70000) (i32.const 504) (i32.const 508)))
                 (i32.const 1))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("p", b"").unwrap();
        let got: Vec<String> = drain(&host)
            .into_iter()
            .filter(|l| !l.contains("refused"))
            .collect();
        assert_eq!(got, ["6", "2", "2", "6", "0", "0", "6"]);
        assert!(host.grpc_calls.borrow().is_empty());
    }
}
