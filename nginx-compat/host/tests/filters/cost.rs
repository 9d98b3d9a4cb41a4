//! Host tests of cost.

use super::*;

#[test]
fn cost_prices_an_openai_response() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("cost", &host);
    let config = r#"{"prices": {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07,
        "output_cost_per_token": 6e-07}}, "tenant": {"unverified_header": "x-jwt-sub"}}"#;
    let root = vm.create_root("cost", config.as_bytes()).unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = request("POST", "/v1/chat/completions", &[("x-jwt-sub", "alice")]);
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap(),
        Action::Continue
    );
    s.request_body = br#"{"model":"gpt-4o-mini","messages":[]}"#.to_vec();
    assert_eq!(
        vm.on_stream(StreamCallback::RequestBody, id, &mut s, true)
            .unwrap(),
        Action::Continue
    );
    s.response_headers = h(&[(":status", "200"), ("content-type", "application/json")]);
    assert_eq!(
        vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, false)
            .unwrap(),
        Action::Continue
    );
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500}}"#;
    // In two chunks.
    let (first, second) = body.split_at(40);
    s.response_body = first.to_vec();
    assert_eq!(
        vm.on_stream(StreamCallback::ResponseBody, id, &mut s, false)
            .unwrap(),
        Action::Continue
    );
    s.response_body = second.to_vec();
    assert_eq!(
        vm.on_stream(StreamCallback::ResponseBody, id, &mut s, true)
            .unwrap(),
        Action::Continue
    );
    assert!(!s.response_body_changed, "the body passes unchanged");
    // One line for the metrics filter and access logs; 1000 * 150 + 500 * 600 nano-USD, and
    // the time from the request headers to the first response bytes (the clock is real).
    let line = property(&s, "wasmx.tollgate.cost").unwrap_or_else(|| {
        panic!("no line; logs:\n{}", host.log_text());
    });
    let (fixed, first_byte_us) = line
        .rsplit_once(" first_byte_us=")
        .unwrap_or_else(|| panic!("no first_byte_us in {line}"));
    assert_eq!(
        fixed,
        "outcome=priced tenant=alice model=gpt-4o-mini input_tokens=1000 output_tokens=500 \
         cost_nano_usd=450000"
    );
    assert!(first_byte_us.parse::<u64>().is_ok(), "{line}");
    vm.on_log_and_delete(id, &mut s).unwrap();
    assert!(
        !host.shared.borrow().is_empty(),
        "spend booked in shared data"
    );
}
