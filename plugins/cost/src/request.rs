//! The request body of an LLM API call: what the filter reads from it before the upstream (the
//! model, the stream flags) and the one change it makes (`stream_options.include_usage`).
//!
//! The body is read as one JSON object whose members keep their order and their values' exact
//! text (`serde_json::value::RawValue`). A name given twice keeps its last value, as
//! `serde_json::Value`, Python's `json` and JavaScript's `JSON.parse` do. When the filter
//! rewrites a body, it writes that object back (members in order, each name once), so the
//! upstream parses exactly the values the filter decided on, whatever duplicate or oddly escaped
//! names the client sent.
//!
//! OpenAI's Chat Completions and Completions APIs send a streamed response's usage only when the
//! request sets `stream_options.include_usage` (API reference, "stream_options"); without it a
//! stream cannot be priced. [`RequestBody::with_stream_usage`] sets it (keeping the other members
//! of `stream_options`), and the filter removes from the client's stream the usage chunk that
//! the client did not ask for (see `sse`).

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON object's members, in order, each name once (the last value given).
#[derive(Debug, Default)]
pub struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members: Vec<(String, Box<RawValue>)> = Vec::new();
                let mut index: HashMap<String, usize> = HashMap::new();
                while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    match index.get(&name) {
                        Some(&at) => {
                            if let Some(slot) = members.get_mut(at) {
                                slot.1 = value;
                            }
                        }
                        None => {
                            index.insert(name.clone(), members.len());
                            members.push((name, value));
                        }
                    }
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Object)
    }
}

impl Members {
    /// The raw value of member `name`.
    pub fn get(&self, name: &str) -> Option<&RawValue> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    fn set(&mut self, name: &str, value: Box<RawValue>) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name.to_string(), value)),
        }
    }

    /// The object as JSON text.
    pub fn to_json(&self) -> Vec<u8> {
        let size = self
            .0
            .iter()
            .map(|(n, v)| n.len().saturating_add(v.get().len()).saturating_add(4))
            .fold(2usize, usize::saturating_add);
        let mut out = Vec::with_capacity(size);
        out.push(b'{');
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // A String always serializes.
            out.extend_from_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
        out
    }
}

/// What the filter reads from a request body.
#[derive(Debug)]
pub struct RequestBody {
    members: Members,
}

impl RequestBody {
    /// The body as a JSON object; `None` when it is not one.
    pub fn parse(body: &[u8]) -> Option<RequestBody> {
        Some(RequestBody {
            members: serde_json::from_slice(body).ok()?,
        })
    }

    fn read<T: serde::de::DeserializeOwned>(&self, name: &str) -> Option<T> {
        serde_json::from_str(self.members.get(name)?.get()).ok()
    }

    /// `model`, when it is a string.
    pub fn model(&self) -> Option<String> {
        self.read("model")
    }

    /// Whether `stream` is `true`.
    pub fn stream(&self) -> bool {
        self.read::<bool>("stream").unwrap_or(false)
    }

    /// `stream_options.include_usage` when it is a boolean.
    pub fn include_usage(&self) -> Option<bool> {
        #[derive(Deserialize)]
        struct StreamOptions {
            #[serde(default)]
            include_usage: Option<bool>,
        }
        self.read::<Option<StreamOptions>>("stream_options")
            .flatten()?
            .include_usage
    }

    /// The body with `stream_options.include_usage` set to `true` (the other members of
    /// `stream_options` kept). `None` when `stream_options` is there but not an object (the
    /// upstream refuses such a request anyway).
    pub fn with_stream_usage(mut self) -> Option<Vec<u8>> {
        let mut options = match self.members.get("stream_options") {
            None => Members::default(),
            Some(raw) if raw.get() == "null" => Members::default(),
            Some(raw) => serde_json::from_str::<Members>(raw.get()).ok()?,
        };
        options.set("include_usage", RawValue::from_string("true".into()).ok()?);
        let options = RawValue::from_string(String::from_utf8(options.to_json()).ok()?).ok()?;
        self.members.set("stream_options", options);
        Some(self.members.to_json())
    }
}

/// Whether a request path (without its query) is an OpenAI API whose streams carry usage only on
/// request: Chat Completions (`…/chat/completions`) and Completions (`…/completions`).
pub fn stream_usage_on_request(path: &[u8]) -> bool {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    path.ends_with(b"/completions")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(body: &str) -> Option<String> {
        RequestBody::parse(body.as_bytes())?
            .with_stream_usage()
            .map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn reads_model_and_stream_flags() {
        let b = RequestBody::parse(
            br#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false}}"#,
        )
        .unwrap();
        assert_eq!(
            (b.model().as_deref(), b.stream(), b.include_usage()),
            (Some("gpt-4o"), true, Some(false))
        );
        let b = RequestBody::parse(br#"{"model":7,"stream":"yes","stream_options":null}"#).unwrap();
        assert_eq!(
            (b.model(), b.stream(), b.include_usage()),
            (None, false, None)
        );
        assert!(RequestBody::parse(b"[1]").is_none());
        assert!(RequestBody::parse(b"{\"a\":").is_none());
    }

    #[test]
    fn the_last_duplicate_wins_and_the_rewrite_keeps_only_it() {
        let body = r#"{"model":"cheap","stream":true,"model":"gpt-4o","stream_options":{"include_usage":true},"stream_options":{}}"#;
        let b = RequestBody::parse(body.as_bytes()).unwrap();
        assert_eq!(b.model().as_deref(), Some("gpt-4o"));
        assert_eq!(b.include_usage(), None);
        assert_eq!(
            rewrite(body).unwrap(),
            r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn rewrites_keep_values_byte_for_byte() {
        assert_eq!(
            rewrite(r#" {"model" : "m", "temperature": 0.10000000000000001, "n": 123456789012345678901234567890, "messages":[{"role":"user","content":"h\u00e9"}], "stream": true} "#)
                .unwrap(),
            r#"{"model":"m","temperature":0.10000000000000001,"n":123456789012345678901234567890,"messages":[{"role":"user","content":"h\u00e9"}],"stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            rewrite(r#"{"stream_options":{"x":1,"include_usage":false}}"#).unwrap(),
            r#"{"stream_options":{"x":1,"include_usage":true}}"#
        );
        assert_eq!(
            rewrite(r#"{"stream_options":null}"#).unwrap(),
            r#"{"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(rewrite(r#"{"stream_options":"x"}"#), None);
        // Names with escapes are written back in their plain form: one name, one value.
        assert_eq!(
            rewrite(r#"{"mod\u0065l":"a","model":"b"}"#).unwrap(),
            r#"{"model":"b","stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn paths() {
        assert!(stream_usage_on_request(b"/v1/chat/completions"));
        assert!(stream_usage_on_request(b"/openai/v1/completions?x=1"));
        assert!(!stream_usage_on_request(b"/v1/messages"));
        assert!(!stream_usage_on_request(b"/v1/responses"));
        assert!(!stream_usage_on_request(b"/v1/completions/x"));
    }
}
