//! Stream control: local responses (`proxy_send_local_response`), resuming a paused stream
//! (`proxy_continue_stream` and its 0.2.0 names), `proxy_close_stream`,
//! `proxy_set_effective_context`, and the no-ops `proxy_clear_route_cache` and `proxy_done`.

use crate::abi::store::{
    ms, refused_map, Def, BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY_ACCESS, OK,
};
use crate::context_ids::HttpId;
use crate::error::Error;
use crate::mem;
use crate::stream::LocalResponse;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    // `proxy_send_http_response` is the same function's later name (ngx_wasm_module).
    // `grpc_status` is kept when Envoy counts it as set (0 to 16, `LocalResponse::grpc_status`):
    // the embedding answers a gRPC request with that status instead of the HTTP response.
    let send = |mut c: C<'_>,
                status: u32,
                dp: u32,
                dl: u32,
                bp: u32,
                bl: u32,
                hp: u32,
                hl: u32,
                grpc_status: i32|
     -> u32 {
        let Some((mem, state)) = ms(&mut c) else {
            return INTERNAL_FAILURE;
        };
        let (Some(details), Some(body), Some(headers)) = (
            mem::slice(mem, dp, dl),
            mem::slice(mem, bp, bl),
            mem::slice(mem, hp, hl),
        ) else {
            return INVALID_MEMORY_ACCESS;
        };
        let Some(headers) = mem::deserialize(headers, true) else {
            return BAD_ARGUMENT;
        };
        if let Some(code) = refused_map(state, "proxy_send_local_response", &headers) {
            return code;
        }
        state.stream_mut().local_response = Some(LocalResponse {
            status,
            details: details.to_vec(),
            body: body.to_vec(),
            headers,
            grpc_status: LocalResponse::grpc_status_arg(grpc_status),
        });
        OK
    };
    d.env("proxy_send_local_response", send)?;
    d.env("proxy_send_http_response", send)?;
    let resume = |c: &mut C<'_>| -> u32 {
        let state = c.data_mut();
        let target = state.effective;
        if state.stream_loaded() && target == state.current {
            state.stream_mut().resumed = true;
            return OK;
        }
        if state.is_root(target) || !state.contexts.contains_key(&target) {
            return BAD_ARGUMENT;
        }
        if !state.resumed.iter().any(|h| h.0 == target) {
            state.resumed.push(HttpId(target));
        }
        OK
    };
    d.env(
        "proxy_continue_stream",
        move |mut c: C<'_>, _t: u32| -> u32 { resume(&mut c) },
    )?;
    d.env("proxy_continue_request", move |mut c: C<'_>| -> u32 {
        resume(&mut c)
    })?;
    d.env("proxy_continue_response", move |mut c: C<'_>| -> u32 {
        resume(&mut c)
    })?;
    d.env("proxy_close_stream", |mut c: C<'_>, _t: u32| -> u32 {
        let state = c.data_mut();
        if state.stream_loaded() && state.effective == state.current {
            state.stream_mut().closed = true;
            OK
        } else {
            BAD_ARGUMENT
        }
    })?;
    d.env("proxy_clear_route_cache", |_c: C<'_>| -> u32 { OK })?;
    d.env("proxy_done", |_c: C<'_>| -> u32 { OK })?;
    d.env(
        "proxy_set_effective_context",
        |mut c: C<'_>, id: u32| -> u32 {
            let state = c.data_mut();
            if !state.set_effective(id) {
                return BAD_ARGUMENT;
            }
            // Within a combined call the next callback must start from its own context again
            // (combined_calls.rs).
            if let Some(moved) = state.effective_moved {
                // The flag is this store's i32 global: setting it cannot fail.
                let _ = moved.set(&mut c, wasmtime::Val::I32(1));
            }
            OK
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::{Action, HttpId, Stream, StreamCallback, Vm};

    #[test]
    fn a_local_responses_grpc_status_is_kept_from_0_to_16_as_envoy_reads_it() {
        // Envoy's Context::sendLocalResponse (source/extensions/common/wasm/context.cc): a
        // status from Ok (0) to MaximumKnown (16) is set, anything else (the SDKs' -1) is none.
        let cases = [
            (-1, None),
            (0, Some(0)),
            (10, Some(10)),
            (16, Some(16)),
            (17, None),
            (i32::MIN, None),
            (i32::MAX, None),
        ];
        for (arg, want) in cases {
            // on_request_headers: the Rust SDK's send_grpc_response(arg, Some("aborted"), []):
            // HTTP 200, the message as the body, an empty map (count 0), the status.
            let m = compile(&wat(
                "0_2_1",
                r#"(import "env" "proxy_send_local_response"
                     (func $send (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))"#,
                &format!(
                    r#"(data (i32.const 100) "aborted")
                       (data (i32.const 200) "\00\00\00\00")
                       (func (export "proxy_on_context_create") (param i32 i32))
                       (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
                       (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                         (drop (call $send (i32.const 200) (i32.const 0) (i32.const 0)
                           (i32.const 100) (i32.const 7) (i32.const 200) (i32.const 4)
                           (i32.const {arg})))
                         (i32.const 1))"#
                ),
            ))
            .unwrap();
            let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
            let root = vm.create_root("p", b"").unwrap();
            let id = vm.create_http(root).unwrap();
            let mut s = Stream::default();
            vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                .unwrap();
            let lr = s.local_response.expect("a local response");
            assert_eq!((lr.status, lr.body.as_slice()), (200, &b"aborted"[..]));
            assert_eq!(lr.grpc_status, want, "grpc_status argument {arg}");
        }
    }

    #[test]
    fn continue_from_a_root_callback_is_recorded_for_take_resumed() {
        // The module remembers the last HTTP context and, on tick, makes it effective and resumes it.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
               (import "env" "proxy_continue_stream" (func $cont (param i32) (result i32)))
               (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))"#,
            r#"(global $http (mut i32) (i32.const 0))
               (func (export "proxy_on_context_create") (param $id i32) (param $parent i32)
                 (if (local.get $parent) (then (global.set $http (local.get $id)))))
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (i32.eqz (call $tick (i32.const 250))))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (i32.const 1))
               (func (export "proxy_on_tick") (param i32)
                 (if (i32.eqz (call $eff (global.get $http)))
                   (then (drop (call $cont (i32.const 0))))))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        assert_eq!(vm.tick_period_ms(root), 250);
        let id = vm.create_http(root).unwrap();
        let mut s = Stream::default();
        assert_eq!(
            vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                .unwrap(),
            Action::Pause
        );
        assert!(vm.take_resumed().is_empty());
        vm.on_tick(root).unwrap();
        assert_eq!(vm.take_resumed(), [HttpId(id.0)]);
        assert!(vm.take_resumed().is_empty());
    }
}
