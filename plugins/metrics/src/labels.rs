//! Label values of a request, each from a bounded set: a fixed list of methods, five status
//! classes, the configured routes, the configured models; everything else is `other`.

use tollgate_common::path::{normalize, PathPolicy};
use tollgate_common::route::prefix_matches;

use crate::config::{Route, OTHER};

/// Methods with their own label value (RFC 9110 section 9 plus PATCH, RFC 5789), lower case as
/// the name encoding writes them; any other method is `other`.
pub const METHODS: [&str; 9] = [
    "get", "head", "post", "put", "delete", "connect", "options", "trace", "patch",
];

/// The label value of a method: one of [`METHODS`] or `other`. Compared case-sensitively
/// (methods are case-sensitive, RFC 9110 section 9.1).
pub fn method_label(method: &[u8]) -> &'static str {
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
        _ => return OTHER,
    };
    METHODS.get(found).copied().unwrap_or(OTHER)
}

/// The status class label of a response status: `1xx` .. `5xx`; `none` when no response
/// status is known (0: the client went away before a response) or it is outside 100..=599.
pub fn status_class(status: u64) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

/// The route label of a request target (`:path`): the first route whose prefix covers the path
/// in normal form (segment-aware, query ignored, `tollgate_common::route::prefix_matches`), else
/// `other` (also for a target that cannot be normalised under `paths`).
pub fn route_label<'a>(routes: &'a [Route], target: &[u8], paths: &PathPolicy) -> &'a str {
    if routes.is_empty() {
        return OTHER;
    }
    let Ok(request) = normalize(target, paths) else {
        return OTHER;
    };
    routes
        .iter()
        .find(|r| prefix_matches(&r.prefix, &request.path))
        .map_or(OTHER, |r| r.name.as_str())
}

/// A value as the name encoding writes it (`tollgate_common::metrics::metric_name`): ASCII
/// letters lower-cased, `[a-z0-9_-]` kept, anything else `_`.
pub fn sanitize(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect()
}

/// The model label: the sanitised model if configured, else `other`.
pub fn model_label<'a>(models: &'a [String], model: &str) -> &'a str {
    let label = sanitize(model);
    models
        .iter()
        .find(|m| **m == label)
        .map_or(OTHER, String::as_str)
}

/// A label value taken from another filter's signal (a fixed vocabulary there): sanitised and
/// at most 32 bytes, else `other`, so that a misbehaving publisher cannot create long names.
pub fn signal_label(value: &str) -> String {
    if value.is_empty() || value.len() > 32 {
        return OTHER.to_string();
    }
    sanitize(value)
}
