//! Plugin configuration parsing that fails closed and names the offending field.
//!
//! A filter's plugin configuration (the bytes Envoy passes from `configuration` or nginx from
//! `proxy_wasm NAME CONFIG`) is JSON. Every configuration struct uses
//! `#[serde(deny_unknown_fields)]`, so a typo refuses to load instead of being ignored.

use std::fmt;

use serde::de::DeserializeOwned;

/// A configuration that must not be loaded: `field` is the JSON path of the offending value
/// (e.g. `providers.main.issuer`, `rules[2].prefix`), `message` says what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the field (`.` for the document itself).
    pub field: String,
    /// Human-readable reason.
    pub message: String,
}

impl ConfigError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid plugin configuration: field `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// Parses a JSON plugin configuration into `T`.
///
/// Errors: empty input, invalid JSON, unknown fields and wrong types, each naming the JSON path
/// of the field (via `serde_path_to_error`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConfigError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ConfigError::new(
            ".",
            "the plugin configuration is empty (expected a JSON object)",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(value) => match de.end() {
            Ok(()) => Ok(value),
            Err(e) => Err(ConfigError::new(
                ".",
                format!("trailing characters after the JSON object: {e}"),
            )),
        },
        Err(e) => {
            // A member whose name is empty has an empty path: name the document instead.
            let path = Some(e.path().to_string())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| ".".to_string());
            Err(ConfigError::new(path, e.into_inner().to_string()))
        }
    }
}

/// Whether `b` is an RFC 9110 section 5.6.2 `tchar` (also RFC 6265's cookie-name `token`).
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A header name from the configuration, lower-cased. Errors (naming `field`) unless it is a
/// non-empty RFC 9110 section 5.1 token; pseudo-headers (`:path`) are therefore refused.
pub fn header_name(name: &str, field: &str) -> Result<String, ConfigError> {
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(ConfigError::new(
            field,
            format!("{name:?} is not a valid header name (RFC 9110 section 5.1)"),
        ));
    }
    Ok(name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[allow(dead_code)]
        limit: u32,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[allow(dead_code)]
        rules: Vec<Inner>,
    }

    #[test]
    fn names_the_field_of_a_wrong_type() {
        let err = parse_json::<Outer>(br#"{"rules":[{"limit":1},{"limit":"x"}]}"#).unwrap_err();
        assert_eq!(err.field, "rules[1].limit");
        assert!(err.to_string().contains("rules[1].limit"), "{err}");
    }

    #[test]
    fn header_names_are_tokens() {
        assert_eq!(header_name("X-Jwt-Sub", "f").unwrap(), "x-jwt-sub");
        for bad in ["", ":path", "a b", "a\r\nb", "ü"] {
            assert_eq!(
                header_name(bad, "rules[0].header").unwrap_err().field,
                "rules[0].header",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_empty_member_name_still_names_a_field() {
        // Found by fuzz/fuzz_targets/config_jwt_auth.rs: the path of `""` is empty.
        let err = parse_json::<Outer>(b"{\"\": {!}}").unwrap_err();
        assert_eq!(err.field, ".");
    }

    #[test]
    fn refuses_unknown_fields_and_empty_input() {
        let err = parse_json::<Outer>(br#"{"rules":[],"rulez":[]}"#).unwrap_err();
        assert!(err.message.contains("unknown field `rulez`"), "{err}");
        assert!(parse_json::<Outer>(b"  ").is_err());
        assert!(parse_json::<Outer>(b"{\"rules\":[]} x").is_err());
        assert!(parse_json::<Outer>(b"{\"rules\":[]}").is_ok());
    }
}
