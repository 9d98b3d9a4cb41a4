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

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
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

/// What the filter reads from a request body: the raw values of `model`, `stream` and
/// `stream_options` (the last of each name given), borrowed from the body.
///
/// Read with `serde_json` as a map whose names are compared as they are decoded and whose other
/// values are skipped (`IgnoredAny`), not kept: a body is accepted exactly when `serde_json`
/// reads it as an object of [`Members`] (the same grammar, names decoded alike, and the whole
/// body valid UTF-8, checked once), without a `String` per name or a value per member.
#[derive(Debug)]
pub struct RequestBody<'a> {
    /// The body.
    text: &'a str,
    model: Option<&'a RawValue>,
    stream: Option<&'a RawValue>,
    stream_options: Option<&'a RawValue>,
}

/// The members [`RequestBody`] reads.
enum Name {
    Model,
    Stream,
    StreamOptions,
    Other,
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Name, E> {
                Ok(match name {
                    "model" => Name::Model,
                    "stream" => Name::Stream,
                    "stream_options" => Name::StreamOptions,
                    _ => Name::Other,
                })
            }
        }
        d.deserialize_identifier(NameVisitor)
    }
}

impl<'de> Deserialize<'de> for RequestBody<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = RequestBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RequestBody<'de>, A::Error> {
                let mut body = RequestBody {
                    text: "",
                    model: None,
                    stream: None,
                    stream_options: None,
                };
                while let Some(name) = map.next_key::<Name>()? {
                    let slot = match name {
                        Name::Model => &mut body.model,
                        Name::Stream => &mut body.stream,
                        Name::StreamOptions => &mut body.stream_options,
                        Name::Other => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value::<&RawValue>()?);
                }
                Ok(body)
            }
        }
        d.deserialize_map(Object)
    }
}

impl<'a> RequestBody<'a> {
    /// The body as a JSON object; `None` when it is not one.
    pub fn parse(body: &'a [u8]) -> Option<RequestBody<'a>> {
        let text = std::str::from_utf8(body).ok()?;
        let mut read: RequestBody<'a> = serde_json::from_str(text).ok()?;
        read.text = text;
        Some(read)
    }

    /// `model`, when it is a string.
    pub fn model(&self) -> Option<String> {
        serde_json::from_str(self.model?.get()).ok()
    }

    /// Whether `stream` is `true`.
    pub fn stream(&self) -> bool {
        self.stream.is_some_and(|raw| raw.get() == "true")
    }

    /// `stream_options.include_usage` when it is a boolean.
    pub fn include_usage(&self) -> Option<bool> {
        #[derive(Deserialize)]
        struct StreamOptions {
            #[serde(default)]
            include_usage: Option<bool>,
        }
        serde_json::from_str::<Option<StreamOptions>>(self.stream_options?.get())
            .ok()
            .flatten()?
            .include_usage
    }

    /// The body with `stream_options.include_usage` set to `true` (the other members of
    /// `stream_options` kept): the body read again as [`Members`], written back. `None` when
    /// `stream_options` is there but not an object (the upstream refuses such a request
    /// anyway).
    pub fn with_stream_usage(self) -> Option<Vec<u8>> {
        let mut members: Members = serde_json::from_str(self.text).ok()?;
        let mut options = match self.stream_options {
            None => Members::default(),
            Some(raw) if raw.get() == "null" => Members::default(),
            Some(raw) => serde_json::from_str::<Members>(raw.get()).ok()?,
        };
        options.set("include_usage", RawValue::from_string("true".into()).ok()?);
        let options = RawValue::from_string(String::from_utf8(options.to_json()).ok()?).ok()?;
        members.set("stream_options", options);
        Some(members.to_json())
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

    /// The reading of the whole body as [`Members`] (what `parse` did before it skipped the
    /// values it does not read): whether it is an object, its model, stream flag and
    /// `include_usage`.
    fn through_members(body: &[u8]) -> Option<(Option<String>, bool, Option<bool>)> {
        let members: Members = serde_json::from_slice(body).ok()?;
        let read = |name: &str| members.get(name).map(RawValue::get);
        let model = read("model").and_then(|raw| serde_json::from_str(raw).ok());
        let stream = read("stream").and_then(|raw| serde_json::from_str(raw).ok());
        #[derive(Deserialize)]
        struct StreamOptions {
            #[serde(default)]
            include_usage: Option<bool>,
        }
        let include_usage = read("stream_options")
            .and_then(|raw| serde_json::from_str::<Option<StreamOptions>>(raw).ok())
            .flatten()
            .and_then(|o| o.include_usage);
        Some((model, stream.unwrap_or(false), include_usage))
    }

    /// The borrowed reading agrees with the reading through [`Members`] on generated bodies
    /// (valid and damaged: invalid UTF-8, lone surrogates, escaped and repeated names), and
    /// its rewrite is the one made from that reading.
    #[test]
    fn agrees_with_the_reading_through_members() {
        use crate::json_gen::{document, Rng};
        const NAMES: &[&str] = &[
            "model",
            "stream",
            "stream_options",
            "include_usage",
            "messages",
            "mod\\u0065l",
            "stre\\u0061m",
            "n",
            "\\ud800",
            "",
        ];
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        let (mut objects, mut others) = (0, 0);
        let mut bodies: Vec<Vec<u8>> = (0..30_000).map(|_| document(&mut r, NAMES)).collect();
        bodies.extend([
            br#"{"model":"m","x":"\xff"}"#.to_vec(),
            b"{\"model\":\"m\",\"x\":\"\xff\"}".to_vec(),
            br#"{"model":"m","x":"\ud800"}"#.to_vec(),
            br#"{"\ud800":1}"#.to_vec(),
            br#"{"model":"\ud800"}"#.to_vec(),
            br#"{"stream": true ,"stream":true}"#.to_vec(),
            br#"{"model":"a"} x"#.to_vec(),
        ]);
        for body in &bodies {
            let text = String::from_utf8_lossy(body);
            let old = through_members(body);
            let new = RequestBody::parse(body);
            assert_eq!(
                new.as_ref()
                    .map(|b| (b.model(), b.stream(), b.include_usage())),
                old,
                "{text}"
            );
            match new {
                Some(b) => {
                    objects += 1;
                    let want = RequestBody::parse(body).and_then(|_| {
                        let members: Members = serde_json::from_slice(body).ok()?;
                        let mut options = match members.get("stream_options").map(RawValue::get) {
                            None | Some("null") => Members::default(),
                            Some(raw) => serde_json::from_str::<Members>(raw).ok()?,
                        };
                        options.set("include_usage", RawValue::from_string("true".into()).ok()?);
                        let mut members = members;
                        members.set(
                            "stream_options",
                            RawValue::from_string(String::from_utf8(options.to_json()).ok()?)
                                .ok()?,
                        );
                        Some(members.to_json())
                    });
                    assert_eq!(b.with_stream_usage(), want, "{text}");
                }
                None => others += 1,
            }
        }
        assert!(objects > 5_000 && others > 5_000, "{objects} {others}");
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
