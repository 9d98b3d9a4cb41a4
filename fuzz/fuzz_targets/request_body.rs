//! The request body reader and the `stream_options.include_usage` rewrite
//! (`tollgate_cost::request`) on arbitrary client bodies. Properties: no panic; the reader sees
//! what `serde_json::Value` sees (the last of duplicate names); a rewritten body is a JSON
//! object with `stream_options.include_usage: true` whose every other member, and every other
//! member of `stream_options`, has the value the client sent; the model and the stream flag
//! the filter decided on are those the upstream will read; a second rewrite changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tollgate_cost::request::RequestBody;

fuzz_target!(|data: &[u8]| {
    let Some(request) = RequestBody::parse(data) else {
        return;
    };
    let (model, stream) = (request.model(), request.stream());
    let original: Option<serde_json::Map<String, Value>> = serde_json::from_slice(data).ok();
    if let Some(o) = &original {
        assert_eq!(
            model,
            o.get("model").and_then(Value::as_str).map(str::to_string)
        );
        assert_eq!(stream, o.get("stream") == Some(&Value::Bool(true)));
    }
    let Some(rewritten) = request.with_stream_usage() else {
        return;
    };
    let again = RequestBody::parse(&rewritten).expect("the rewrite is a JSON object");
    assert_eq!(
        (again.model(), again.stream(), again.include_usage()),
        (model, stream, Some(true))
    );
    let Some(original) = original else {
        // serde_json::Value refused what RawValue accepted (e.g. a number out of f64 range):
        // nothing more to compare with.
        return;
    };
    let new: serde_json::Map<String, Value> =
        serde_json::from_slice(&rewritten).expect("a JSON object");
    for (name, value) in &original {
        if name != "stream_options" {
            assert_eq!(new.get(name), Some(value), "{name}");
        }
    }
    assert_eq!(
        new.len(),
        original.len() + usize::from(!original.contains_key("stream_options"))
    );
    if let Some(Value::Object(before)) = original.get("stream_options") {
        let Some(Value::Object(after)) = new.get("stream_options") else {
            panic!("stream_options is an object");
        };
        for (name, value) in before.iter().filter(|(n, _)| *n != "include_usage") {
            assert_eq!(after.get(name), Some(value), "stream_options.{name}");
        }
    }
    let twice = RequestBody::parse(&rewritten).and_then(RequestBody::with_stream_usage);
    assert_eq!(twice.as_deref(), Some(&rewritten[..]), "idempotent");
});
