//! Host tests of the metrics filter.

use super::*;

/// One request through the metrics filter: a GET of /api/x answered 200 with 42 bytes, after
/// jwt-auth's `outcome=ok` (a signal of an earlier filter); both header callbacks continue.
fn api_request(vm: &mut Vm, root: RootId) {
    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/api/x", &[]);
    s.property_source = Some(Box::new(Props(HashMap::from([
        (b"response\0code".to_vec(), 200i64.to_le_bytes().to_vec()),
        (b"request\0size".to_vec(), 0i64.to_le_bytes().to_vec()),
        (b"response\0size".to_vec(), 42i64.to_le_bytes().to_vec()),
    ]))));
    s.properties.set(b"wasmx.tollgate.jwt_auth", b"outcome=ok");
    pass_through(vm, id, &mut s);
}

/// Counters are summed in the VM and reach the host on the root context's tick (one
/// `flush_interval_ms`, 1 s by default), each sum once, and at `proxy_on_done`; histograms at
/// once.
#[test]
fn metrics_holds_counters_until_the_tick_or_on_done() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("metrics", &host);
    let root = vm.create_root("metrics", b"{}").unwrap();
    assert_eq!(vm.tick_period_ms(root), 1_000);
    let requests = "tollgate_requests_total.method.get.status_class.2xx.route.other";
    let auth = "tollgate_auth_total.outcome.ok";
    for _ in 0..3 {
        api_request(&mut vm, root);
    }
    assert_eq!(
        host.metric(requests),
        Some(0),
        "held: {:?}",
        host.metric_names()
    );
    assert_eq!(host.metric(auth), Some(0));
    let samples = |host: &MemoryHost| {
        host.metrics
            .borrow()
            .iter()
            .find(|m| m.name.starts_with("tollgate_request_duration_microseconds"))
            .map(|m| m.samples)
    };
    assert_eq!(samples(&host), Some(3), "histograms are recorded at once");
    vm.on_tick(root).unwrap();
    assert_eq!(host.metric(requests), Some(3));
    assert_eq!(host.metric(auth), Some(3));
    vm.on_tick(root).unwrap();
    assert_eq!(
        host.metric(requests),
        Some(3),
        "each sum is handed over once"
    );
    api_request(&mut vm, root);
    assert_eq!(host.metric(requests), Some(3));
    vm.on_root_done(root).unwrap();
    assert_eq!(
        host.metric(requests),
        Some(4),
        "on_done hands over what is held"
    );
    assert_eq!(host.metric(auth), Some(4));
}

#[test]
fn metrics_defines_and_increments_counters() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("metrics", &host);
    // 0: each request's counters reach the host at its end.
    let config = r#"{"routes": [{"name": "api", "prefix": "/api"}], "flush_interval_ms": 0}"#;
    let root = vm.create_root("metrics", config.as_bytes()).unwrap();
    assert_eq!(vm.tick_period_ms(root), 0);
    for _ in 0..2 {
        api_request(&mut vm, root);
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

/// The cost filter's line (`wasmx.tollgate.cost`), read in one property call: its outcome,
/// model, token counts and price become the LLM families, and a quoted value is unquoted.
#[test]
fn metrics_reads_the_cost_filters_line() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("metrics", &host);
    let config = r#"{"models": ["gpt-4o-mini"], "flush_interval_ms": 0}"#;
    let root = vm.create_root("metrics", config.as_bytes()).unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = request("POST", "/v1/chat/completions", &[]);
    s.property_source = Some(Box::new(Props(HashMap::from([(
        b"response\0code".to_vec(),
        200i64.to_le_bytes().to_vec(),
    )]))));
    s.properties.set(
        b"wasmx.tollgate.cost",
        b"outcome=priced tenant=\"a b\" model=gpt-4o-mini input_tokens=1000 \
          output_tokens=500 reasoning_tokens=20 cost_nano_usd=450000 first_byte_us=1500",
    );
    s.properties.set(
        b"wasmx.tollgate.rate_limit",
        b"outcome=allowed rule=\"per tenant\"",
    );
    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    s.response_headers = h(&[(":status", "200")]);
    vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, true)
        .unwrap();
    vm.on_log_and_delete(id, &mut s).unwrap();
    let names = host.metric_names();
    let find = |prefix: &str, parts: &[&str]| {
        names
            .iter()
            .find(|n| n.starts_with(prefix) && parts.iter().all(|p| n.contains(p)))
            .and_then(|n| host.metric(n))
            .unwrap_or_else(|| panic!("no {prefix} {parts:?} in {names:?}"))
    };
    assert_eq!(find("tollgate_llm_requests_total", &["priced"]), 1);
    assert_eq!(
        find("tollgate_llm_tokens_total", &["gpt-4o-mini", "input"]),
        1000
    );
    assert_eq!(
        find("tollgate_llm_tokens_total", &["gpt-4o-mini", "output"]),
        500
    );
    assert_eq!(
        find("tollgate_llm_tokens_total", &["gpt-4o-mini", "reasoning"]),
        20
    );
    assert_eq!(
        find("tollgate_llm_cost_nano_usd_total", &["gpt-4o-mini"]),
        450000
    );
    assert_eq!(
        find("tollgate_rate_limit_total", &["rule.per_tenant", "allowed"]),
        1
    );
    // The time to first token is the cost filter's: this filter saw no body at all.
    let ttft = names
        .iter()
        .find(|n| n.starts_with("tollgate_llm_time_to_first_token"))
        .unwrap_or_else(|| panic!("no time to first token in {names:?}"));
    assert_eq!(host.metric(ttft), Some(1500), "the last sample");
    let samples = host
        .metrics
        .borrow()
        .iter()
        .find(|m| &m.name == ttft)
        .map(|m| m.samples);
    assert_eq!(samples, Some(1));
}
