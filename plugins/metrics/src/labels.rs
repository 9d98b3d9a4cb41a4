//! Label values of a request, each from a bounded set: a fixed list of methods, five status
//! classes, the configured routes, the configured models; everything else is `other`.
//!
//! A value from such a set is a [`Label`]: its text and its index in the set, which stands for
//! the text in the series cache's keys (`crate::series`), so that a request's series are found
//! without writing or hashing their names.

use std::borrow::Cow;

pub use tollgate_common::metrics::{sanitize, sanitize_bytes, sanitize_chars};
use tollgate_common::path::{normalize, PathPolicy};
use tollgate_common::route::prefix_matches;

use crate::config::{Route, OTHER};

/// A label value from a bounded set fixed by this crate, the configuration or the VM (its
/// tenants, `crate::tenants`): `text` as the name encoding writes it, and `index`, its position
/// in the set ([`Label::OTHER`]'s index for `other`). Within one set (one label of one family,
/// one VM) the index determines the text, so the index alone identifies the value; a value
/// without a position is [`Label::UNNUMBERED`] and identified by its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label<'a> {
    /// Position in the set; `u32::MAX` for `other`, `u32::MAX - 1` for none.
    pub index: u32,
    /// The value (`[a-z0-9_-]`).
    pub text: &'a str,
}

impl Label<'static> {
    /// `other`: the value of everything outside the set.
    pub const OTHER: Label<'static> = Label {
        index: u32::MAX,
        text: OTHER,
    };

    /// The index of a value without a position in its set.
    pub const UNNUMBERED: u32 = u32::MAX - 1;
}

impl<'a> Label<'a> {
    /// A value without a position in its set (identified by its text).
    pub fn unnumbered(text: &'a str) -> Self {
        Label {
            index: Label::UNNUMBERED,
            text,
        }
    }
}

impl<'a> Label<'a> {
    /// The `index`-th value of a set; [`Label::unnumbered`] past `u32::MAX - 2` (sets are far
    /// smaller: at most [`crate::config::MAX_MODELS`]).
    pub fn nth(index: usize, text: &'a str) -> Self {
        match u32::try_from(index) {
            Ok(index) if index < Label::UNNUMBERED => Label { index, text },
            _ => Label::unnumbered(text),
        }
    }
}

impl Default for Label<'_> {
    fn default() -> Self {
        Label::OTHER
    }
}

/// A label compares equal to its text.
impl PartialEq<&str> for Label<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// Methods with their own label value (RFC 9110 section 9 plus PATCH, RFC 5789), lower case as
/// the name encoding writes them; any other method is `other`.
pub const METHODS: [&str; 9] = [
    "get", "head", "post", "put", "delete", "connect", "options", "trace", "patch",
];

/// The label of a method: one of [`METHODS`] (index: its position) or `other`. Compared
/// case-sensitively (methods are case-sensitive, RFC 9110 section 9.1).
pub fn method_label(method: &[u8]) -> Label<'static> {
    let found = match method {
        b"GET" => 0,
        b"HEAD" => 1,
        b"POST" => 2,
        b"PUT" => 3,
        b"DELETE" => 4,
        b"CONNECT" => 5,
        b"OPTIONS" => 6,
        b"TRACE" => 7,
        b"PATCH" => 8,
        _ => return Label::OTHER,
    };
    METHODS
        .get(found)
        .map_or(Label::OTHER, |text| Label::nth(found, text))
}

/// The status classes, in the index order of [`status_class`]'s labels.
const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// The status class label of a response status: `1xx` .. `5xx` (indices 0 to 4); `none`
/// (index 5) when no response status is known (0: the client went away before a response) or
/// it is outside 100..=599.
pub fn status_class(status: u64) -> Label<'static> {
    let index = match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    };
    STATUS_CLASSES
        .get(index)
        .map_or(Label::OTHER, |text| Label::nth(index, text))
}

/// The route label of a request target (`:path`): the first route whose prefix covers the path
/// in normal form (segment-aware, query ignored, `tollgate_common::route::prefix_matches`; index:
/// its position in `routes`), else `other` (also for a target that cannot be normalised under
/// `paths`).
pub fn route_label<'a>(routes: &'a [Route], target: &[u8], paths: &PathPolicy) -> Label<'a> {
    if routes.is_empty() {
        return Label::OTHER;
    }
    let Ok(request) = normalize(target, paths) else {
        return Label::OTHER;
    };
    routes
        .iter()
        .enumerate()
        .find(|(_, r)| prefix_matches(&r.prefix, &request.path, false))
        .map_or(Label::OTHER, |(i, r)| Label::nth(i, &r.name))
}

/// The model label: the sanitised model if configured (index: its position in `models`), else
/// `other`.
pub fn model_label<'a>(models: &'a [String], model: &str) -> Label<'a> {
    if models.is_empty() {
        return Label::OTHER;
    }
    let label = sanitize(model);
    models
        .iter()
        .enumerate()
        .find(|(_, m)| **m == label)
        .map_or(Label::OTHER, |(i, m)| Label::nth(i, m))
}

/// Longest label value taken from another filter's signal (bytes).
pub const MAX_SIGNAL_BYTES: usize = 32;

/// A label value taken from another filter's signal (a fixed vocabulary there): sanitised and
/// at most [`MAX_SIGNAL_BYTES`], else `other`, so that a misbehaving publisher cannot create long
/// names. Borrowed when the signal is already clean.
pub fn signal_label(value: &str) -> Cow<'_, str> {
    if value.is_empty() || value.len() > MAX_SIGNAL_BYTES {
        return Cow::Borrowed(OTHER);
    }
    sanitize(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_name_the_values() {
        assert_eq!(
            method_label(b"GET"),
            Label {
                index: 0,
                text: "get"
            }
        );
        assert_eq!(method_label(b"PATCH").index, 8);
        assert_eq!(method_label(b"MKCOL"), Label::OTHER);
        for (i, m) in METHODS.iter().enumerate() {
            let upper = m.to_ascii_uppercase();
            assert_eq!(method_label(upper.as_bytes()), Label::nth(i, m));
        }
        for (status, index) in [
            (0, 5),
            (100, 0),
            (199, 0),
            (200, 1),
            (404, 3),
            (599, 4),
            (600, 5),
        ] {
            assert_eq!(status_class(status).index, index, "{status}");
            assert_eq!(status_class(status).text, STATUS_CLASSES[index as usize]);
        }
        let models = vec!["gpt-4o".to_string(), "gpt-4o-mini".to_string()];
        assert_eq!(
            model_label(&models, "GPT-4o-mini"),
            Label {
                index: 1,
                text: "gpt-4o-mini"
            }
        );
        assert_eq!(model_label(&models, "gpt-5"), Label::OTHER);
        assert_eq!(Label::nth(u32::MAX as usize, "x"), Label::unnumbered("x"));
        assert_eq!(Label::nth(u32::MAX as usize - 2, "x").index, u32::MAX - 2);
        assert_eq!(signal_label(""), "other");
        assert_eq!(signal_label(&"a".repeat(33)), "other");
        assert_eq!(signal_label("Per.User"), "per_user");
    }
}
