//! Host tests of rate-limit.

use super::*;

#[test]
fn rate_limit_allows_n_then_429() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("rate_limit", &host);
    let config = r#"{"rules": [{"name": "api", "match": {"prefix": "/api"},
        "limits": [{"algorithm": "token_bucket", "capacity": 3, "requests": 1, "per": "day"}]}]}"#;
    let root = vm.create_root("rate_limit", config.as_bytes()).unwrap();
    for i in 0..3 {
        let id = vm.create_http(root).unwrap();
        let mut s = request("GET", "/api/x", &[]);
        let action = vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(
            action,
            Action::Continue,
            "request {i}; logs:\n{}",
            host.log_text()
        );
        assert_eq!(
            property(&s, "wasmx.tollgate.rate_limit"),
            Some("outcome=allowed rule=api")
        );
        s.response_headers = h(&[(":status", "200")]);
        assert_eq!(
            vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, true)
                .unwrap(),
            Action::Continue
        );
        assert!(header(&s.response_headers, "ratelimit-policy").is_some());
        assert!(s.response_headers_changed);
        vm.on_log_and_delete(id, &mut s).unwrap();
    }
    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/api/x", &[]);
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap(),
        Action::Pause
    );
    let local = s.local_response.as_ref().expect("429");
    assert_eq!(local.status, 429);
    assert!(
        header(&local.headers, "ratelimit-policy").is_some(),
        "{:?}",
        local.headers
    );
    assert!(header(&local.headers, "ratelimit").is_some());
    assert!(header(&local.headers, "retry-after").is_some());
    assert_eq!(
        property(&s, "wasmx.tollgate.rate_limit"),
        Some("outcome=limited rule=api")
    );
    vm.on_log_and_delete(id, &mut s).unwrap();
    // Unmatched paths are not limited.
    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/other", &[]);
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap(),
        Action::Continue
    );
    vm.on_log_and_delete(id, &mut s).unwrap();
    // The bucket lives in shared data, written with CAS.
    assert!(!host.shared.borrow().is_empty());
}

#[test]
fn rate_limit_state_is_shared_between_vms() {
    let host = Rc::new(MemoryHost::new());
    let config = r#"{"rules": [{"name": "api",
        "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]}]}"#;
    let mut a = vm("rate_limit", &host);
    let mut b = vm("rate_limit", &host);
    let ra = a.create_root("rate_limit", config.as_bytes()).unwrap();
    let rb = b.create_root("rate_limit", config.as_bytes()).unwrap();
    let mut outcomes = Vec::new();
    for which in [0, 1, 0] {
        let (vm, root) = if which == 0 {
            (&mut a, ra)
        } else {
            (&mut b, rb)
        };
        let id = vm.create_http(root).unwrap();
        let mut s = request("GET", "/", &[]);
        outcomes.push(
            vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                .unwrap(),
        );
        vm.on_log_and_delete(id, &mut s).unwrap();
    }
    assert_eq!(
        outcomes,
        [Action::Continue, Action::Continue, Action::Pause]
    );
}
