//! The rate-limit client key (`tollgate_rate_limit::key`) from arbitrary request values.
//! Input: a byte choosing the key parts and the IPv6 prefix, then `0xff`-separated fields: a
//! header value, X-Forwarded-For values (`0xfe`-separated), the peer address, `:path`,
//! `:method`, `:authority` (the header is also read as a credential, `api_key_header`, whose
//! refusals are the only ones). Properties: no panic; the authority's canonical host
//! (`tollgate_common::authority`), when it has one, is lower-case ASCII without a port and its
//! own canonical form; a key is either at most 128 printable ASCII
//! bytes or `#` and 32 hex digits, and with the longest zone and rule names the shared-data key
//! stays within `MAX_SHARED_KEY_BYTES`; the key is a function of the parts (the same request, the
//! same key) and separates different values (a header value one byte longer never shares its
//! key); every address of one IPv6 /P shares one key, and an address key with `/128` is the
//! canonical address.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate_common::authority::canonical_host;
use tollgate_common::identity::{IdentitySource, IdentityView};
use tollgate_rate_limit::key::{
    canonical_ip, client_ip, client_key, key_prefix, shared_key, KeyPart, RequestView,
    MAX_CLIENT_KEY_BYTES, MAX_SHARED_KEY_BYTES,
};

struct Req<'a> {
    header: &'a [u8],
    xff: Vec<&'a [u8]>,
    source: &'a [u8],
    path: &'a [u8],
    method: &'a [u8],
    host: Option<String>,
}

impl IdentityView for Req<'_> {
    fn property(&self, _name: &str) -> Option<Vec<u8>> {
        None
    }
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        (name == "x-key").then(|| self.header.to_vec())
    }
    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        Some(self.header(name).into_iter().collect())
    }
}

impl RequestView for Req<'_> {
    fn forwarded_for(&self) -> Vec<Vec<u8>> {
        self.xff.iter().map(|v| v.to_vec()).collect()
    }
    fn source_address(&self) -> Option<Vec<u8>> {
        Some(self.source.to_vec())
    }
    fn path(&self) -> Option<&[u8]> {
        Some(self.path)
    }
    fn method(&self) -> Option<&[u8]> {
        Some(self.method)
    }
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
}

fn valid(key: &str) -> bool {
    (key.len() <= MAX_CLIENT_KEY_BYTES
        && key.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !key.starts_with('#'))
        || (key.len() == 33
            && key.starts_with('#')
            && key[1..].bytes().all(|b| b.is_ascii_hexdigit()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let mut fields = rest.split(|&b| b == 0xff);
    let mut next = || fields.next().unwrap_or_default();
    let req = Req {
        header: next(),
        xff: next().split(|&b| b == 0xfe).collect(),
        source: next(),
        path: next(),
        method: next(),
        host: canonical_host(next()).ok().map(Cow::into_owned),
    };
    if let Some(host) = &req.host {
        assert!(!host
            .bytes()
            .any(|b| b.is_ascii_uppercase() || !b.is_ascii()));
        assert!(!host.ends_with('.'));
        assert!(host.starts_with('[') || !host.contains(':'));
        assert_eq!(
            canonical_host(host.as_bytes()).as_deref(),
            Ok(host.as_str())
        );
    }
    let prefix = 1 + (choice >> 1) % 128;
    let header = KeyPart::Identity(IdentitySource::Unverified {
        header: "x-key".into(),
    });
    let credential = KeyPart::Identity(IdentitySource::credential("x-key"));
    let all = [
        header.clone(),
        KeyPart::ClientAddress {
            trusted_hops: choice % 3,
            ipv6_prefix: prefix,
        },
        KeyPart::Path,
        KeyPart::Method,
        KeyPart::Host,
        credential.clone(),
    ];
    let parts: Vec<KeyPart> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| choice.rotate_left(*i as u32) & 1 == 1)
        .map(|(_, p)| p.clone())
        .collect();
    let key = client_key(&parts, &req);
    assert_eq!(key, client_key(&parts, &req), "deterministic");
    // Only a credential part refuses a request.
    let Ok(key) = key else {
        assert!(parts.contains(&credential));
        return;
    };
    if let Some(k) = &key {
        assert!(valid(k), "{k:?}");
        let longest = shared_key(&key_prefix(&"z".repeat(32), &"r".repeat(32), 15), k);
        assert!(longest.len() <= MAX_SHARED_KEY_BYTES, "{}", longest.len());
    }
    // A header value one byte longer (not whitespace, which is trimmed): another key.
    if parts.contains(&header) {
        let longer = [req.header, b"x"].concat();
        let other = Req {
            header: &longer,
            xff: req.xff.clone(),
            ..req
        };
        if let (Some(a), Ok(Some(b))) = (&key, client_key(&parts, &other)) {
            assert_ne!(a, &b, "{:?}", String::from_utf8_lossy(&longer));
        }
    }
    // Addresses: one key per IPv6 /prefix; /128 is the canonical address.
    if let Ok(text) = std::str::from_utf8(req.source) {
        if let Some(k) = client_ip(text, prefix) {
            assert!(k.len() <= 43 && k.is_ascii(), "{k:?}");
            assert_eq!(client_ip(text, 128), canonical_ip(text));
            if let Ok(std::net::IpAddr::V6(v6)) = std::str::from_utf8(&canonical_ip(text).unwrap())
                .unwrap()
                .parse::<std::net::IpAddr>()
            {
                // The last address of the same /prefix.
                let host_bits = 128 - u32::from(prefix);
                let mask = if host_bits == 128 {
                    u128::MAX
                } else {
                    (1u128 << host_bits) - 1
                };
                let sibling = std::net::Ipv6Addr::from(u128::from(v6) | mask);
                if sibling.to_ipv4_mapped().is_none() && v6.to_ipv4_mapped().is_none() {
                    assert_eq!(
                        client_ip(&sibling.to_string(), prefix),
                        Some(k),
                        "{v6} {sibling} /{prefix}"
                    );
                }
            }
        }
    }
});
