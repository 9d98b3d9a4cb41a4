//! Where a filter takes a request's identity from (metrics' tenant label, cost's tenant, a
//! rate-limit key part), and which sources it trusts.
//!
//! A client can send any header, including the ones jwt-auth writes (`x-jwt-sub`). So a value is
//! trusted only when a verified source set it on this request: jwt-auth publishes each claim
//! header it writes after verifying the token as the property
//! `wasmx.tollgate.jwt_auth.header.<name>` (per-stream state, which a client can neither set nor see;
//! `crate::signals`). A request that jwt-auth refused, bypassed or never saw has no such property
//! and gets the fixed identity [`UNAUTHENTICATED`], never the client's string.
//!
//! Configuration: `{"header": NAME}` is the verified value of claim header NAME (the default,
//! and the only trusted form); `{"unverified_header": NAME}` takes the request header as sent,
//! for a header that a proxy in front of the gateway sets and strips (anything else lets a
//! client choose its identity). `{"api_key_header": NAME}` (and `unverified_header` naming
//! `authorization` or `proxy-authorization`) is a credential the upstream checks: read in its
//! canonical form (`crate::credential`), so that one credential is one identity whatever its
//! spelling, and refused when the header does not hold exactly one.

use crate::config::{header_name, ConfigError};
use crate::credential::{canonical_credential, is_authorization_header, CredentialError};
use crate::signals;

/// The identity of a request that no verified source vouched for.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// Where an identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// The value jwt-auth wrote into request header `header` after verifying this request's
    /// token, read from its property `property` (`wasmx.tollgate.jwt_auth.header.<header>`).
    Verified {
        /// Header name (lower case).
        header: String,
        /// The property holding the verified value.
        property: String,
    },
    /// Request header `header` as received (lower case): trusted as is.
    Unverified {
        /// Header name (lower case).
        header: String,
    },
    /// The credential in request header `header` (lower case), in canonical form
    /// (`crate::credential`): an API key, or an `Authorization` value.
    Credential {
        /// Header name (lower case).
        header: String,
    },
}

/// A request's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A value from the source (non-empty bytes).
    Value(Vec<u8>),
    /// The source vouched for the request but has no value: a verified token without that
    /// claim, or an absent unverified header.
    Absent,
    /// No verified source vouched for the request.
    Unauthenticated,
    /// A credential header that does not hold exactly one credential: the request is refused
    /// (a filter cannot tell which credential the upstream will read).
    Invalid(CredentialError),
}

/// What an identity is read from (the host glue reads the host; tests use plain values).
pub trait IdentityView {
    /// A property of this request (`proxy_get_property`), `None` if unset.
    fn property(&self, name: &str) -> Option<Vec<u8>>;
    /// A request header's raw value, `None` if absent.
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// Every value of request header `name` and of the names CGI-style upstreams read as it
    /// (`crate::http::cgi_fold`), in order; `None` when the host cannot list the headers.
    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>>;
}

impl IdentitySource {
    /// The source configured by `header` (verified) or `unverified_header`, exactly one of
    /// them; `field` names the object holding them in errors.
    pub fn from_config(
        header: Option<&str>,
        unverified_header: Option<&str>,
        field: &str,
    ) -> Result<Self, ConfigError> {
        match (header, unverified_header) {
            (Some(h), None) => Ok(Self::verified(&header_name(h, &format!("{field}.header"))?)),
            (None, Some(h)) => {
                let header = header_name(h, &format!("{field}.unverified_header"))?;
                Ok(if is_authorization_header(&header) {
                    IdentitySource::Credential { header }
                } else {
                    IdentitySource::Unverified { header }
                })
            }
            _ => Err(ConfigError::new(
                field,
                "give exactly one of `header` (a claim header verified by jwt-auth) and \
                 `unverified_header` (a header trusted as sent)",
            )),
        }
    }

    /// The verified value of claim header `header` (lower case).
    pub fn verified(header: &str) -> Self {
        IdentitySource::Verified {
            header: header.to_string(),
            property: signals::verified_header(header),
        }
    }

    /// The credential in header `header` (already a valid name, lower case).
    pub fn credential(header: &str) -> Self {
        IdentitySource::Credential {
            header: header.to_string(),
        }
    }

    /// The header name, for logs.
    pub fn header(&self) -> &str {
        match self {
            IdentitySource::Verified { header, .. }
            | IdentitySource::Unverified { header }
            | IdentitySource::Credential { header } => header,
        }
    }

    /// The request's identity: one property read for a verified request with the claim (two
    /// when the claim is absent or the request unverified); one header read when unverified.
    pub fn read(&self, view: &impl IdentityView) -> Identity {
        match self {
            IdentitySource::Verified { property, .. } => match view.property(property) {
                Some(v) if !v.is_empty() => Identity::Value(v),
                _ if view
                    .property(signals::JWT_AUTH)
                    .is_some_and(|line| signals::has_outcome(&line, "ok")) =>
                {
                    Identity::Absent
                }
                _ => Identity::Unauthenticated,
            },
            IdentitySource::Unverified { header } => match view.header(header) {
                Some(v) if !v.is_empty() => Identity::Value(v),
                _ => Identity::Absent,
            },
            IdentitySource::Credential { header } => {
                let Some(values) = view.header_values(header) else {
                    return Identity::Invalid(CredentialError::Unreadable);
                };
                match canonical_credential(header, &values) {
                    Ok(Some(v)) => Identity::Value(v),
                    Ok(None) => Identity::Absent,
                    Err(e) => Identity::Invalid(e),
                }
            }
        }
    }
}

/// The host's properties and request headers (proxy-wasm ABI), errors read as absent.
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Clone, Copy, Default)]
pub struct HostIdentityView;

#[cfg(target_arch = "wasm32")]
impl IdentityView for HostIdentityView {
    fn property(&self, name: &str) -> Option<Vec<u8>> {
        crate::host_calls::property(&[name])
    }

    fn header(&self, name: &str) -> Option<Vec<u8>> {
        crate::host_calls::request_header_bytes(name)
    }

    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        crate::host_calls::request_header_values(name).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct View {
        properties: Vec<(&'static str, &'static [u8])>,
        headers: Vec<(&'static str, &'static [u8])>,
    }

    impl IdentityView for View {
        fn property(&self, name: &str) -> Option<Vec<u8>> {
            let found = self.properties.iter().find(|(n, _)| *n == name);
            found.map(|(_, v)| v.to_vec())
        }
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            let found = self.headers.iter().find(|(n, _)| *n == name);
            found.map(|(_, v)| v.to_vec())
        }
        fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
            let folded = crate::http::cgi_fold(name.as_bytes());
            let found = self
                .headers
                .iter()
                .filter(|(n, _)| crate::http::reads_as(n.as_bytes(), &folded));
            Some(found.map(|(_, v)| v.to_vec()).collect())
        }
    }

    #[test]
    fn credentials_are_read_in_canonical_form() {
        let key = IdentitySource::from_config(None, Some("Authorization"), "tenant").unwrap();
        assert_eq!(key, IdentitySource::credential("authorization"));
        for spelling in [&b"Bearer sk-1"[..], b"bearer sk-1", b"BEARER  sk-1 "] {
            let view = View {
                headers: vec![("authorization", spelling)],
                ..View::default()
            };
            assert_eq!(key.read(&view), Identity::Value(b"Bearer sk-1".to_vec()));
        }
        let api = IdentitySource::credential("x-api-key");
        let twice = View {
            headers: vec![("x-api-key", b"k1"), ("x_api_key", b"k2")],
            ..View::default()
        };
        assert_eq!(
            api.read(&twice),
            Identity::Invalid(CredentialError::Repeated)
        );
        let spaced = View {
            headers: vec![("x-api-key", b"k1 k2")],
            ..View::default()
        };
        assert_eq!(
            api.read(&spaced),
            Identity::Invalid(CredentialError::Syntax)
        );
        assert_eq!(api.read(&View::default()), Identity::Absent);
    }

    #[test]
    fn a_forged_claim_header_is_not_an_identity() {
        let sub = IdentitySource::from_config(Some("X-Jwt-Sub"), None, "tenant").unwrap();
        assert_eq!(sub.header(), "x-jwt-sub");
        let forged = View {
            headers: vec![("x-jwt-sub", b"victim")],
            ..View::default()
        };
        assert_eq!(sub.read(&forged), Identity::Unauthenticated);
        let refused = View {
            properties: vec![(signals::JWT_AUTH, b"outcome=bad_signature")],
            headers: vec![("x-jwt-sub", b"victim")],
        };
        assert_eq!(sub.read(&refused), Identity::Unauthenticated);
        let verified = View {
            properties: vec![
                (signals::JWT_AUTH, b"outcome=ok"),
                ("wasmx.tollgate.jwt_auth.header.x-jwt-sub", b"alice"),
            ],
            headers: vec![("x-jwt-sub", b"victim")],
        };
        assert_eq!(sub.read(&verified), Identity::Value(b"alice".to_vec()));
        let without_claim = View {
            properties: vec![(signals::JWT_AUTH, b"outcome=ok")],
            ..View::default()
        };
        assert_eq!(sub.read(&without_claim), Identity::Absent);
    }

    #[test]
    fn unverified_headers_are_taken_as_sent() {
        let key = IdentitySource::from_config(None, Some("x-api-key"), "key[0]").unwrap();
        let view = View {
            headers: vec![("x-api-key", b"k1")],
            ..View::default()
        };
        assert_eq!(key.read(&view), Identity::Value(b"k1".to_vec()));
        assert_eq!(key.read(&View::default()), Identity::Absent);
    }

    #[test]
    fn exactly_one_source() {
        for (h, u) in [(None, None), (Some("a"), Some("b"))] {
            assert_eq!(
                IdentitySource::from_config(h, u, "tenant")
                    .unwrap_err()
                    .field,
                "tenant"
            );
        }
        let e = IdentitySource::from_config(Some("bad header"), None, "tenant").unwrap_err();
        assert_eq!(e.field, "tenant.header");
    }
}
