//! The signed cookie value: known answer, round trip, every single-byte change rejected.

// A test crate: its helpers (outside #[test] functions, which clippy.toml already covers) may
// unwrap, index, slice strings and panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)]

use tollgate_sticky_upstream::cookie_value::{is_cookie_octet, Malformed, Signed, Signer};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn signer() -> Signer {
    Signer::new(SECRET, "tollgate_sticky").unwrap()
}

/// Computed independently with Python's `hmac` module (the end-to-end tests mint cookies the
/// same way):
/// `base64url(HMAC-SHA256(SECRET, b"tollgate-sticky-upstream/v1\0tollgate_sticky\0blue\01767225600"))`.
#[test]
fn known_answer() {
    assert_eq!(
        signer().sign("blue", 1_767_225_600),
        "blue.1767225600.T85Km79JjjTWwjXEKPymueVU2EPgACoJUZzl_D9ALfw"
    );
}

#[test]
fn round_trip() {
    let s = signer();
    for (name, expiry) in [("blue", 1u64), ("a.b.c", u64::MAX), ("x|y:z=1", 0)] {
        let v = s.sign(name, expiry);
        assert_eq!(
            s.verify(&v),
            Ok(Signed {
                upstream: name,
                expiry
            }),
            "{v}"
        );
    }
}

/// Every value obtained by changing one byte of a valid value into any other cookie-octet is
/// rejected: the name, the expiry, the separators and the tag are all covered.
#[test]
fn every_single_byte_change_is_rejected() {
    let s = signer();
    let valid = s.sign("green", 1_767_225_600);
    let candidates: Vec<u8> = (0u8..=0x7f).filter(|&b| is_cookie_octet(b)).collect();
    let mut tried = 0;
    for i in 0..valid.len() {
        for &b in &candidates {
            let mut bytes = valid.clone().into_bytes();
            if bytes[i] == b {
                continue;
            }
            bytes[i] = b;
            let changed = String::from_utf8(bytes).unwrap();
            tried += 1;
            assert!(
                s.verify(&changed).is_err(),
                "accepted a changed value: {changed} (from {valid})"
            );
        }
    }
    assert!(tried > 5000, "{tried}");
}

#[test]
fn forging_another_upstream_fails() {
    let s = signer();
    let valid = s.sign("blue", 1_767_225_600);
    let tag = valid.rsplit_once('.').unwrap().1;
    for target in ["red", "Blue", "blu", "blue.x", "blue~"] {
        let forged = format!("{target}.1767225600.{tag}");
        assert_eq!(s.verify(&forged), Err(Malformed::BadTag), "{forged}");
    }
    // Extending the lifetime with the same tag fails too.
    assert_eq!(
        s.verify(&format!("blue.1767225601.{tag}")),
        Err(Malformed::BadTag)
    );
}

#[test]
fn malformed_values_never_panic_and_are_rejected() {
    let s = signer();
    let valid = s.sign("blue", 100);
    let tag = valid.rsplit_once('.').unwrap().1;
    let long = "a".repeat(100_000);
    let cases = [
        String::new(),
        ".".into(),
        "..".into(),
        "blue".into(),
        "blue.100".into(),
        format!(".100.{tag}"),
        format!("blue..{tag}"),
        format!("blue.0100.{tag}"),
        format!("blue.+100.{tag}"),
        format!("blue.100.{tag}="),
        format!("blue.100.{tag}A"),
        format!("blue.100.{}", &tag[..42]),
        format!("blue.100.+{}", &tag[1..]),
        format!("blue.100./{}", &tag[1..]),
        format!("blue .100.{tag}"),
        format!("bl\"ue.100.{tag}"),
        format!("bl;ue.100.{tag}"),
        format!("blüe.100.{tag}"),
        format!("{long}.100.{tag}"),
        long.clone(),
        "é.é.é".into(),
        "\u{0}.\u{0}.\u{0}".into(),
    ];
    for c in &cases {
        assert!(s.verify(c).is_err(), "{c:?}");
    }
    assert_eq!(s.verify(&valid).unwrap().upstream, "blue");
}

#[test]
fn values_are_cookie_octets() {
    let v = signer().sign("x~y!z", 42);
    assert!(v.bytes().all(is_cookie_octet), "{v}");
    for b in [b' ', b'"', b',', b';', b'\\', 0x7f, 0x1f] {
        assert!(!is_cookie_octet(b), "{b:#x}");
    }
}
