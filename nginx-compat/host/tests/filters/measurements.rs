//! Measurements in-process, not tests (`--ignored`): the per-request cost of each filter and
//! the headroom of the guest limits' defaults.

use super::*;
use crate::jwt_auth::{demo_claims, gateway_jwt_config, hs256, SECRET};

// Per-request cost in-process (not a test: `cargo test --release -p tollgate-host --test filters
// -- --ignored --nocapture per_request_cost`).

#[test]
#[ignore = "a measurement; run with --release --ignored --nocapture"]
fn per_request_cost() {
    fn measure(filter: &str, config: &str, extra: &[(&str, &str)], expect: Action) {
        let host = Rc::new(MemoryHost::new());
        host.level.set(tollgate_host::LogLevel::Warn);
        let mut vm = vm(filter, &host);
        let root = vm.create_root(filter, config.as_bytes()).unwrap();
        let n = 20_000;
        let mut run = |n: u32| {
            let start = std::time::Instant::now();
            for _ in 0..n {
                let id = vm.create_http(root).unwrap();
                let mut s = request("GET", "/api/things", extra);
                assert_eq!(
                    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                        .unwrap(),
                    expect
                );
                s.response_headers = h(&[(":status", "200")]);
                vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, true)
                    .unwrap();
                vm.on_log_and_delete(id, &mut s).unwrap();
            }
            start.elapsed()
        };
        run(1000);
        let t = run(n);
        println!(
            "{filter}: {:.2} µs per request (create, request headers, response headers, log+delete)",
            t.as_secs_f64() * 1e6 / f64::from(n)
        );
    }
    measure("wasm_floor", "", &[], Action::Continue);
    let auth = format!("Bearer {}", hs256(&demo_claims(), SECRET));
    measure(
        "jwt_auth",
        &gateway_jwt_config(),
        &[("authorization", &auth)],
        Action::Continue,
    );
}

// Run: cargo test --release -p tollgate-host --test filters -- --ignored --nocapture guest_limits_headroom
#[test]
#[ignore = "a measurement behind GuestLimits' defaults; run with --release --ignored --nocapture"]
fn guest_limits_headroom() {
    use std::time::{Duration, Instant};
    fn slowest(times: &mut [Duration]) -> String {
        times.sort();
        let p = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        format!(
            "median {:?}, p99 {:?}, max {:?}",
            p(0.5),
            p(0.99),
            times[times.len() - 1]
        )
    }
    // Start-up: each filter's on_vm_start + on_configure with a realistic configuration.
    let cost_config = {
        // 500 priced models: about the chat models of LiteLLM's price file.
        let mut prices = String::from("{");
        for i in 0..500 {
            if i > 0 {
                prices.push(',');
            }
            prices.push_str(&format!(
                r#""model-{i}": {{"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07}}"#
            ));
        }
        prices.push('}');
        format!(r#"{{"prices": {prices}, "tenant": {{"unverified_header": "x-jwt-sub"}}}}"#)
    };
    let jwt = gateway_jwt_config();
    for (filter, config) in [
        ("jwt_auth", jwt.as_str()),
        ("cost", cost_config.as_str()),
        ("metrics", "{}"),
        ("wasm_floor", ""),
    ] {
        let host = Rc::new(MemoryHost::new());
        host.level.set(tollgate_host::LogLevel::Warn);
        let mut times = Vec::new();
        let mut mem = 0;
        for _ in 0..20 {
            let mut vm = vm(filter, &host);
            let t = Instant::now();
            vm.create_root(filter, config.as_bytes()).unwrap();
            times.push(t.elapsed());
            mem = vm.memory_size();
        }
        println!(
            "{filter}: start-up (on_vm_start + on_configure, {} bytes of configuration): {}; linear memory after: {} KiB",
            config.len(),
            slowest(&mut times),
            mem >> 10
        );
    }
    // Request path: jwt-auth verifying HS256 (caches on), cost reading a 1 MiB response body.
    let host = Rc::new(MemoryHost::new());
    host.level.set(tollgate_host::LogLevel::Warn);
    let mut jwt_vm = vm("jwt_auth", &host);
    let root = jwt_vm.create_root("jwt_auth", jwt.as_bytes()).unwrap();
    let auth = format!("Bearer {}", hs256(&demo_claims(), SECRET));
    let mut times = Vec::new();
    for _ in 0..2000 {
        let id = jwt_vm.create_http(root).unwrap();
        let mut s = request("GET", "/api/things", &[("authorization", &auth)]);
        let t = Instant::now();
        jwt_vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        times.push(t.elapsed());
        jwt_vm.on_log_and_delete(id, &mut s).unwrap();
    }
    println!(
        "jwt_auth on_request_headers (HS256): {}; linear memory: {} KiB",
        slowest(&mut times),
        jwt_vm.memory_size() >> 10
    );
    let mut vm = vm("cost", &host);
    let root = vm.create_root("cost", cost_config.as_bytes()).unwrap();
    let mut body = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"model-7","choices":[{"message":{"content":""#.to_vec();
    body.extend(std::iter::repeat_n(b'x', 1 << 20));
    body.extend_from_slice(
        br#""}}],"usage":{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500}}"#,
    );
    let mut times = Vec::new();
    for _ in 0..50 {
        let id = vm.create_http(root).unwrap();
        let mut s = request("POST", "/v1/chat/completions", &[("x-jwt-sub", "alice")]);
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap();
        s.request_body = br#"{"model":"model-7","messages":[]}"#.to_vec();
        vm.on_stream(StreamCallback::RequestBody, id, &mut s, true)
            .unwrap();
        s.response_headers = h(&[(":status", "200"), ("content-type", "application/json")]);
        vm.on_stream(StreamCallback::ResponseHeaders, id, &mut s, false)
            .unwrap();
        for (i, chunk) in body.chunks(64 << 10).enumerate() {
            s.response_body = chunk.to_vec();
            let eos = (i + 1) * (64 << 10) >= body.len();
            let t = Instant::now();
            vm.on_stream(StreamCallback::ResponseBody, id, &mut s, eos)
                .unwrap();
            times.push(t.elapsed());
        }
        vm.on_log_and_delete(id, &mut s).unwrap();
    }
    println!(
        "cost on_response_body (1 MiB JSON response in 64 KiB chunks): {}; linear memory: {} KiB",
        slowest(&mut times),
        vm.memory_size() >> 10
    );
}
