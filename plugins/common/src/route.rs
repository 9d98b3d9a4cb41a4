//! Route matching shared by the filters' rules: a path (segment-aware prefix or exact), methods
//! and hosts. Paths are compared in normal form ([`crate::path::normalize`]), never as received.

use serde::Deserialize;

use crate::authority::canonical_config_host;
use crate::bytes::same_bytes;
use crate::config::ConfigError;
use crate::path::{is_normal, PathPolicy};

/// The match part of a rule, as written in a plugin configuration.
///
/// JSON: `{"prefix": "/api", "methods": ["GET", "POST"], "hosts": ["api.example.com"]}` or
/// `{"path": "/healthz"}`; all optional. An empty or absent list matches everything; without
/// `prefix` and `path` every path matches (`prefix` `/`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    /// Segment-aware path prefix (see [`prefix_matches`]); a normal path starting with `/`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Exact path (without query), instead of `prefix`; a normal path starting with `/`.
    #[serde(default)]
    pub path: Option<String>,
    /// HTTP methods (upper case, as sent on the wire); empty matches every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Hosts, each in canonical form once loaded ([`crate::authority`]: lower case, no port,
    /// no trailing dot), compared with the request's canonical host.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Compare the path ignoring ASCII case (Envoy's `StringMatcher.ignore_case`); off by default,
    /// as Envoy's route matching and nginx's `location` prefixes, since RFC 3986 section 6.2.2.1
    /// makes paths case-sensitive. Turn it on for a rule that guards an upstream which reads
    /// paths case-insensitively.
    #[serde(default)]
    pub ignore_case: bool,
}

/// Whether `prefix` covers `path` segment by segment (both in normal form): `path` is `prefix`,
/// or continues it after a `/` (`/healthz` covers `/healthz` and `/healthz/live`, not
/// `/healthzX`). A prefix ending in `/` covers the paths that start with it (`/v1/` covers
/// `/v1/` and `/v1/chat`, not `/v1`). This is Envoy's `path_separated_prefix`, extended to
/// prefixes with a trailing slash. `ignore_case`: the prefix's ASCII letters match either case.
pub fn prefix_matches(prefix: &str, path: &str, ignore_case: bool) -> bool {
    let rest = if ignore_case {
        match (path.get(..prefix.len()), path.get(prefix.len()..)) {
            (Some(head), Some(rest)) if head.eq_ignore_ascii_case(prefix) => rest,
            _ => return false,
        }
    } else {
        // `same_bytes` a word at a time: `strip_prefix` calls the guest's byte-at-a-time
        // `memcmp` (this runs for every rule on every request).
        match (path.get(..prefix.len()), path.get(prefix.len()..)) {
            (Some(head), Some(rest)) if same_bytes(head.as_bytes(), prefix.as_bytes()) => rest,
            _ => return false,
        }
    };
    rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/')
}

impl RouteMatch {
    /// A match for every request whose path has `prefix`.
    pub fn prefix(prefix: &str) -> Self {
        Self {
            prefix: Some(prefix.to_string()),
            ..Self::default()
        }
    }

    /// Checks the match; `field` is the JSON path used in errors (e.g. `rules[0]`). Paths must
    /// be in normal form under `policy` (a prefix such as `/v1/../x` or `//v1` could never match
    /// a normalised request).
    pub fn validate(&mut self, field: &str, policy: &PathPolicy) -> Result<(), ConfigError> {
        if self.prefix.is_some() && self.path.is_some() {
            return Err(ConfigError::new(
                format!("{field}.path"),
                "give either `prefix` or `path`, not both",
            ));
        }
        for (name, value) in [("prefix", &self.prefix), ("path", &self.path)] {
            if let Some(p) = value {
                if !is_normal(p, policy) {
                    return Err(ConfigError::new(
                        format!("{field}.{name}"),
                        format!(
                            "{p:?} must be a path in normal form starting with `/` (no query, \
                             `//`, dot segments or escapes of unreserved characters)"
                        ),
                    ));
                }
            }
        }
        for (i, m) in self.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::new(
                    format!("{field}.methods[{i}]"),
                    "must be an upper-case HTTP method such as GET",
                ));
            }
        }
        for (i, h) in self.hosts.iter_mut().enumerate() {
            *h = canonical_config_host(h).map_err(|e| {
                ConfigError::new(
                    format!("{field}.hosts[{i}]"),
                    format!("{h:?} is not a host name in canonical form without a port: {e}"),
                )
            })?;
        }
        Ok(())
    }

    /// Whether the match looks at the path (false for a match of every path).
    pub fn needs_path(&self) -> bool {
        self.path.is_some() || self.prefix.as_deref().is_some_and(|p| p != "/")
    }

    /// Whether a request with this normal `path` (no query), `method` and canonical `host`
    /// ([`crate::authority::canonical_host`]) matches. A match that does not need the path
    /// ([`Self::needs_path`]: prefix `/`) matches any `path`, including the empty one a filter
    /// passes when it did not read `:path`.
    pub fn matches(&self, path: &str, method: &str, host: &str) -> bool {
        let path_ok = match (&self.path, &self.prefix) {
            (Some(exact), _) if self.ignore_case => path.eq_ignore_ascii_case(exact),
            (Some(exact), _) => path == exact,
            (None, Some(prefix)) => prefix == "/" || prefix_matches(prefix, path, self.ignore_case),
            (None, None) => true,
        };
        if !path_ok {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == method) {
            return false;
        }
        if !self.hosts.is_empty() {
            return self.hosts.iter().any(|h| h == host);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_prefix_method_host() {
        let mut m = RouteMatch {
            prefix: Some("/api".into()),
            methods: vec!["GET".into()],
            hosts: vec!["API.example.com".into()],
            ..Default::default()
        };
        m.validate("rules[0]", &PathPolicy::default()).unwrap();
        assert_eq!(m.hosts, ["api.example.com"]);
        assert!(m.matches("/api/x", "GET", "api.example.com"));
        assert!(!m.matches("/api/x", "POST", "api.example.com"));
        assert!(!m.matches("/other", "GET", "api.example.com"));
        assert!(!m.matches("/api", "GET", "evil.example.com"));
        assert!(RouteMatch::default().matches("/anything", "DELETE", "h"));
    }

    #[test]
    fn prefixes_are_segment_aware() {
        let healthz = RouteMatch::prefix("/healthz");
        assert!(healthz.matches("/healthz", "GET", ""));
        assert!(healthz.matches("/healthz/", "GET", ""));
        assert!(healthz.matches("/healthz/live", "GET", ""));
        assert!(!healthz.matches("/healthzX", "GET", ""));
        assert!(!healthz.matches("/healthz.json", "GET", ""));
        let v1 = RouteMatch::prefix("/v1/");
        assert!(v1.matches("/v1/chat", "GET", ""));
        assert!(v1.matches("/v1/", "GET", ""));
        assert!(!v1.matches("/v1", "GET", ""));
        assert!(!v1.matches("/v10/chat", "GET", ""));
        assert!(RouteMatch::prefix("/").matches("/x", "GET", ""));
        assert!(!RouteMatch::prefix("/").needs_path());
        // Filters skip reading `:path` for such a match and pass "": it still matches.
        assert!(RouteMatch::prefix("/").matches("", "GET", "h"));
        assert!(RouteMatch::default().matches("", "GET", "h"));
        assert!(healthz.needs_path());
    }

    #[test]
    fn exact_paths() {
        let m = RouteMatch {
            path: Some("/healthz".into()),
            ..Default::default()
        };
        assert!(m.matches("/healthz", "GET", ""));
        assert!(!m.matches("/healthz/", "GET", ""));
        assert!(!m.matches("/healthz/x", "GET", ""));
        assert!(m.needs_path());
    }

    #[test]
    fn refuses_bad_matches() {
        let policy = PathPolicy::default();
        let field = |m: RouteMatch| {
            let mut m = m;
            m.validate("rules[3]", &policy).unwrap_err().field
        };
        assert_eq!(field(RouteMatch::prefix("api")), "rules[3].prefix");
        for bad in [
            "/v1/../admin",
            "//v1",
            "/v1/%61",
            "/a%2Fb",
            "/x?y=1",
            "/a;b",
        ] {
            assert_eq!(field(RouteMatch::prefix(bad)), "rules[3].prefix", "{bad}");
        }
        let both = RouteMatch {
            prefix: Some("/a".into()),
            path: Some("/b".into()),
            ..Default::default()
        };
        assert_eq!(field(both), "rules[3].path");
        let exact = RouteMatch {
            path: Some("/a/./b".into()),
            ..Default::default()
        };
        assert_eq!(field(exact), "rules[3].path");
        let method = RouteMatch {
            methods: vec!["get".into()],
            ..Default::default()
        };
        assert_eq!(field(method), "rules[3].methods[0]");
    }

    #[test]
    fn configured_hosts_are_canonical() {
        let mut m = RouteMatch {
            hosts: vec!["Status.Example.com.".into()],
            ..Default::default()
        };
        m.validate("rules[1]", &PathPolicy::default()).unwrap();
        assert_eq!(m.hosts, ["status.example.com"]);
        for bad in ["api.example.com:443", "*.example.com", "127.1", ""] {
            let mut m = RouteMatch {
                hosts: vec!["ok.example".into(), bad.into()],
                ..Default::default()
            };
            let e = m.validate("rules[1]", &PathPolicy::default()).unwrap_err();
            assert_eq!(e.field, "rules[1].hosts[1]", "{bad}");
        }
    }

    #[test]
    fn ignore_case() {
        let mut m = RouteMatch {
            prefix: Some("/v1/".into()),
            ..Default::default()
        };
        assert!(!m.matches("/V1/chat/completions", "POST", ""));
        m.ignore_case = true;
        assert!(m.matches("/V1/chat/completions", "POST", ""));
        assert!(m.matches("/v1/Chat", "POST", ""));
        assert!(!m.matches("/V10/chat", "POST", ""));
        assert!(!m.matches("/V", "POST", ""));
        let exact = RouteMatch {
            path: Some("/admin".into()),
            ignore_case: true,
            ..Default::default()
        };
        assert!(exact.matches("/ADMIN", "GET", ""));
        assert!(!exact.matches("/ADMIN/x", "GET", ""));
        // Multi-byte characters never split a comparison (`get` on a char boundary).
        let accented = RouteMatch {
            prefix: Some("/ab".into()),
            ignore_case: true,
            ..Default::default()
        };
        assert!(!accented.matches("/\u{e9}x", "GET", ""));
    }
}
