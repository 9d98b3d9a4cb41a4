//! The client key of a request (who is limited) and the shared-data keys built from it.
//!
//! A rule's key is a list of parts, each read from the request:
//!
//! | part | value |
//! |---|---|
//! | `{"header": NAME}` | the value jwt-auth verified and wrote into claim header NAME on this request (`tollgate_common::identity`), optional whitespace trimmed; a verified token without the claim: missing; a request jwt-auth did not verify: the fixed part `~unauthenticated` (one bucket for all of them) |
//! | `{"unverified_header": NAME}` | the header's value as sent, optional whitespace trimmed; absent or empty: missing. The client chooses it: for headers a proxy in front sets. `authorization` and `proxy-authorization` are read as `api_key_header` |
//! | `{"api_key_header": NAME}` | the credential in header NAME in canonical form (`tollgate_common::credential`: `bearer K` and `Bearer  K` are one key); absent: missing; repeated or not one credential: the request is refused (401) |
//! | `{"client_address": {"trusted_hops": 0}}` | the peer address, the `source.address` property without its port |
//! | `{"client_address": {"trusted_hops": N}}` | the N-th address of X-Forwarded-For counted from the right (the one the outermost of N trusted proxies appended); fewer entries or not an IP address: missing |
//! | `{"client_address": {"ipv6_prefix": P}}` | an IPv6 address is keyed by its first P bits (default 64: one key per /64, the smallest allocation a client usually holds), written `prefix/P`; IPv4 addresses are kept whole |
//! | `"path"` | the path in normal form (`tollgate_common::path`), without its query |
//! | `"method"` | `:method` |
//! | `"host"` | the request's host in canonical form (`tollgate_common::authority`: lower case, no port, no trailing dot; a request whose authority has none is refused with 400 before any rule) |
//!
//! Addresses are canonical (`::ffff:192.0.2.1` is `192.0.2.1`, IPv6 in its shortest form), so
//! that one client has one spelling. Parts are joined as `<length>:<bytes>` each (a netstring
//! without the comma), so no choice of values can make two different lists collide
//! (`a:b` + `c` vs `a` + `b:c`); the unauthenticated part has no length, starts with `~` and so
//! collides with no value. A key with no parts is the empty string: one bucket for the rule.
//!
//! **Length bound**: a joined key longer than [`MAX_CLIENT_KEY_BYTES`] (128) bytes, or with a
//! byte outside printable ASCII, is replaced by `#` and the first 128 bits of its SHA-256 in hex
//! (33 bytes). Long keys are hashed, not refused, so that a client cannot escape its limit by
//! sending a long value. Plain keys start with a digit or are empty, hashed ones with `#`, the
//! special buckets with `~`: the three never collide.
//!
//! **Shared-data key**: `ratelimit/<zone>/<rule>/<limit index>/<client key>`, the `zone/key` form
//! by which ngx_wasm_module routes a key to a shared-memory zone (here the zone `ratelimit`). With
//! zone and rule names of at most 32 bytes and at most 16 limits per rule, a key is at most
//! 10 + 32 + 1 + 32 + 1 + 2 + 1 + 128 = 207 bytes ([`MAX_SHARED_KEY_BYTES`] = 256 is the
//! documented bound).

use std::fmt::Write as _;
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use tollgate_common::credential::CredentialError;
use tollgate_common::identity::{Identity, IdentitySource, IdentityView};

/// Default `ipv6_prefix` of a client address key part: one key per /64 (RFC 6177 section 3
/// recommends at least a /56 per site and a /64 is the smallest end-user allocation, so a client
/// can pick addresses freely inside its /64 but not beyond).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Longest client key kept as is (bytes); longer ones are hashed.
pub const MAX_CLIENT_KEY_BYTES: usize = 128;
/// Bound on a whole shared-data key (bytes).
pub const MAX_SHARED_KEY_BYTES: usize = 256;
/// The client key of the bucket shared by requests that lack the key (`missing_key: shared`).
pub const MISSING_BUCKET: &str = "~missing";
/// The client key of the bucket shared by new clients once the zone holds `max_keys` keys.
pub const OVERFLOW_BUCKET: &str = "~overflow";
/// The key part of a request that no verified source vouched for (see the module documentation).
pub const UNAUTHENTICATED_PART: &[u8] = b"~unauthenticated";

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// An identity header: verified by jwt-auth, or trusted as sent.
    Identity(IdentitySource),
    /// The client address: the peer (`trusted_hops` 0) or from X-Forwarded-For.
    ClientAddress {
        /// Trusted proxies in front of the gateway.
        trusted_hops: u8,
        /// IPv6 addresses are keyed by their first `ipv6_prefix` bits (1 to 128).
        ipv6_prefix: u8,
    },
    /// The normal path without its query.
    Path,
    /// The method.
    Method,
    /// The host in canonical form (lower case, no port, no trailing dot).
    Host,
}

/// What a key reads from a request (the glue reads the host; tests use plain values). Headers
/// and properties come from [`IdentityView`].
pub trait RequestView: IdentityView {
    /// Every X-Forwarded-For field value, in order (a header can be repeated).
    fn forwarded_for(&self) -> Vec<Vec<u8>>;
    /// The `source.address` property: `ip:port` or `[ipv6]:port`.
    fn source_address(&self) -> Option<Vec<u8>>;
    /// The path in normal form, without its query (`tollgate_common::path::normalize`).
    fn path(&self) -> Option<&[u8]>;
    /// `:method`.
    fn method(&self) -> Option<&[u8]>;
    /// The host in canonical form (`tollgate_common::authority::canonical_host`).
    fn host(&self) -> Option<&str>;
}

/// The client key of a request for `parts`, bounded (see the module documentation); `Ok(None)`
/// if a part is missing.
///
/// # Errors
/// A credential part (`api_key_header`) whose header does not hold exactly one credential: the
/// request is refused, never keyed on one of the spellings.
pub fn client_key(
    parts: &[KeyPart],
    req: &impl RequestView,
) -> Result<Option<String>, CredentialError> {
    let mut joined: Vec<u8> = Vec::with_capacity(64);
    for part in parts {
        let Some(value) = part_value(part, req)? else {
            return Ok(None);
        };
        match value {
            PartValue::Value(value) => {
                joined.extend_from_slice(itoa::Buffer::new().format(value.len()).as_bytes());
                joined.push(b':');
                joined.extend_from_slice(&value);
            }
            PartValue::Unauthenticated => joined.extend_from_slice(UNAUTHENTICATED_PART),
        }
    }
    Ok(Some(bound(joined)))
}

/// `prefix` (`ratelimit/<zone>/<rule>/<index>/`) followed by `client`.
pub fn shared_key(prefix: &str, client: &str) -> String {
    let mut key = String::with_capacity(prefix.len().saturating_add(client.len()));
    key.push_str(prefix);
    key.push_str(client);
    key
}

/// The prefix of a limit's shared-data keys.
pub fn key_prefix(namespace: &str, rule: &str, index: usize) -> String {
    format!("ratelimit/{namespace}/{rule}/{index}/")
}

/// The shared-data key of a rule's creation record (the count of its client keys and their
/// creation lock): `ratelimit/<namespace>/<rule>/~zone` (never a client key's: those continue
/// with a limit index; the suffix is the one of the stored layout, from before `zone` was
/// renamed `namespace`).
pub fn rule_record_key(namespace: &str, rule: &str) -> String {
    format!("ratelimit/{namespace}/{rule}/~zone")
}

/// A part's value: bytes, or the fixed unauthenticated part.
enum PartValue {
    Value(Vec<u8>),
    Unauthenticated,
}

fn part_value(
    part: &KeyPart,
    req: &impl RequestView,
) -> Result<Option<PartValue>, CredentialError> {
    let value = match part {
        KeyPart::Identity(source) => match source.read(req) {
            Identity::Value(v) => trim(v),
            Identity::Absent => return Ok(None),
            Identity::Unauthenticated => return Ok(Some(PartValue::Unauthenticated)),
            Identity::Invalid(e) => return Err(e),
        },
        _ => match request_part(part, req) {
            Some(v) => v,
            None => return Ok(None),
        },
    };
    Ok((!value.is_empty()).then_some(PartValue::Value(value)))
}

/// The value of a part read from the request itself (not an identity).
fn request_part(part: &KeyPart, req: &impl RequestView) -> Option<Vec<u8>> {
    Some(match part {
        KeyPart::Identity(_) => return None,
        KeyPart::ClientAddress {
            trusted_hops: 0,
            ipv6_prefix,
        } => {
            let raw = req.source_address()?;
            client_ip(tollgate_common::bytes::utf8(&raw).ok()?, *ipv6_prefix)?
        }
        KeyPart::ClientAddress {
            trusted_hops,
            ipv6_prefix,
        } => {
            let values = req.forwarded_for();
            let entry = values
                .iter()
                .rev()
                .flat_map(|v| v.rsplit(|b| *b == b','))
                .nth(usize::from(*trusted_hops).saturating_sub(1))?;
            client_ip(tollgate_common::bytes::utf8(entry).ok()?, *ipv6_prefix)?
        }
        KeyPart::Path => req.path()?.to_vec(),
        KeyPart::Method => req.method()?.to_vec(),
        KeyPart::Host => req.host()?.as_bytes().to_vec(),
    })
}

/// The key of a client address: [`canonical_ip`], with an IPv6 address cut to its first
/// `ipv6_prefix` bits and written `network/prefix` when the prefix is shorter than 128.
pub fn client_ip(text: &str, ipv6_prefix: u8) -> Option<Vec<u8>> {
    let ip = parse_ip(text)?.to_canonical();
    match ip {
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            let bits = u128::from(v6);
            let mask = u128::MAX
                .checked_shl(128u32.saturating_sub(u32::from(ipv6_prefix)))
                .unwrap_or(0);
            let net = std::net::Ipv6Addr::from(bits & mask);
            Some(format!("{net}/{ipv6_prefix}").into_bytes())
        }
        _ => Some(ip.to_string().into_bytes()),
    }
}

/// An address as written in `source.address` or X-Forwarded-For (`ip`, `ip:port`, `[ip6]`,
/// `[ip6]:port`), canonical; `None` if it is not one.
pub fn canonical_ip(text: &str) -> Option<Vec<u8>> {
    Some(parse_ip(text)?.to_canonical().to_string().into_bytes())
}

fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    let ip: IpAddr = if let Ok(ip) = text.parse() {
        ip
    } else if let Ok(sa) = text.parse::<std::net::SocketAddr>() {
        sa.ip()
    } else {
        text.strip_prefix('[')?.strip_suffix(']')?.parse().ok()?
    };
    Some(ip)
}

fn trim(mut v: Vec<u8>) -> Vec<u8> {
    let start = v
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(start, |i| i.saturating_add(1));
    v.truncate(end);
    v.drain(..start.min(end));
    v
}

fn bound(joined: Vec<u8>) -> String {
    let joined = if joined.len() <= MAX_CLIENT_KEY_BYTES
        && joined.iter().all(|b| (0x20..0x7f).contains(b))
    {
        match tollgate_common::bytes::utf8_owned(joined) {
            Ok(s) => return s,
            Err(e) => e.into_bytes(),
        }
    } else {
        joined
    };
    let digest = Sha256::digest(&joined);
    let mut out = String::with_capacity(33);
    out.push('#');
    for b in digest.iter().take(16) {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_common::authority::canonical_host;

    #[derive(Default)]
    struct Req {
        headers: Vec<(&'static str, &'static [u8])>,
        properties: Vec<(&'static str, &'static [u8])>,
        source: Option<&'static str>,
        path: Option<&'static str>,
        method: Option<&'static str>,
        authority: Option<&'static str>,
        host: std::cell::OnceCell<Option<String>>,
    }

    impl IdentityView for Req {
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_vec())
        }
        fn property(&self, name: &str) -> Option<Vec<u8>> {
            self.properties
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_vec())
        }
        fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
            let folded = tollgate_common::http::cgi_fold(name.as_bytes());
            let found = self
                .headers
                .iter()
                .filter(|(n, _)| tollgate_common::http::reads_as(n.as_bytes(), &folded));
            Some(found.map(|(_, v)| v.to_vec()).collect())
        }
    }

    impl RequestView for Req {
        fn forwarded_for(&self) -> Vec<Vec<u8>> {
            self.headers
                .iter()
                .filter(|(n, _)| *n == "x-forwarded-for")
                .map(|(_, v)| v.to_vec())
                .collect()
        }
        fn source_address(&self) -> Option<Vec<u8>> {
            self.source.map(|s| s.as_bytes().to_vec())
        }
        fn path(&self) -> Option<&[u8]> {
            self.path.map(str::as_bytes)
        }
        fn method(&self) -> Option<&[u8]> {
            self.method.map(str::as_bytes)
        }
        fn host(&self) -> Option<&str> {
            self.host
                .get_or_init(|| {
                    let a = self.authority?;
                    Some(canonical_host(a.as_bytes()).ok()?.into_owned())
                })
                .as_deref()
        }
    }

    /// The key of a request with no credential part in error.
    fn client_key(parts: &[KeyPart], req: &Req) -> Option<String> {
        super::client_key(parts, req).expect("no credential part in error")
    }

    #[test]
    fn credentials_key_as_the_upstream_reads_them() {
        let parts = vec![KeyPart::Identity(IdentitySource::credential(
            "authorization",
        ))];
        let key = |value: &'static [u8]| {
            let req = Req {
                headers: vec![("authorization", value)],
                ..Default::default()
            };
            super::client_key(&parts, &req)
        };
        let one = key(b"Bearer sk-1").unwrap();
        assert_eq!(one.as_deref(), Some("11:Bearer sk-1"));
        assert_eq!(key(b"bearer sk-1").unwrap(), one);
        assert_eq!(key(b"BEARER   sk-1 ").unwrap(), one);
        assert_eq!(
            key(b"Bearer sk-2").unwrap().as_deref(),
            Some("11:Bearer sk-2")
        );
        assert_eq!(key(b"Bearer a b"), Err(CredentialError::Syntax));
        let api = vec![KeyPart::Identity(IdentitySource::credential("x-api-key"))];
        let repeated = Req {
            headers: vec![("x-api-key", b"k1"), ("X_Api_Key", b"k2")],
            ..Default::default()
        };
        assert_eq!(
            super::client_key(&api, &repeated),
            Err(CredentialError::Repeated)
        );
        assert_eq!(super::client_key(&api, &Req::default()), Ok(None));
    }

    fn unverified(name: &str) -> KeyPart {
        KeyPart::Identity(IdentitySource::Unverified {
            header: name.to_string(),
        })
    }

    fn xff(hops: u8) -> Vec<KeyPart> {
        vec![KeyPart::ClientAddress {
            trusted_hops: hops,
            ipv6_prefix: 128,
        }]
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix() {
        let key = |source: &'static str, prefix: u8| {
            let req = Req {
                source: Some(source),
                ..Default::default()
            };
            let parts = [KeyPart::ClientAddress {
                trusted_hops: 0,
                ipv6_prefix: prefix,
            }];
            client_key(&parts, &req).unwrap()
        };
        // Any address of one /64: one key.
        assert_eq!(key("[2001:db8:1:2:aaaa::1]:5", 64), "17:2001:db8:1:2::/64");
        assert_eq!(
            key("[2001:db8:1:2:ffff:1:2:3]:5", 64),
            "17:2001:db8:1:2::/64"
        );
        assert_ne!(
            key("[2001:db8:1:3::1]:5", 64),
            key("[2001:db8:1:2::1]:5", 64)
        );
        assert_eq!(key("[2001:db8:1:2:3:4:5:6]:1", 48), "15:2001:db8:1::/48");
        assert_eq!(key("[2001:db8::1]:1", 128), "11:2001:db8::1");
        assert_eq!(key("[::ffff:192.0.2.9]:1", 64), "9:192.0.2.9", "IPv4 whole");
        assert_eq!(key("198.51.100.7:1", 1), "12:198.51.100.7");
        assert_eq!(key("[2001:db8::1]:1", 1), "4:::/1");
    }

    #[test]
    fn header_path_method_host_and_composite() {
        let req = Req {
            headers: vec![("x-api-key", b"  k1\t")],
            path: Some("/api/items"),
            method: Some("GET"),
            authority: Some("API.Example.com.:8443"),
            ..Default::default()
        };
        let parts = vec![
            unverified("x-api-key"),
            KeyPart::Path,
            KeyPart::Method,
            KeyPart::Host,
        ];
        assert_eq!(
            client_key(&parts, &req).unwrap(),
            "2:k110:/api/items3:GET15:api.example.com"
        );
        assert_eq!(client_key(&[], &req).unwrap(), "", "no parts: one bucket");
        let missing = vec![unverified("x-user")];
        assert_eq!(client_key(&missing, &req), None);
        let empty = Req {
            headers: vec![("x-user", b"  ")],
            ..Default::default()
        };
        assert_eq!(
            client_key(&missing, &empty),
            None,
            "blank counts as missing"
        );
    }

    #[test]
    fn verified_headers_and_the_unauthenticated_bucket() {
        let parts = vec![KeyPart::Identity(IdentitySource::verified("x-jwt-sub"))];
        let forged = Req {
            headers: vec![("x-jwt-sub", b"victim")],
            ..Default::default()
        };
        assert_eq!(
            client_key(&parts, &forged).as_deref(),
            Some("~unauthenticated"),
            "a client's own x-jwt-sub is not a key"
        );
        let verified = Req {
            headers: vec![("x-jwt-sub", b"victim")],
            properties: vec![
                ("wasmx.tollgate.jwt_auth", b"outcome=ok"),
                ("wasmx.tollgate.jwt_auth.header.x-jwt-sub", b"alice"),
            ],
            ..Default::default()
        };
        assert_eq!(client_key(&parts, &verified).as_deref(), Some("5:alice"));
        let no_claim = Req {
            properties: vec![("wasmx.tollgate.jwt_auth", b"outcome=ok")],
            ..Default::default()
        };
        assert_eq!(
            client_key(&parts, &no_claim),
            None,
            "verified, no claim: missing"
        );
        let with_method = vec![parts[0].clone(), KeyPart::Method];
        let forged_get = Req {
            method: Some("GET"),
            ..Default::default()
        };
        assert_eq!(
            client_key(&with_method, &forged_get).as_deref(),
            Some("~unauthenticated3:GET")
        );
    }

    #[test]
    fn composite_parts_cannot_collide() {
        let parts = vec![unverified("a"), unverified("b")];
        let one = Req {
            headers: vec![("a", b"x:1"), ("b", b"y")],
            ..Default::default()
        };
        let two = Req {
            headers: vec![("a", b"x"), ("b", b"1:y")],
            ..Default::default()
        };
        let (k1, k2) = (
            client_key(&parts, &one).unwrap(),
            client_key(&parts, &two).unwrap(),
        );
        assert_ne!(k1, k2);
        assert_eq!((k1.as_str(), k2.as_str()), ("3:x:11:y", "1:x3:1:y"));
    }

    #[test]
    fn client_address_from_the_peer_without_port() {
        for (source, want) in [
            ("192.0.2.7:54321", "192.0.2.7"),
            ("[2001:db8:0:0::1]:443", "2001:db8::1"),
            ("[::ffff:192.0.2.9]:1", "192.0.2.9"),
            ("2001:db8::2", "2001:db8::2"),
        ] {
            let req = Req {
                source: Some(source),
                headers: vec![("x-forwarded-for", b"203.0.113.1")],
                ..Default::default()
            };
            assert_eq!(
                client_key(&xff(0), &req).unwrap(),
                format!("{}:{want}", want.len())
            );
        }
        let req = Req {
            source: Some("not-an-address"),
            ..Default::default()
        };
        assert_eq!(client_key(&xff(0), &req), None);
    }

    #[test]
    fn client_address_from_x_forwarded_for_with_trusted_hops() {
        // client -> proxy A (appends client) -> proxy B (appends A) -> gateway
        let req = Req {
            source: Some("10.0.0.2:1000"),
            headers: vec![
                ("x-forwarded-for", b"6.6.6.6, 198.51.100.4"),
                ("x-forwarded-for", b" 10.0.0.1 "),
            ],
            ..Default::default()
        };
        let key = |hops| client_key(&xff(hops), &req);
        assert_eq!(key(1).as_deref(), Some("8:10.0.0.1"));
        assert_eq!(key(2).as_deref(), Some("12:198.51.100.4"));
        assert_eq!(
            key(3).as_deref(),
            Some("7:6.6.6.6"),
            "spoofable: trust fewer hops"
        );
        assert_eq!(key(4), None, "fewer entries than trusted hops");
        let odd = Req {
            headers: vec![("x-forwarded-for", b"unknown, [2001:db8::5]:80")],
            ..Default::default()
        };
        assert_eq!(client_key(&xff(1), &odd).as_deref(), Some("11:2001:db8::5"));
        assert_eq!(client_key(&xff(2), &odd), None, "not an address");
        assert_eq!(client_key(&xff(1), &Req::default()), None, "no header");
    }

    #[test]
    fn long_or_binary_keys_are_hashed() {
        let long: &'static [u8] = Box::leak(vec![b'a'; 200].into_boxed_slice());
        let req = Req {
            headers: vec![("k", long), ("bin", b"\xff\x00x"), ("short", b"abc")],
            ..Default::default()
        };
        let h = |name: &str| client_key(&[unverified(name)], &req).unwrap();
        let hashed = h("k");
        // SHA-256 of "200:" + "a" x 200, first 16 bytes (Python hashlib).
        assert_eq!(hashed, "#8edec72f4bf3a184120df4a780d597c7");
        assert_eq!(hashed.len(), 33);
        assert!(h("bin").starts_with('#'));
        assert_eq!(h("short"), "3:abc");
        let longest = shared_key(
            &key_prefix(&"z".repeat(32), &"r".repeat(32), 15),
            &"x".repeat(MAX_CLIENT_KEY_BYTES),
        );
        assert!(longest.len() <= MAX_SHARED_KEY_BYTES, "{}", longest.len());
        assert_eq!(
            shared_key(&key_prefix("default", "per-user", 0), "3:abc"),
            "ratelimit/default/per-user/0/3:abc"
        );
        assert_eq!(
            rule_record_key("default", "per-user"),
            "ratelimit/default/per-user/~zone"
        );
    }
}
