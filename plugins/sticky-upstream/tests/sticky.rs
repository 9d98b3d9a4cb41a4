//! Request and response decisions: Cookie header parsing (RFC 6265 section 4.2.1 / 5.4),
//! expiry, unknown upstreams, renewal, re-pinning.

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

mod support;

use serde_json::json;
use support::SplitMix64;
use tollgate_sticky_upstream::config::Config;
use tollgate_sticky_upstream::cookie_cache::{VerifiedCookies, SLOTS};
use tollgate_sticky_upstream::sticky::{
    self, after_response, CookieState, Decision, Outcome, ResponseAction, CLOCK_SKEW_SECONDS,
};

const NOW: u64 = 1_767_225_600;
const MAX_AGE: u64 = 3600;

fn config_with(extra: serde_json::Value) -> Config {
    let mut doc = json!({
        "upstreams": [
            {"name": "blue", "weight": 1},
            {"name": "green", "weight": 1},
            {"name": "red", "weight": 0}
        ],
        "secret": "0123456789abcdef0123456789abcdef",
        "cookie": {"name": "sticky", "max_age_seconds": MAX_AGE},
    });
    for (k, v) in extra.as_object().unwrap() {
        doc[k] = v.clone();
    }
    Config::parse(doc.to_string().as_bytes()).unwrap()
}

fn config() -> Config {
    config_with(json!({}))
}

/// `sticky::read_cookie` three ways, which must agree: without a cache, with a cold one, and
/// again with the same one (now warm: a value honoured the first time comes from it).
fn read_cookie(c: &Config, header: Option<&str>, now: u64) -> CookieState {
    let uncached = sticky::read_cookie(c, &mut VerifiedCookies::new(0), header, now);
    let mut cache = VerifiedCookies::new(SLOTS);
    assert_eq!(sticky::read_cookie(c, &mut cache, header, now), uncached);
    let again = sticky::read_cookie(c, &mut cache, header, now);
    assert_eq!(again, uncached, "from the cache");
    uncached
}

/// `sticky::decide` with a cache of its own.
fn decide(
    c: &Config,
    header: Option<&str>,
    now: u64,
    key: impl FnOnce() -> Option<Vec<u8>>,
    draw: impl FnOnce() -> u64,
) -> Option<Decision> {
    sticky::decide(c, &mut VerifiedCookies::new(SLOTS), header, now, key, draw)
}

fn cookie(c: &Config, upstream: &str, expiry: u64) -> String {
    c.signer.sign(upstream, expiry)
}

fn valid(upstream: usize, renew: bool) -> CookieState {
    CookieState::Valid { upstream, renew }
}

/// Panics if asked: for paths that must not consult the key or the random source.
fn no_key() -> Option<Vec<u8>> {
    panic!("the key was read")
}
fn no_draw() -> u64 {
    panic!("a random draw was taken")
}

#[test]
fn cookie_header_parsing() {
    let c = config();
    let v = cookie(&c, "green", NOW + MAX_AGE);
    let cases = [
        format!("sticky={v}"),
        format!("a=1; sticky={v}; b=2"),
        format!("a=1;sticky={v};b=2"),
        format!("  a=1 ;   sticky={v}   ; b=2  "),
        format!("sticky=\"{v}\""),
        format!("a=\"x;y\"; sticky={v}"), // a quoted value with `;` breaks only its own pair
        format!(";;=;a; sticky={v};;"),
        format!("sticky=garbage; sticky={v}"), // the first honoured cookie wins
        format!("STICKY=x; sticky={v}"),       // names are case-sensitive
        format!("{}; sticky={v}", "x=y; ".repeat(10_000)),
    ];
    for h in &cases {
        assert_eq!(read_cookie(&c, Some(h), NOW), valid(1, false), "{h:.120}");
    }
}

#[test]
fn absent_and_rejected_cookies() {
    let c = config();
    let v = cookie(&c, "green", NOW + MAX_AGE);
    let absent = [
        String::new(),
        "a=1; b=2".into(),
        "Sticky=abc".into(),
        "sticky".into(),
        format!("xsticky={v}"),
        ";;;;".into(),
        "=".into(),
        "\u{0}\u{7f}é;;=".into(),
        "a".repeat(200_000),
    ];
    for h in &absent {
        assert_eq!(
            read_cookie(&c, Some(h), NOW),
            CookieState::Absent,
            "{h:.80}"
        );
    }
    assert_eq!(read_cookie(&c, None, NOW), CookieState::Absent);
    let invalid = CookieState::Rejected(Outcome::InvalidCookie);
    for h in [
        "sticky=".to_string(),
        "sticky=\"\"".into(),
        "sticky=\"".into(),
        format!("sticky={v}x"),
        format!("sticky=\"{v}"),
        format!("sticky={}", v.replace("green", "blue")),
        format!("sticky={}", "a.1.".repeat(50_000)),
    ] {
        assert_eq!(read_cookie(&c, Some(&h), NOW), invalid, "{h:.80}");
    }
}

#[test]
fn only_four_cookies_of_the_same_name_are_tried() {
    let c = config();
    let v = cookie(&c, "green", NOW + MAX_AGE);
    let four_bad = "sticky=x; ".repeat(4);
    assert_eq!(
        read_cookie(&c, Some(&format!("{four_bad}sticky={v}")), NOW),
        CookieState::Rejected(Outcome::InvalidCookie)
    );
    let three_bad = "sticky=x; ".repeat(3);
    assert_eq!(
        read_cookie(&c, Some(&format!("{three_bad}sticky={v}")), NOW),
        valid(1, false)
    );
}

#[test]
fn expiry() {
    let c = config();
    let at = |expiry: u64| {
        read_cookie(
            &c,
            Some(&format!("sticky={}", cookie(&c, "blue", expiry))),
            NOW,
        )
    };
    assert_eq!(at(NOW + 1), valid(0, true), "about to expire: renewed");
    assert_eq!(at(NOW + MAX_AGE / 2 - 1), valid(0, true));
    assert_eq!(at(NOW + MAX_AGE / 2), valid(0, false));
    assert_eq!(at(NOW + MAX_AGE), valid(0, false));
    assert_eq!(
        at(NOW + MAX_AGE + CLOCK_SKEW_SECONDS),
        valid(0, false),
        "another gateway's clock is ahead"
    );
    let expired = CookieState::Rejected(Outcome::Expired);
    assert_eq!(at(NOW), expired);
    assert_eq!(at(NOW - 1), expired);
    assert_eq!(at(0), expired);
    assert_eq!(
        at(NOW + MAX_AGE + CLOCK_SKEW_SECONDS + 1),
        expired,
        "longer than the configured lifetime"
    );
    assert_eq!(at(u64::MAX), expired);
}

#[test]
fn unknown_upstream_and_weight_zero() {
    let c = config();
    let gone = format!("sticky={}", cookie(&c, "purple", NOW + 100));
    assert_eq!(
        read_cookie(&c, Some(&gone), NOW),
        CookieState::Rejected(Outcome::UnknownUpstream)
    );
    // A draining upstream (weight 0) keeps the clients pinned to it.
    let red = format!("sticky={}", cookie(&c, "red", NOW + MAX_AGE));
    assert_eq!(read_cookie(&c, Some(&red), NOW), valid(2, false));
    // A cookie for another cookie name (same secret) is not ours.
    let other = Config::parse(
        json!({"upstreams": [{"name": "blue"}], "secret": "0123456789abcdef0123456789abcdef",
               "cookie": {"name": "other"}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let replay = format!("sticky={}", other.signer.sign("blue", NOW + 100));
    assert_eq!(
        read_cookie(&c, Some(&replay), NOW),
        CookieState::Rejected(Outcome::InvalidCookie)
    );
}

#[test]
fn decide_pins_or_chooses() {
    let c = config();
    let pinned = decide(
        &c,
        Some(&format!("sticky={}", cookie(&c, "red", NOW + MAX_AGE))),
        NOW,
        no_key,
        no_draw,
    );
    assert_eq!(
        pinned,
        Some(Decision {
            upstream: 2,
            outcome: Outcome::Pinned,
            set_cookie: false
        })
    );

    let new = decide(&c, None, NOW, no_key, || 0).unwrap();
    assert_eq!(
        new,
        Decision {
            upstream: 0,
            outcome: Outcome::New,
            set_cookie: true
        }
    );
    let new = decide(&c, Some("a=1"), NOW, no_key, || u64::MAX).unwrap();
    assert_eq!((new.upstream, new.outcome), (1, Outcome::New));

    let forged = format!("sticky=red.{}.{}", NOW + 100, "A".repeat(43));
    let d = decide(&c, Some(&forged), NOW, no_key, || u64::MAX).unwrap();
    assert_eq!(
        (d.upstream, d.outcome, d.set_cookie),
        (1, Outcome::InvalidCookie, true)
    );

    let expired = format!("sticky={}", cookie(&c, "blue", NOW - 5));
    let d = decide(&c, Some(&expired), NOW, no_key, || u64::MAX).unwrap();
    assert_eq!((d.upstream, d.outcome), (1, Outcome::Expired));

    let gone = format!("sticky={}", cookie(&c, "purple", NOW + 5));
    let d = decide(&c, Some(&gone), NOW, no_key, || 0).unwrap();
    assert_eq!((d.upstream, d.outcome), (0, Outcome::UnknownUpstream));
}

#[test]
fn a_draining_upstream_never_gets_new_clients() {
    let c = config();
    let mut state = 0u64;
    for _ in 0..2000 {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let d = decide(&c, None, NOW, no_key, || state).unwrap();
        assert_ne!(d.upstream, 2);
    }
}

#[test]
fn hash_header_choice() {
    let c = config_with(json!({"choose_by": {"hash_header": "x-user"}}));
    let pick = |user: &str| {
        decide(&c, None, NOW, || Some(user.as_bytes().to_vec()), no_draw)
            .unwrap()
            .upstream
    };
    assert_eq!(pick("alice"), pick("alice"));
    let spread: std::collections::HashSet<usize> =
        (0..50).map(|i| pick(&format!("u{i}"))).collect();
    assert_eq!(spread, [0, 1].into_iter().collect());
    // Without the header (or with an empty one): by weight.
    assert_eq!(decide(&c, None, NOW, || None, || 0).unwrap().upstream, 0);
    assert_eq!(
        decide(&c, None, NOW, || Some(Vec::new()), || u64::MAX)
            .unwrap()
            .upstream,
        1
    );
    // A cookie wins over the hash.
    let v = format!("sticky={}", cookie(&c, "red", NOW + MAX_AGE));
    assert_eq!(
        decide(&c, Some(&v), NOW, no_key, no_draw).unwrap().upstream,
        2
    );
}

#[test]
fn responses_set_renew_or_repin() {
    let c = config();
    let pinned = Decision {
        upstream: 0,
        outcome: Outcome::Pinned,
        set_cookie: false,
    };
    let new = Decision {
        upstream: 0,
        outcome: Outcome::New,
        set_cookie: true,
    };
    let never = || -> bool { panic!("code details were read") };

    assert_eq!(
        after_response(&c, &pinned, Some(200), never, no_key, no_draw),
        ResponseAction::Keep
    );
    assert_eq!(
        after_response(&c, &new, Some(200), never, no_key, no_draw),
        ResponseAction::SetCookie(0)
    );
    assert_eq!(
        after_response(&c, &new, None, never, no_key, no_draw),
        ResponseAction::SetCookie(0)
    );
    assert_eq!(
        after_response(&c, &pinned, Some(500), never, no_key, no_draw),
        ResponseAction::Keep
    );
    // The proxy's own 503/502: re-pinned elsewhere (never to the failed one, nor to weight 0).
    for draw in [0, u64::MAX / 2, u64::MAX] {
        assert_eq!(
            after_response(&c, &pinned, Some(503), || true, no_key, || draw),
            ResponseAction::Repin(1)
        );
        assert_eq!(
            after_response(&c, &new, Some(502), || true, no_key, || draw),
            ResponseAction::Repin(1)
        );
    }
    // The upstream's own 503: not re-pinned unless configured.
    assert_eq!(
        after_response(&c, &pinned, Some(503), || false, no_key, no_draw),
        ResponseAction::Keep
    );
    assert_eq!(
        after_response(&c, &new, Some(503), || false, no_key, no_draw),
        ResponseAction::SetCookie(0)
    );
    let any = config_with(json!({"repin_upstream_answers": true}));
    assert_eq!(
        after_response(&any, &pinned, Some(503), never, no_key, || 0),
        ResponseAction::Repin(1)
    );
    // No other upstream can take the client: the pin stays.
    let green = Decision {
        upstream: 1,
        outcome: Outcome::Pinned,
        set_cookie: false,
    };
    let lonely =
        config_with(json!({"upstreams": [{"name": "blue", "weight": 0}, {"name": "green"}]}));
    assert_eq!(
        after_response(&lonely, &green, Some(503), || true, no_key, || 0),
        ResponseAction::Keep
    );
    // Re-pinning disabled.
    let off = config_with(json!({"repin_statuses": []}));
    assert_eq!(
        after_response(&off, &pinned, Some(503), never, no_key, no_draw),
        ResponseAction::Keep
    );
}

#[test]
fn repin_by_hash_moves_to_the_keys_next_choice() {
    let c = config_with(json!({
        "upstreams": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}],
        "choose_by": {"hash_header": "x-user"},
    }));
    for i in 0..200 {
        let user = format!("user-{i}");
        let first = decide(&c, None, NOW, || Some(user.clone().into_bytes()), no_draw).unwrap();
        let again = after_response(
            &c,
            &first,
            Some(503),
            || true,
            || Some(user.clone().into_bytes()),
            no_draw,
        );
        let again_2 = after_response(
            &c,
            &first,
            Some(503),
            || true,
            || Some(user.clone().into_bytes()),
            no_draw,
        );
        assert_eq!(again, again_2, "stable for a key");
        match again {
            ResponseAction::Repin(u) => assert_ne!(u, first.upstream),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn set_cookie_round_trips_through_the_cookie_header() {
    let c = config();
    let set = c.set_cookie(1, NOW).unwrap();
    assert!(set.starts_with("sticky=green."), "{set}");
    assert!(
        set.ends_with("; HttpOnly; SameSite=Lax; Path=/; Max-Age=3600"),
        "{set}"
    );
    let pair = set.split(';').next().unwrap();
    assert_eq!(read_cookie(&c, Some(pair), NOW), valid(1, false));
    assert_eq!(
        read_cookie(&c, Some(pair), NOW + MAX_AGE),
        CookieState::Rejected(Outcome::Expired)
    );
    assert_eq!(c.set_cookie(9, NOW), None);
}

#[test]
fn outcomes_index_their_counters() {
    // The filter indexes its counter ids by `Outcome as usize`.
    for (i, o) in Outcome::ALL.iter().enumerate() {
        assert_eq!(*o as usize, i, "{o:?}");
    }
    let labels: std::collections::HashSet<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(labels.len(), Outcome::ALL.len());
}

#[test]
fn a_cached_value_never_stands_for_another() {
    // The genuine value is cached, in a cache of one slot (every value lands on it) and in a full
    // size one; then every value one change away from it, each still shaped like a cookie value,
    // must be refused exactly as without a cache: an invalid tag, not a pin.
    let c = config();
    let genuine = cookie(&c, "green", NOW + MAX_AGE);
    for slots in [1, SLOTS] {
        let mut cache = VerifiedCookies::new(slots);
        let header = format!("sticky={genuine}");
        assert_eq!(
            sticky::read_cookie(&c, &mut cache, Some(&header), NOW),
            valid(1, false)
        );
        assert_eq!(cache.len(), 1);
        let bytes = genuine.as_bytes();
        let mut changed = Vec::new();
        for at in 0..bytes.len() {
            for replacement in [b'A', b'B', b'0', b'.', b'-', b'_'] {
                let mut other = bytes.to_vec();
                if other[at] != replacement {
                    other[at] = replacement;
                    changed.push(String::from_utf8(other).unwrap());
                }
            }
            changed.push(genuine[..at].to_string());
            changed.push(format!("{}{}", &genuine[..at], &genuine[at + 1..]));
        }
        changed.push(format!("{genuine}A"));
        changed.push(format!("{genuine}.{genuine}"));
        changed.push(genuine.replace("green", "blue"));
        changed.push(cookie(&c, "green", NOW + MAX_AGE).replace("green", "red"));
        for other in &changed {
            let header = format!("sticky={other}");
            let without = sticky::read_cookie(&c, &mut VerifiedCookies::new(0), Some(&header), NOW);
            assert!(!matches!(without, CookieState::Valid { .. }), "{other}");
            assert_eq!(
                sticky::read_cookie(&c, &mut cache, Some(&header), NOW),
                without,
                "{other} against the cached {genuine}"
            );
        }
        assert_eq!(cache.len(), 1, "nothing else was remembered");
        assert_eq!(
            sticky::read_cookie(&c, &mut cache, Some(&format!("sticky={genuine}")), NOW),
            valid(1, false),
            "the genuine value is still honoured"
        );
    }
}

#[test]
fn the_cache_does_not_outlive_expiry_nor_its_configuration() {
    let c = config();
    let mut cache = VerifiedCookies::new(SLOTS);
    let value = format!("sticky={}", cookie(&c, "blue", NOW + MAX_AGE));
    let read = |cache: &mut VerifiedCookies, now| sticky::read_cookie(&c, cache, Some(&value), now);
    assert_eq!(read(&mut cache, NOW), valid(0, false));
    assert_eq!(
        read(&mut cache, NOW + MAX_AGE / 2 + 1),
        valid(0, true),
        "renewal still due"
    );
    assert_eq!(
        read(&mut cache, NOW + MAX_AGE),
        CookieState::Rejected(Outcome::Expired),
        "expired while cached"
    );
    assert_eq!(
        read(&mut cache, NOW - CLOCK_SKEW_SECONDS - 1),
        CookieState::Rejected(Outcome::Expired),
        "further away than the lifetime, for a clock behind the one that cached it"
    );
    // The same value under another secret, or with its upstream gone, is read with that
    // configuration's own (empty) cache: the filter keeps one cache per configuration.
    let rotated = config_with(json!({"secret": "another secret, 32 bytes or more...."}));
    let mut rotated_cache = VerifiedCookies::new(SLOTS);
    assert_eq!(
        sticky::read_cookie(&rotated, &mut rotated_cache, Some(&value), NOW),
        CookieState::Rejected(Outcome::InvalidCookie)
    );
    let fewer = config_with(json!({"upstreams": [{"name": "green"}]}));
    assert_eq!(
        sticky::read_cookie(&fewer, &mut VerifiedCookies::new(SLOTS), Some(&value), NOW),
        CookieState::Rejected(Outcome::UnknownUpstream)
    );
}

#[test]
fn cached_and_uncached_reads_agree_on_random_traffic() {
    // Headers drawn from genuine values (several upstreams and expiries, some past, some too far
    // ahead, one for an unknown upstream), their one-byte changes, values of another secret and
    // junk, one to three cookies per header, read at moving times by one long-lived small cache
    // (collisions and replacements) and one full-size cache; each answer must equal the
    // uncached one.
    let c = config();
    let other = config_with(json!({"secret": "another secret, 32 bytes or more...."}));
    let mut rng = SplitMix64(7);
    let mut values = Vec::new();
    for upstream in ["blue", "green", "red", "purple"] {
        for offset in [
            0,
            1,
            30,
            MAX_AGE / 2,
            MAX_AGE,
            MAX_AGE + CLOCK_SKEW_SECONDS + 5,
        ] {
            values.push(cookie(&c, upstream, NOW + offset));
            values.push(other.signer.sign(upstream, NOW + offset));
        }
    }
    let genuine = values.len();
    for i in 0..genuine {
        let mut v = values[i].clone().into_bytes();
        let at = rng.below(v.len() as u64) as usize;
        v[at] = if v[at] == b'x' { b'y' } else { b'x' };
        values.push(String::from_utf8(v).unwrap());
    }
    values.push("junk".into());
    values.push(String::new());
    let (mut small, mut full) = (VerifiedCookies::new(4), VerifiedCookies::new(SLOTS));
    let mut honoured = 0;
    for _ in 0..20_000 {
        let cookies = 1 + rng.below(3);
        let header = (0..cookies)
            .map(|_| {
                let v = &values[rng.below(values.len() as u64) as usize];
                let name = if rng.below(8) == 0 { "other" } else { "sticky" };
                format!("{name}={v}")
            })
            .collect::<Vec<_>>()
            .join("; ");
        let now = NOW - 100 + rng.below(MAX_AGE + 300);
        let uncached = sticky::read_cookie(&c, &mut VerifiedCookies::new(0), Some(&header), now);
        assert_eq!(
            sticky::read_cookie(&c, &mut small, Some(&header), now),
            uncached,
            "{header} at {now}"
        );
        assert_eq!(
            sticky::read_cookie(&c, &mut full, Some(&header), now),
            uncached,
            "{header} at {now}"
        );
        honoured += usize::from(matches!(uncached, CookieState::Valid { .. }));
    }
    assert!(
        honoured > 1000,
        "the traffic exercises the cache: {honoured}"
    );
    assert!(small.len() <= 4);
}
