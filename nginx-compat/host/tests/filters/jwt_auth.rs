//! Host tests of jwt-auth, with the plugin configuration of envoy/gateway.yaml.

use super::*;

pub(crate) const SECRET: &str = "tollgate-demo-secret-change-me-0123456789";

pub(crate) fn gateway_jwt_config() -> String {
    let yaml = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../envoy/gateway.yaml"),
    )
    .unwrap();
    // The JSON block under `value: |`, indented.
    let start = yaml
        .find("value: |")
        .expect("gateway.yaml has a plugin configuration");
    let rest = &yaml[start..];
    let open = rest.find('{').unwrap();
    let mut depth = 0;
    let mut end = 0;
    for (i, c) in rest[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = open + i + 1;
                    break;
                }
            }
            _ => {}
        }
    }
    let json = &rest[open..end];
    assert!(json.contains("hmac_secrets") && json.contains(SECRET));
    json.to_owned()
}

pub(crate) fn hs256(claims: &str, secret: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(r#"{"alg":"HS256","typ":"JWT","kid":"demo"}"#);
    let payload = b64.encode(claims);
    let input = format!("{header}.{payload}");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    let sig = b64.encode(mac.finalize().into_bytes());
    format!("{input}.{sig}")
}

pub(crate) fn demo_claims() -> String {
    let now = now_secs();
    format!(
        r#"{{"iss":"https://demo.tollgate.local","aud":"demo-api","sub":"alice","role":"admin","iat":{now},"exp":{}}}"#,
        now + 3600
    )
}

#[test]
fn jwt_auth_without_token_is_401() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let root = vm
        .create_root("jwt_auth", gateway_jwt_config().as_bytes())
        .unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/api/things", &[]);
    let action = vm
        .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    assert_eq!(action, Action::Pause);
    let local = s.local_response.as_ref().expect("a local response");
    assert_eq!(local.status, 401);
    let www = header(&local.headers, "www-authenticate").expect("www-authenticate");
    assert!(www.starts_with("Bearer realm=\"tollgate\""), "{www}");
    assert_eq!(
        property(&s, "wasmx.tollgate.jwt_auth"),
        Some("outcome=missing_token")
    );
    vm.on_log_and_delete(id, &mut s).unwrap();
    assert!(!vm.is_poisoned());
    // The refusal is counted through the metrics ABI.
    assert_eq!(
        host.metric("tollgate_jwt_auth_requests_total.outcome.missing_token"),
        Some(1),
        "metrics: {:?}",
        host.metric_names()
    );
}

#[test]
fn jwt_auth_valid_hs256_token_sets_claim_headers() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let root = vm
        .create_root("jwt_auth", gateway_jwt_config().as_bytes())
        .unwrap();
    let token = hs256(&demo_claims(), SECRET);
    // Twice: the second request takes the verified-token cache.
    for _ in 0..2 {
        let id = vm.create_http(root).unwrap();
        let auth = format!("Bearer {token}");
        let mut s = request(
            "GET",
            "/api/things",
            &[("authorization", &auth), ("x-jwt-sub", "forged")],
        );
        let action = vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(action, Action::Continue, "logs:\n{}", host.log_text());
        assert!(s.local_response.is_none());
        assert!(s.request_headers_changed);
        assert_eq!(header(&s.request_headers, "x-jwt-sub"), Some("alice"));
        assert_eq!(header(&s.request_headers, "x-jwt-role"), Some("admin"));
        assert_eq!(
            s.request_headers
                .iter()
                .filter(|(k, _)| k == b"x-jwt-sub")
                .count(),
            1,
            "the forged copy is replaced"
        );
        assert!(header(&s.request_headers, "x-jwt-payload").is_some());
        assert_eq!(
            header(&s.request_headers, "authorization"),
            None,
            "token header removed"
        );
        assert_eq!(property(&s, "wasmx.tollgate.jwt_auth"), Some("outcome=ok"));
        vm.on_log_and_delete(id, &mut s).unwrap();
    }
}

/// The verified-token cache hashes a token's last 32 bytes (its signature's): a client that
/// holds a cached token and keeps its signature segment on a payload of its own (`role` raised,
/// `sub` changed) shares the cached token's bucket, and is refused (401 `invalid_token`), before
/// and after; the genuine token still passes from the cache.
#[test]
fn jwt_auth_a_cached_tokens_signature_on_a_forged_payload_is_refused() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let root = vm
        .create_root("jwt_auth", gateway_jwt_config().as_bytes())
        .unwrap();
    let genuine = hs256(&demo_claims(), SECRET);
    let signature = genuine.rsplit('.').next().unwrap();
    let forged_claims = demo_claims()
        .replace(r#""role":"admin""#, r#""role":"root""#)
        .replace(r#""sub":"alice""#, r#""sub":"mallory""#);
    let forged = hs256(&forged_claims, SECRET);
    let (forged_head, _) = forged.rsplit_once('.').unwrap();
    let forged = format!("{forged_head}.{signature}");
    assert_eq!(&forged[forged.len() - 32..], &genuine[genuine.len() - 32..]);
    let mut send = |token: &str| {
        let id = vm.create_http(root).unwrap();
        let auth = format!("Bearer {token}");
        let mut s = request("GET", "/api/things", &[("authorization", &auth)]);
        let action = vm
            .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        let status = s.local_response.as_ref().map(|l| l.status);
        let sub = header(&s.request_headers, "x-jwt-sub").map(str::to_owned);
        vm.on_log_and_delete(id, &mut s).unwrap();
        (action, status, sub)
    };
    for round in 0..3 {
        assert_eq!(
            send(&genuine),
            (Action::Continue, None, Some("alice".to_owned())),
            "round {round}"
        );
        assert_eq!(
            send(&forged),
            (Action::Pause, Some(401), None),
            "round {round}"
        );
    }
}

#[test]
fn jwt_auth_wrong_secret_and_bypass() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let root = vm
        .create_root("jwt_auth", gateway_jwt_config().as_bytes())
        .unwrap();
    let token = hs256(&demo_claims(), "another-secret-of-sufficient-length-0123");
    let id = vm.create_http(root).unwrap();
    let auth = format!("Bearer {token}");
    let mut s = request("GET", "/api", &[("authorization", &auth)]);
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap(),
        Action::Pause
    );
    let local = s.local_response.as_ref().unwrap();
    assert_eq!(local.status, 401);
    assert!(header(&local.headers, "www-authenticate")
        .unwrap()
        .contains("invalid_token"));
    assert!(std::str::from_utf8(&local.body).unwrap().contains("error"));
    vm.on_log_and_delete(id, &mut s).unwrap();

    let id = vm.create_http(root).unwrap();
    let mut s = request("GET", "/healthz", &[]);
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap(),
        Action::Continue
    );
    assert_eq!(
        property(&s, "wasmx.tollgate.jwt_auth"),
        Some("outcome=bypass")
    );
    vm.on_log_and_delete(id, &mut s).unwrap();
}

#[test]
fn jwt_auth_bad_configuration_fails_create_root() {
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let err = vm
        .create_root("jwt_auth", br#"{"providers": {"demo": {"issuer": 5}}}"#)
        .unwrap_err();
    assert!(err.0.contains("proxy_on_configure"), "{err}");
    assert!(
        host.logged("invalid plugin configuration: field `providers.demo.issuer`"),
        "logs:\n{}",
        host.log_text()
    );
    assert!(!vm.is_poisoned());
    // The Vm stays usable for a good configuration.
    vm.create_root("jwt_auth", gateway_jwt_config().as_bytes())
        .unwrap();
}

#[test]
fn jwt_auth_remote_jwks_over_http_call() {
    let vectors: serde_like::Value = serde_like::parse(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../plugins/jwt-auth/testdata/vectors.json"),
        )
        .unwrap(),
    );
    let jwks = vectors.field("jwks");
    let host = Rc::new(MemoryHost::new());
    let mut vm = vm("jwt_auth", &host);
    let config = r#"{"providers": {"main": {"issuer": "https://issuer.test",
        "remote_jwks": {"cluster": "idp", "path": "/jwks.json", "authority": "idp.test"}}}}"#;
    let root = vm.create_root("jwt_auth", config.as_bytes()).unwrap();
    assert!(vm.tick_period_ms(root) > 0);
    let dispatched = vm.calls_dispatched();
    vm.on_tick(root).unwrap();
    let calls = host.calls.borrow().clone();
    assert_eq!(calls.len(), 1, "logs:\n{}", host.log_text());
    // The count an embedding compares around a callback to learn that it dispatched a call.
    assert_eq!(vm.calls_dispatched(), dispatched + 1);
    let call = &calls[0];
    assert_eq!(call.upstream, "idp");
    assert_eq!(header(&call.headers, ":path"), Some("/jwks.json"));
    assert_eq!(header(&call.headers, ":authority"), Some("idp.test"));
    assert!(call.timeout_ms > 0);
    let response = HttpCallResponse {
        headers: h(&[(":status", "200"), ("content-type", "application/json")]),
        body: jwks.into_bytes(),
        trailers: Vec::new(),
    };
    // Before the JWKS arrives, a token of that issuer cannot be checked at all.
    let token = vector_token(&vectors, "expired");
    assert_eq!(
        jwt_result(&mut vm, root, &token),
        "keys_unavailable",
        "logs:\n{}",
        host.log_text()
    );
    assert_eq!(
        vm.calls_dispatched(),
        dispatched + 1,
        "a request that dispatched nothing"
    );
    vm.on_http_call_response(call.token, Some(response))
        .unwrap();
    assert!(
        host.logged("fetched 1004 bytes"),
        "logs:\n{}",
        host.log_text()
    );
    // Once installed, its signature verifies under the fetched key and the token is refused
    // for the reason the vectors give (its lifetime), not for want of keys.
    assert_eq!(
        jwt_result(&mut vm, root, &token),
        "expired",
        "logs:\n{}",
        host.log_text()
    );
    // A failed call is reported with no headers and no body, without trapping.
    vm.on_http_call_response(12345, None).unwrap();
    assert!(!vm.is_poisoned());
}

/// The outcome in `wasmx.tollgate.jwt_auth` of one request bearing `token`.
fn jwt_result(vm: &mut Vm, root: tollgate_host::RootId, token: &str) -> String {
    let id = vm.create_http(root).unwrap();
    let auth = format!("Bearer {token}");
    let mut s = request("GET", "/v1/things", &[("authorization", &auth)]);
    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    let result = property(&s, "wasmx.tollgate.jwt_auth")
        .unwrap_or_default()
        .strip_prefix("outcome=")
        .unwrap_or_default()
        .to_owned();
    vm.on_log_and_delete(id, &mut s).unwrap();
    result
}

/// The token named `name` in the vectors file (`{"name": ..., "token": "..."}`).
fn vector_token(vectors: &serde_like::Value, name: &str) -> String {
    let text = vectors.text();
    let at = text.find(&format!("\"name\": \"{name}\"")).unwrap();
    let rest = &text[at..];
    let key = "\"token\": \"";
    let start = rest.find(key).unwrap() + key.len();
    let len = rest[start..].find('"').unwrap();
    rest[start..start + len].to_owned()
}

/// Just enough JSON to cut a sub-object out of the vectors file as text.
mod serde_like {
    pub struct Value(String);
    pub fn parse(text: &str) -> Value {
        Value(text.to_owned())
    }
    impl Value {
        pub fn text(&self) -> &str {
            &self.0
        }
        /// The raw text of the object value of `"name": {...}` at top level.
        pub fn field(&self, name: &str) -> String {
            let key = format!("\"{name}\"");
            let at = self.0.find(&key).unwrap() + key.len();
            let open = at + self.0[at..].find('{').unwrap();
            let mut depth = 0;
            let mut in_str = false;
            let mut escaped = false;
            for (i, c) in self.0[open..].char_indices() {
                if in_str {
                    match (escaped, c) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => in_str = false,
                        _ => {}
                    }
                    continue;
                }
                match c {
                    '"' => in_str = true,
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return self.0[open..open + i + 1].to_owned();
                        }
                    }
                    _ => {}
                }
            }
            panic!("unterminated object");
        }
    }
}
