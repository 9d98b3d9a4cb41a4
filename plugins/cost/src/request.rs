//! The request body of an LLM API call: what the filter reads from it before the upstream (the
//! model, the stream flags) and the one change it makes (`stream_options.include_usage`).
//!
//! A body is read only when every JSON reader an upstream may use reads the same members in it
//! (`crate::unreadable`: one JSON object in UTF-8, the members the filter reads given once, under
//! one spelling, with their APIs' types); otherwise [`RequestBody::parse`] says why not. When the
//! filter rewrites a body, it writes the object back (members in order and values byte for byte,
//! each name once: a name the filter does not read given twice keeps its last value, as
//! `serde_json::Value`, Python's `json`, Go's `encoding/json` and `JSON.parse` read it).
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

use crate::unreadable::{spells, Unreadable};

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

/// What the filter reads from a request body: `model`, `stream`, and `stream_options` with its
/// `include_usage`, under the rules of [`crate::unreadable`].
///
/// Read with `serde_json` as a map whose names are compared as they are decoded and whose other
/// values are skipped (`IgnoredAny`), not kept: the whole body valid UTF-8, checked once, without
/// a `String` per name or a value per member.
#[derive(Debug)]
pub struct RequestBody<'a> {
    /// The body.
    text: &'a str,
    model: Option<String>,
    stream: bool,
    /// `stream_options` (an object or `null`), for the rewrite.
    stream_options: Option<&'a RawValue>,
    include_usage: Option<bool>,
    /// The largest output bound the body declares (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`); `None`: none given (or `null`).
    max_output_tokens: Option<u64>,
    /// `background` is `true` (the Responses API's background mode).
    background: bool,
}

/// The members of one object that the filter reads, as given (`slots`), and whether one of them
/// came twice or another member's name spells one of them ([`spells`]).
struct Slots<'a, const N: usize> {
    slots: [Option<&'a RawValue>; N],
    ambiguous: bool,
}

/// The names read at the top of a body, then inside `stream_options`. The output bounds are
/// Chat Completions' `max_tokens` (deprecated there, Anthropic Messages' required bound) and
/// `max_completion_tokens`, and the Responses API's `max_output_tokens` (OpenAI and Anthropic API
/// references: integers). `background` is the Responses API's (a boolean or null: OpenAI API
/// reference, "Create a model response"), read on every path as the others.
const TOP: [&str; 7] = [
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "background",
];
const OPTIONS: [&str; 1] = ["include_usage"];

/// A member name: the index of the name of `names` it is, `Err(true)` when it is another spelling
/// of one of them, `Err(false)` for any other name.
struct Name<const N: usize>(Result<usize, bool>);

struct NameSeed<const N: usize>(&'static [&'static str; N]);

impl<'de, const N: usize> serde::de::DeserializeSeed<'de> for NameSeed<N> {
    type Value = Name<N>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Name<N>, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<const N: usize> Visitor<'_> for NameSeed<N> {
    type Value = Name<N>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Name<N>, E> {
        if let Some(at) = self.0.iter().position(|n| *n == name) {
            return Ok(Name(Ok(at)));
        }
        // An ASCII name spells a name only in another case, at its length or cut there by a NUL.
        let may_spell = |n: &&str| {
            name.len() == n.len() || name.as_bytes().get(n.len()).is_some_and(|&b| b == 0)
        };
        if name.is_ascii() && !self.0.iter().any(may_spell) {
            return Ok(Name(Err(false)));
        }
        Ok(Name(Err(self.0.iter().any(|n| spells(name, n)))))
    }
}

struct SlotsSeed<const N: usize>(&'static [&'static str; N]);

impl<'de, const N: usize> serde::de::DeserializeSeed<'de> for SlotsSeed<N> {
    type Value = Slots<'de, N>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Slots<'de, N>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for SlotsSeed<N> {
    type Value = Slots<'de, N>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Slots<'de, N>, A::Error> {
        let mut read = Slots {
            slots: [None; N],
            ambiguous: false,
        };
        while let Some(Name(name)) = map.next_key_seed(NameSeed(self.0))? {
            match name.map(|at| read.slots.get_mut(at)) {
                Ok(Some(slot)) => {
                    read.ambiguous |= slot.is_some();
                    *slot = Some(map.next_value::<&RawValue>()?);
                }
                Ok(None) | Err(false) => {
                    map.next_value::<IgnoredAny>()?;
                }
                Err(true) => {
                    read.ambiguous = true;
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(read)
    }
}

/// A token count: a JSON integer ≥ 0 (one beyond `u64` saturates to `u64::MAX`) or `null`
/// (`None`); `Err` for any other value (negative, fractional, exponent, string...), which the
/// APIs refuse and lenient readers (Pydantic's lax mode reads `"100"` as 100) may not.
fn token_count(raw: Option<&RawValue>) -> Result<Option<u64>, Unreadable> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Some(text.parse().unwrap_or(u64::MAX)))
        }
        Some(_) => Err(Unreadable::MemberType),
    }
}

/// A JSON boolean or `null` (`None`): `Err` for any other value.
fn boolean(raw: Option<&RawValue>) -> Result<Option<bool>, Unreadable> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(Unreadable::MemberType),
    }
}

impl<'a> RequestBody<'a> {
    /// Reads a request body (not empty) under the rules of [`crate::unreadable`]: one JSON object
    /// in UTF-8 (`Json` otherwise), `model`, `stream`, `stream_options` and its
    /// `include_usage`, `max_tokens`, `max_completion_tokens`, `max_output_tokens`, `background`
    /// each at most once and under no other spelling (`AmbiguousName`), a string, a boolean or
    /// null, an object or null, a boolean or null, integers ≥ 0 or null, a boolean or null
    /// (`MemberType`; a `model` string
    /// that cannot be decoded, a lone surrogate escape in it, is `Json`).
    pub fn parse(body: &'a [u8]) -> Result<RequestBody<'a>, Unreadable> {
        let text = tollgate_common::bytes::utf8(body).map_err(|_| Unreadable::Json)?;
        let mut de = serde_json::Deserializer::from_str(text);
        let top = serde::de::DeserializeSeed::deserialize(SlotsSeed(&TOP), &mut de)
            .map_err(|_| Unreadable::Json)?;
        de.end().map_err(|_| Unreadable::Json)?;
        if top.ambiguous {
            return Err(Unreadable::AmbiguousName);
        }
        let [model, stream, stream_options, max_tokens, max_completion_tokens, max_output_tokens, background] =
            top.slots;
        let mut declared: Option<u64> = None;
        for raw in [max_tokens, max_completion_tokens, max_output_tokens] {
            declared = declared.max(token_count(raw)?);
        }
        let model = match model {
            None => None,
            Some(raw) if raw.get().starts_with('"') => {
                Some(serde_json::from_str::<String>(raw.get()).map_err(|_| Unreadable::Json)?)
            }
            Some(_) => return Err(Unreadable::MemberType),
        };
        let stream = boolean(stream)? == Some(true);
        let background = boolean(background)? == Some(true);
        let (stream_options, include_usage) = match stream_options {
            None => (None, None),
            Some(raw) if raw.get() == "null" => (Some(raw), None),
            Some(raw) if raw.get().starts_with('{') => {
                let mut de = serde_json::Deserializer::from_str(raw.get());
                let options = serde::de::DeserializeSeed::deserialize(SlotsSeed(&OPTIONS), &mut de)
                    .map_err(|_| Unreadable::Json)?;
                if options.ambiguous {
                    return Err(Unreadable::AmbiguousName);
                }
                let [include_usage] = options.slots;
                (Some(raw), boolean(include_usage)?)
            }
            Some(_) => return Err(Unreadable::MemberType),
        };
        Ok(RequestBody {
            text,
            model,
            stream,
            stream_options,
            include_usage,
            max_output_tokens: declared,
            background,
        })
    }

    /// The output bound the body declares: the largest of `max_tokens`,
    /// `max_completion_tokens` and `max_output_tokens` given (`None`: none).
    pub fn max_output_tokens(&self) -> Option<u64> {
        self.max_output_tokens
    }

    /// `model` (taken: a second call gives `None`).
    pub fn take_model(&mut self) -> Option<String> {
        self.model.take()
    }

    /// Whether `stream` is `true`.
    pub fn stream(&self) -> bool {
        self.stream
    }

    /// Whether `background` is `true`: a Responses request run after its response, whose work
    /// the filter cannot price (`crate::unpriced_calls`).
    pub fn background(&self) -> bool {
        self.background
    }

    /// `stream_options.include_usage` (`None`: not given, or `null`).
    pub fn include_usage(&self) -> Option<bool> {
        self.include_usage
    }

    /// The body with `stream_options.include_usage` set to `true` (the other members of
    /// `stream_options` kept): the body read again as [`Members`], written back. `None` when
    /// it cannot be (not after [`RequestBody::parse`] accepted it).
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
        RequestBody::parse(body.as_bytes())
            .ok()?
            .with_stream_usage()
            .map(|b| String::from_utf8(b).unwrap())
    }

    fn read(body: &[u8]) -> Result<(Option<String>, bool, Option<bool>), Unreadable> {
        let mut b = RequestBody::parse(body)?;
        Ok((b.take_model(), b.stream(), b.include_usage()))
    }

    #[test]
    fn reads_model_and_stream_flags() {
        assert_eq!(
            read(br#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false}}"#),
            Ok((Some("gpt-4o".into()), true, Some(false)))
        );
        assert_eq!(
            read(br#"{"stream":null,"stream_options":null}"#),
            Ok((None, false, None))
        );
        assert_eq!(
            read(br#"{"model":7,"stream":"yes","stream_options":null}"#),
            Err(Unreadable::MemberType)
        );
        assert_eq!(read(b"[1]"), Err(Unreadable::Json));
        assert_eq!(read(b"{\"a\":"), Err(Unreadable::Json));
    }

    #[test]
    fn a_member_read_twice_is_refused_where_the_last_one_won() {
        // Before, the last of each won (and the rewrite kept only it); readers that take the
        // first (RapidJSON's FindMember, simdjson's find_field) read another model.
        let body = br#"{"model":"cheap","stream":true,"model":"gpt-4o","stream_options":{"include_usage":true},"stream_options":{}}"#;
        assert_eq!(read(body), Err(Unreadable::AmbiguousName));
        // Names the filter does not read may repeat: the rewrite keeps the last.
        assert_eq!(
            rewrite(r#"{"model":"m","n":1,"stream":true,"n":2}"#).unwrap(),
            r#"{"model":"m","n":2,"stream":true,"stream_options":{"include_usage":true}}"#
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
        // A name with escapes is written back in its plain form.
        assert_eq!(
            rewrite(r#"{"mod\u0065l":"a","stre\u0061m":true}"#).unwrap(),
            r#"{"model":"a","stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            read(br#"{"mod\u0065l":"a","model":"b"}"#),
            Err(Unreadable::AmbiguousName)
        );
    }

    /// The vectors of `testdata/request_bodies` (written by Python's `json` and Go's
    /// `encoding/json`, with what each reads in them): the filter refuses each body for the
    /// reason listed, and where it reads one, every reader that accepts it reads the same
    /// model, stream flag and `include_usage`.
    #[test]
    fn vectors_read_as_python_and_go_read_them_or_refused() {
        use base64::Engine as _;
        use serde_json::Value;
        let vectors: Vec<Value> =
            serde_json::from_str(include_str!("../testdata/request_bodies/vectors.json")).unwrap();
        let go: serde_json::Map<String, Value> =
            serde_json::from_str(include_str!("../testdata/request_bodies/go_reads.json")).unwrap();
        assert!(vectors.len() > 60);
        for v in &vectors {
            let name = v["name"].as_str().unwrap();
            let body = base64::engine::general_purpose::STANDARD
                .decode(v["body"].as_str().unwrap())
                .unwrap();
            let got = read(&body);
            let label = got.as_ref().map_or_else(|e| e.label(), |_| "ok");
            assert_eq!(label, v["expect"].as_str().unwrap(), "{name}");
            let Ok((model, stream, include_usage)) = got else {
                continue;
            };
            let ours = Value::from(model);
            for reading in [&v["python"], &go[name]]
                .into_iter()
                .filter(|r| !r.is_null())
            {
                assert_eq!(reading["model"], ours, "{name}");
                assert_eq!(reading["stream"] == Value::Bool(true), stream, "{name}");
                assert_eq!(
                    reading["include_usage"],
                    Value::from(include_usage),
                    "{name}"
                );
            }
        }
    }

    /// The reading of the whole body as [`Members`] (a name given twice: the last value), the
    /// way `parse` read bodies before it refused the ambiguous ones: its model, stream flag and
    /// `include_usage`; `None` when it is not an object.
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

    /// On generated bodies (valid and damaged: invalid UTF-8, lone surrogates, escaped and
    /// repeated names), a body `parse` reads is an object read alike through [`Members`], and
    /// its rewrite is the one made from that reading; a body that is no object is refused.
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
            "Model",
            "\\u017ftream",
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
            match RequestBody::parse(body) {
                Ok(mut b) => {
                    objects += 1;
                    assert_eq!(
                        Some((b.take_model(), b.stream(), b.include_usage())),
                        old,
                        "{text}"
                    );
                    let members: Members = serde_json::from_slice(body).unwrap();
                    let mut options = match members.get("stream_options").map(RawValue::get) {
                        None | Some("null") => Members::default(),
                        Some(raw) => serde_json::from_str::<Members>(raw).unwrap(),
                    };
                    options.set(
                        "include_usage",
                        RawValue::from_string("true".into()).unwrap(),
                    );
                    let mut members = members;
                    members.set(
                        "stream_options",
                        RawValue::from_string(String::from_utf8(options.to_json()).unwrap())
                            .unwrap(),
                    );
                    assert_eq!(b.with_stream_usage(), Some(members.to_json()), "{text}");
                }
                Err(_) => others += 1,
            }
        }
        assert!(objects > 3_000 && others > 5_000, "{objects} {others}");
    }

    #[test]
    fn background_is_read_as_the_other_members() {
        let background = |body: &str| RequestBody::parse(body.as_bytes()).map(|b| b.background());
        assert_eq!(background(r#"{"model":"m","background":true}"#), Ok(true));
        assert_eq!(background(r#"{"model":"m","background":false}"#), Ok(false));
        assert_eq!(background(r#"{"model":"m","background":null}"#), Ok(false));
        assert_eq!(background(r#"{"model":"m"}"#), Ok(false));
        // Lenient readers take "true", 1 or the last of two as true: never read as false here.
        for body in [
            r#"{"background":"true"}"#,
            r#"{"background":1}"#,
            r#"{"background":"false"}"#,
            r#"{"background":[true]}"#,
        ] {
            assert_eq!(background(body), Err(Unreadable::MemberType), "{body}");
        }
        for body in [
            r#"{"background":false,"background":true}"#,
            r#"{"background":true,"background":false}"#,
            r#"{"backgr\u006fund":true,"background":false}"#,
            r#"{"Background":true}"#,
            r#"{"BACKGROUND":true,"background":false}"#,
        ] {
            assert_eq!(background(body), Err(Unreadable::AmbiguousName), "{body}");
        }
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
