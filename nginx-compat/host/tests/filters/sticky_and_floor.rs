//! Host tests of sticky-upstream and the Wasm floor: they load and pass requests.

use super::*;

/// scripts/build.sh points each module's other stream callbacks at constant stubs
/// (tools/trim-callbacks); the host skips the stubs (src/stubs.rs) and sees exactly the
/// callbacks the crate declares, and a callback it skips continues.
#[test]
fn trimmed_modules_export_only_their_declared_callbacks() {
    use StreamCallback::*;
    let all = StreamCallback::ALL;
    let cases: [(&str, &[StreamCallback]); 7] = [
        ("wasm_floor", &[RequestHeaders]),
        ("wasm_floor_all_callbacks", &all),
        ("jwt_auth", &[RequestHeaders]),
        ("rate_limit", &[RequestHeaders, ResponseHeaders]),
        ("sticky_upstream", &[RequestHeaders, ResponseHeaders]),
        // The response body: the time to first token.
        ("metrics", &[RequestHeaders, Log]),
        (
            "cost",
            &[
                RequestHeaders,
                RequestBody,
                // A request body followed by trailers is read there (unread, it would pass).
                RequestTrailers,
                ResponseHeaders,
                ResponseBody,
                Log,
            ],
        ),
    ];
    let host = Rc::new(MemoryHost::new());
    for (filter, declared) in cases {
        let vm = vm(filter, &host);
        let exported: Vec<StreamCallback> = all
            .into_iter()
            .filter(|cb| vm.exports_callback(*cb))
            .collect();
        assert_eq!(exported, declared, "{filter}");
    }
    // The trimmed floor answers Continue to a body callback it does not export.
    let mut vm = vm("wasm_floor", &host);
    let root = vm.create_root("floor", b"").unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/", &[]);
    s.response_body = b"body".to_vec();
    assert_eq!(
        vm.on_stream(StreamCallback::ResponseBody, id, &mut s, true)
            .unwrap(),
        Action::Continue
    );
    vm.on_log_and_delete(id, &mut s).unwrap();
}

#[test]
fn wasm_floor_passes_requests() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("wasm_floor", &host);
    let root = vm.create_root("floor", b"").unwrap();
    let id = vm.create_http(root).unwrap();
    pass_through(&mut vm, id, &mut request("GET", "/", &[]));
}

#[test]
fn sticky_upstream_loads_and_refuses_bad_configuration() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("sticky_upstream", &host);
    assert!(vm.create_root("sticky", b"{\"nope\": 1}").is_err());
}
