//! The request body reader and the `stream_options.include_usage` rewrite
//! (`tollgate_cost::request`) on arbitrary client bodies. Properties: no panic; a body the
//! reader accepts is one JSON object in UTF-8 in which each member the filter reads (`model`,
//! `stream`, `stream_options`, its `include_usage`) comes at most once and no other name spells
//! one of them (`tollgate_cost::unreadable::spells`), so that readers taking the first or the
//! last of a name, or matching names without regard to case, read the same; what it reads is
//! what `serde_json::Value` reads; a rewritten body is a JSON object with
//! `stream_options.include_usage: true` whose every other member, and every other member of
//! `stream_options`, has the value the client sent; the model and the stream flag the filter
//! decided on are those the upstream will read; a second rewrite changes nothing.
#![no_main]

use std::fmt;

use libfuzzer_sys::fuzz_target;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use tollgate_cost::request::RequestBody;
use tollgate_cost::unreadable::spells;

/// The members of a JSON object, in order, repeats kept.
struct Names(Vec<(String, Box<RawValue>)>);

impl<'de> serde::Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Names, A::Error> {
                let mut names = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    names.push(member);
                }
                Ok(Names(names))
            }
        }
        d.deserialize_map(V)
    }
}

/// Each of `read` at most once among the names of `members`, and no other name spelling one of
/// them.
fn unambiguous(members: &Names, read: &[&str]) -> bool {
    let names = || members.0.iter().map(|(n, _)| n.as_str());
    read.iter()
        .all(|r| names().filter(|n| spells(n, r)).count() <= 1)
        && names().all(|n| read.contains(&n) || !read.iter().any(|r| spells(n, r)))
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut request) = RequestBody::parse(data) else {
        return;
    };
    let top: Names = serde_json::from_slice(data).expect("an accepted body is an object");
    assert!(unambiguous(&top, &["model", "stream", "stream_options"]));
    if let Some((_, options)) = top.0.iter().find(|(n, _)| n == "stream_options") {
        if let Ok(options) = serde_json::from_str::<Names>(options.get()) {
            assert!(unambiguous(&options, &["include_usage"]));
        }
    }
    let (model, stream, include_usage) = (
        request.take_model(),
        request.stream(),
        request.include_usage(),
    );
    let original: Option<serde_json::Map<String, Value>> = serde_json::from_slice(data).ok();
    if let Some(o) = &original {
        assert_eq!(
            model,
            o.get("model").and_then(Value::as_str).map(str::to_string)
        );
        assert_eq!(stream, o.get("stream") == Some(&Value::Bool(true)));
        let options = o.get("stream_options").and_then(Value::as_object);
        assert_eq!(
            include_usage,
            options
                .and_then(|s| s.get("include_usage"))
                .and_then(Value::as_bool)
        );
    }
    let Some(rewritten) = request.with_stream_usage() else {
        return;
    };
    let mut again = RequestBody::parse(&rewritten).expect("the rewrite is read");
    assert_eq!(
        (again.take_model(), again.stream(), again.include_usage()),
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
    let twice = RequestBody::parse(&rewritten)
        .ok()
        .and_then(RequestBody::with_stream_usage);
    assert_eq!(twice.as_deref(), Some(&rewritten[..]), "idempotent");
});
