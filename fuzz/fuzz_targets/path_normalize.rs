//! Path normalisation (`tollgate_common::path::normalize`) on any request target, under every
//! policy. Properties: no panic; an accepted target's path is in normal form (starts with `/`,
//! printable ASCII, no empty, `.` or `..` segment, nothing its policy refuses, escapes upper-case
//! and never of unreserved characters); normalisation is idempotent and `changed` is exact; the
//! query is carried unchanged; and, under the default policy, the result agrees with a naive
//! reference (decode every escape, then merge slashes and remove dot segments).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::path::{normalize, EscapedSlashes, PathParameters, PathPolicy};

fn policy(flags: u8) -> PathPolicy {
    PathPolicy {
        escaped_slashes: match flags % 3 {
            0 => EscapedSlashes::Reject,
            1 => EscapedSlashes::Keep,
            _ => EscapedSlashes::Unescape,
        },
        path_parameters: if flags & 4 == 0 {
            PathParameters::Reject
        } else {
            PathParameters::Keep
        },
    }
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// Every escape decoded (the default policy refuses %2F, %5C and %3B, so decoding cannot create
/// separators): the bytes an upstream that decodes its path routes on.
fn decode_all(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            out.push(hex(s[i + 1]).unwrap() << 4 | hex(s[i + 2]).unwrap());
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Slashes merged, then RFC 3986 section 5.2.4 dot segments removed (`None` above the root).
fn reference(path: &[u8]) -> Option<Vec<u8>> {
    let segments: Vec<&[u8]> = path[1..].split(|&b| b == b'/').collect();
    let mut stack: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            b"" | b"." => trailing = last,
            b".." => {
                stack.pop()?;
                trailing = last;
            }
            s => {
                stack.push(s);
                trailing = false;
            }
        }
    }
    let mut out = Vec::new();
    for s in &stack {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if out.is_empty() || trailing {
        out.push(b'/');
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, target)) = data.split_first() else {
        return;
    };
    let policy = policy(flags);
    let result = normalize(target, &policy);
    let Ok(p) = result else {
        return;
    };
    let path: &str = &p.path;
    let bytes = path.as_bytes();
    assert!(path.starts_with('/'), "{path:?}");
    assert!(
        bytes
            .iter()
            .all(|&b| b > 0x20 && b < 0x7f && b != b'#' && b != b'\\'),
        "{path:?}"
    );
    assert!(!path.contains("//"), "{path:?}");
    assert!(path.split('/').all(|s| s != "." && s != ".."), "{path:?}");
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let (hi, lo) = (bytes[i + 1], bytes[i + 2]);
            assert!(hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit(), "{path:?}");
            assert!(
                !hi.is_ascii_lowercase() && !lo.is_ascii_lowercase(),
                "{path:?}"
            );
            let v = hex(hi).unwrap() << 4 | hex(lo).unwrap();
            assert!(
                !(v.is_ascii_alphanumeric() || b"-._~".contains(&v)),
                "{path:?}"
            );
            assert!(v != 0, "{path:?}");
            if policy.escaped_slashes != EscapedSlashes::Keep {
                assert!(v != b'/' && v != b'\\', "{path:?}");
            }
            if policy.path_parameters == PathParameters::Reject {
                assert!(v != b';', "{path:?}");
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    if policy.path_parameters == PathParameters::Reject {
        assert!(!path.contains(';'), "{path:?}");
    }
    // Idempotent, and `changed` says whether the path differs.
    let again = normalize(bytes, &policy).expect("a normal path is accepted");
    assert_eq!(again.path, path);
    assert!(!again.changed);
    let raw_path = target.split(|&b| b == b'?').next().unwrap_or_default();
    if !p.changed {
        assert_eq!(raw_path, bytes);
    } else {
        assert_ne!(raw_path, bytes);
    }
    // The query is carried as received.
    match p.query {
        Some(q) => assert!(target.ends_with(q.as_bytes()) && target.len() > q.len()),
        None => assert!(!target.contains(&b'?')),
    }
    let forwarded = p.target();
    let back = normalize(forwarded.as_bytes(), &policy).expect("the forwarded target is accepted");
    assert_eq!((back.path.as_ref(), back.query), (path, p.query));
    // Against the reference, for origin-form targets under the default policy.
    if policy == PathPolicy::default() && raw_path.first() == Some(&b'/') {
        let want = reference(&decode_all(raw_path)).expect("accepted, so not above the root");
        assert_eq!(decode_all(bytes), want, "{target:?}");
    }
});
