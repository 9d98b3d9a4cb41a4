//! Route matching shared by the filters' rules: path prefix, methods and hosts.

use serde::Deserialize;

use crate::config::ConfigError;

/// The match part of a rule, as written in a plugin configuration.
///
/// JSON: `{"prefix": "/api", "methods": ["GET", "POST"], "hosts": ["api.example.com"]}`; all
/// optional. An empty or absent list matches everything; `prefix` defaults to `/`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    /// Path prefix (compared to the path without its query), must start with `/`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// HTTP methods (upper case, as sent on the wire); empty matches every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// `Host`/`:authority` values, compared without port and case-insensitively.
    #[serde(default)]
    pub hosts: Vec<String>,
}

fn default_prefix() -> String {
    "/".to_string()
}

impl RouteMatch {
    /// Checks the match; `field` is the JSON path used in errors (e.g. `rules[0]`).
    pub fn validate(&mut self, field: &str) -> Result<(), ConfigError> {
        if !self.prefix.starts_with('/') {
            return Err(ConfigError::new(
                format!("{field}.prefix"),
                "must start with `/`",
            ));
        }
        for (i, m) in self.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::new(
                    format!("{field}.methods[{i}]"),
                    "must be an upper-case HTTP method such as GET",
                ));
            }
        }
        for h in &mut self.hosts {
            *h = h.to_ascii_lowercase();
        }
        Ok(())
    }

    /// Whether a request with this `path` (no query), `method` and `host` matches.
    pub fn matches(&self, path: &str, method: &str, host: &str) -> bool {
        if !path.starts_with(self.prefix.as_str()) {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == method) {
            return false;
        }
        if !self.hosts.is_empty() {
            let host = strip_port(host);
            return self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host));
        }
        true
    }
}

/// `host[:port]` or `[v6]:port` without its port.
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| h.get(1..).unwrap_or(h));
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_prefix_method_host() {
        let mut m = RouteMatch {
            prefix: "/api".into(),
            methods: vec!["GET".into()],
            hosts: vec!["API.example.com".into()],
        };
        m.validate("rules[0]").unwrap();
        assert!(m.matches("/api/x", "GET", "api.example.com:8080"));
        assert!(!m.matches("/api/x", "POST", "api.example.com"));
        assert!(!m.matches("/other", "GET", "api.example.com"));
        assert!(!m.matches("/api", "GET", "evil.example.com"));
        assert!(RouteMatch::default().matches("/anything", "DELETE", "h"));
    }

    #[test]
    fn refuses_bad_matches() {
        let mut m = RouteMatch {
            prefix: "api".into(),
            ..Default::default()
        };
        assert_eq!(m.validate("rules[3]").unwrap_err().field, "rules[3].prefix");
        let mut m = RouteMatch {
            prefix: "/".into(),
            methods: vec!["get".into()],
            hosts: vec![],
        };
        assert_eq!(m.validate("r").unwrap_err().field, "r.methods[0]");
    }

    #[test]
    fn strips_ports() {
        assert_eq!(strip_port("a.b:80"), "a.b");
        assert_eq!(strip_port("a.b"), "a.b");
        assert_eq!(strip_port("[::1]:80"), "::1");
    }
}
