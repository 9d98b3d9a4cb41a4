//! The sticky cookie (`tollgate_sticky_upstream::cookie_value` and `sticky::read_cookie`).
//!
//! The first input byte picks the mode:
//! - raw: the rest is a `Cookie` header. No panic; a value that verifies is exactly what the
//!   signer would mint for its upstream and expiry (no second spelling); a cookie the filter
//!   honours names a configured upstream, through a value that verifies.
//! - signed: a value is minted for a configured upstream and an expiry from the input, then one
//!   byte is changed: it must not verify (the tag covers the upstream and the expiry), and
//!   reading it never honours it.
//!
//! Every read is made twice: without a cache, and with the verified-value cache the filter keeps
//! (`cookie_cache`), one for the whole run in a small size, so that it holds genuine values that
//! later inputs collide with: both reads must give the same answer.
#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use tollgate_sticky_upstream::config::Config;
use tollgate_sticky_upstream::cookie_cache::VerifiedCookies;
use tollgate_sticky_upstream::sticky::{self, CookieState};

const NOW: u64 = 1_800_000_000;

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        Config::parse(
            br#"{"upstreams": [{"name": "blue", "weight": 2}, {"name": "green.v2"}, {"name": "red"}],
                 "cookie": {"name": "tollgate_sticky", "max_age_seconds": 3600},
                 "secret": "fuzz-sticky-secret-0123456789abcdef0123456789"}"#,
        )
        .unwrap()
    })
}

/// `sticky::read_cookie` without a cache and with the run's cache, which must agree.
fn read_cookie(c: &Config, header: Option<&str>, now: u64) -> CookieState {
    static CACHE: OnceLock<Mutex<VerifiedCookies>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(VerifiedCookies::new(8)));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    let uncached = sticky::read_cookie(c, &mut VerifiedCookies::new(0), header, now);
    let cached = sticky::read_cookie(c, &mut cache, header, now);
    assert_eq!(cached, uncached, "the cache changed the answer: {header:?}");
    uncached
}

fn honoured(state: CookieState) -> Option<usize> {
    match state {
        CookieState::Valid { upstream, .. } => Some(upstream),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let c = config();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let header = String::from_utf8_lossy(rest);
        if let Some(value) = header
            .split(['=', ';', ' '])
            .find(|v| c.signer.verify(v).is_ok())
        {
            let signed = c.signer.verify(value).unwrap();
            assert_eq!(c.signer.sign(signed.upstream, signed.expiry), value);
        }
        if let Some(i) = honoured(read_cookie(c, Some(&header), NOW)) {
            let name = &c.upstreams[i].name;
            let minted_for_it = cookie::Cookie::split_parse(header.as_ref())
                .filter_map(Result::ok)
                .filter(|k| k.name() == c.cookie.name)
                .any(|k| {
                    c.signer
                        .verify(k.value_trimmed())
                        .is_ok_and(|s| s.upstream == name)
                });
            assert!(
                minted_for_it,
                "honoured a cookie that does not verify: {header:?}"
            );
        }
        return;
    }
    // Signed: `<upstream index> <8 bytes expiry offset> <position> <xor>`.
    let [u, e0, e1, e2, e3, pos, xor, ..] = rest else {
        return;
    };
    let upstream = &c.upstreams[usize::from(*u) % c.upstreams.len()].name;
    let expiry = NOW + u64::from(u32::from_le_bytes([*e0, *e1, *e2, *e3]) % 7200);
    let value = c.signer.sign(upstream, expiry);
    assert!(c.signer.verify(&value).is_ok());
    // The genuine value is read first, so that the cache holds it (when it is honoured: its
    // expiry may be too far ahead) when its change is read.
    let genuine = format!("{}={value}", c.cookie.name);
    let _ = read_cookie(c, Some(&genuine), NOW);
    let mut changed = value.clone().into_bytes();
    let at = usize::from(*pos) % changed.len();
    changed[at] ^= xor | 1;
    let Ok(changed) = String::from_utf8(changed) else {
        return;
    };
    assert!(
        c.signer.verify(&changed).is_err(),
        "a changed cookie verified: {changed:?}"
    );
    let header = format!("{}={changed}", c.cookie.name);
    assert_eq!(
        honoured(read_cookie(c, Some(&header), NOW)),
        None,
        "{header:?}"
    );
});
