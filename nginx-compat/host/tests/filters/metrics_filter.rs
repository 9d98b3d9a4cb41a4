//! Host tests of the metrics filter.

use super::*;

#[test]
fn metrics_defines_and_increments_counters() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("metrics", &host);
    let config = r#"{"routes": [{"name": "api", "prefix": "/api"}]}"#;
    let root = vm.create_root("metrics", config.as_bytes()).unwrap();
    for _ in 0..2 {
        let id = vm.create_http(root).unwrap();
        let mut s = request("GET", "/api/x", &[]);
        s.property_source = Some(Box::new(Props(HashMap::from([
            (b"response\0code".to_vec(), 200i64.to_le_bytes().to_vec()),
            (b"request\0size".to_vec(), 0i64.to_le_bytes().to_vec()),
            (b"response\0size".to_vec(), 42i64.to_le_bytes().to_vec()),
        ]))));
        // A signal of an earlier filter.
        s.properties
            .insert(b"wasmx.tollgate.jwt_auth.outcome".to_vec(), b"ok".to_vec());
        assert_eq!(
            vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                .unwrap(),
            Action::Continue
        );
        s.response_headers = h(&[(":status", "200")]);
        assert_eq!(
            vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, true)
                .unwrap(),
            Action::Continue
        );
        vm.on_log_and_delete(id, &mut s).unwrap();
    }
    let names = host.metric_names();
    let requests = names
        .iter()
        .find(|n| n.starts_with("tollgate_requests_total") && n.contains("2xx"))
        .unwrap_or_else(|| {
            panic!(
                "no request counter in {names:?}; logs:\n{}",
                host.log_text()
            )
        });
    assert!(requests.contains("route.api"), "{requests}");
    assert_eq!(host.metric(requests), Some(2));
    assert_eq!(
        host.metric("tollgate_auth_total.outcome.ok"),
        Some(2),
        "{names:?}"
    );
    let bytes = names
        .iter()
        .find(|n| n.starts_with("tollgate_response_body_bytes_total"))
        .unwrap();
    assert_eq!(host.metric(bytes), Some(84));
    assert!(names
        .iter()
        .any(|n| n.starts_with("tollgate_request_duration_microseconds")));
}
