//! What the filter decides, host-free: which upstream a request goes to, and which cookie (if
//! any) its response sets.
//!
//! **Request** ([`decide`]): the `Cookie` header is parsed per RFC 6265 section 5.4 / 4.2.1 by
//! the `cookie` crate (`Cookie::split_parse`: pairs separated by `;`, surrounding whitespace
//! ignored, a value in double quotes taken without them, pairs without `=` skipped). Cookie names
//! are case-sensitive. Up to [`MAX_SAME_NAME_COOKIES`] cookies with the configured name are
//! tried in order (a user agent sends several when cookies of the same name exist for several
//! paths or domains, the most specific path first, RFC 6265 section 5.4 step 2); the first one
//! that is honoured wins. A cookie is honoured when its tag verifies, it has not expired, its
//! expiry is not further away than `max_age_seconds` (plus [`CLOCK_SKEW_SECONDS`]) allows (a
//! shortened lifetime applies to cookies already issued), and it names a configured upstream.
//! Otherwise the request is treated as having no cookie: an upstream is chosen (by weight, or by
//! the hash of the configured header), and the response sets a cookie for it. Nothing about a
//! cookie is ever an error for the client.
//!
//! Values that verified and were honoured are remembered in a [`VerifiedCookies`] cache (one per
//! configuration), so that a pinned client's cookie is verified once, not on every request; the
//! outcome is the same with or without it (see [`crate::cookie_cache`]).
//!
//! A honoured cookie whose remaining lifetime is below half of `max_age_seconds` is renewed (the
//! response sets a fresh cookie for the same upstream), so an active client stays pinned without
//! a `Set-Cookie` on every response.
//!
//! **Response** ([`after_response`]): if the status is one of `repin_statuses` and the proxy
//! itself produced the response (for Envoy: `response.code_details` is not `via_upstream`, e.g.
//! 503 `no_healthy_upstream` or a connection failure), or `repin_upstream_answers` is set, the
//! client is re-pinned: another upstream is chosen, excluding the one that failed, and the
//! response (still the error; the proxy does not retry elsewhere) sets a cookie for it, so the
//! client's next request goes there. If no other upstream can take new clients, nothing changes.

use tollgate_common::bytes::same_bytes;

use crate::choose::key_hash;
use crate::config::{ChooseBy, Config};
use crate::cookie_cache::{Pin, VerifiedCookies};
use crate::cookie_value::{Malformed, MAX_VALUE_BYTES};

/// Accepted difference between gateways' clocks (seconds) when checking that an expiry is not
/// further away than the configured lifetime.
pub const CLOCK_SKEW_SECONDS: u64 = 60;
/// Most cookies with the configured name looked at in one `Cookie` header.
pub const MAX_SAME_NAME_COOKIES: usize = 4;

/// How a request got its upstream; the `result` label of the requests counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A valid cookie pinned it (renewals included).
    Pinned,
    /// No cookie of ours: a new choice.
    New,
    /// A cookie that is malformed or whose tag does not verify (tampered, other secret): a new
    /// choice.
    InvalidCookie,
    /// A genuine cookie past its expiry, or with an expiry further away than the configured
    /// lifetime allows: a new choice.
    Expired,
    /// A genuine cookie naming an upstream that is no longer configured: a new choice.
    UnknownUpstream,
    /// Counted on responses only: the client was moved to another upstream after a re-pin status.
    Repinned,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 6] = [
        Outcome::Pinned,
        Outcome::New,
        Outcome::InvalidCookie,
        Outcome::Expired,
        Outcome::UnknownUpstream,
        Outcome::Repinned,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pinned => "pinned",
            Outcome::New => "new",
            Outcome::InvalidCookie => "invalid_cookie",
            Outcome::Expired => "expired",
            Outcome::UnknownUpstream => "unknown_upstream",
            Outcome::Repinned => "repinned",
        }
    }
}

/// What the request's `Cookie` header says about this filter's cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieState {
    /// A cookie is honoured: upstream index, and whether to renew it on the response.
    Valid {
        /// Upstream index.
        upstream: usize,
        /// Its remaining lifetime is below half of `max_age_seconds`.
        renew: bool,
    },
    /// No cookie with the configured name.
    Absent,
    /// Cookies with the configured name, none honoured: why the first one was not.
    Rejected(Outcome),
}

/// Reads the filter's cookie from a `Cookie` field value, with `cache` (of this configuration)
/// remembering the values honoured. Never panics, whatever the input; the work is linear in the
/// header's length plus at most [`MAX_SAME_NAME_COOKIES`] cache lookups and HMAC checks.
pub fn read_cookie(
    config: &Config,
    cache: &mut VerifiedCookies,
    cookie_header: Option<&str>,
    now: u64,
) -> CookieState {
    let Some(header) = cookie_header else {
        return CookieState::Absent;
    };
    let mut first_rejection = None;
    let candidates = cookie::Cookie::split_parse(header)
        .filter_map(Result::ok)
        .filter(|c| same_bytes(c.name().as_bytes(), config.cookie.name.as_bytes()))
        .take(MAX_SAME_NAME_COOKIES);
    for c in candidates {
        match check_value(config, cache, c.value_trimmed(), now) {
            Ok(state) => return state,
            Err(why) => {
                first_rejection.get_or_insert(why);
            }
        }
    }
    first_rejection.map_or(CookieState::Absent, CookieState::Rejected)
}

/// One cookie value: its tag (or the cache), its expiry against `now`, then its upstream.
fn check_value(
    config: &Config,
    cache: &mut VerifiedCookies,
    value: &str,
    now: u64,
) -> Result<CookieState, Outcome> {
    // Longer than any valid value: rejected before it is hashed for the cache (as `verify`
    // would reject it), so that no client-sized value costs work.
    if value.len() > MAX_VALUE_BYTES {
        return Err(Outcome::InvalidCookie);
    }
    let cached = cache.get(value);
    let (expiry, upstream) = match cached {
        Some(pin) => (pin.expiry, Some(pin.upstream)),
        None => {
            let signed = config.signer.verify(value).map_err(|e| match e {
                Malformed::Syntax | Malformed::BadTag => Outcome::InvalidCookie,
            })?;
            (signed.expiry, config.upstream_index(signed.upstream))
        }
    };
    let max_age = config.cookie.max_age_seconds;
    if expiry <= now
        || expiry
            > now
                .saturating_add(max_age)
                .saturating_add(CLOCK_SKEW_SECONDS)
    {
        return Err(Outcome::Expired);
    }
    let upstream = upstream.ok_or(Outcome::UnknownUpstream)?;
    if cached.is_none() {
        cache.insert(value, Pin { upstream, expiry });
    }
    let remaining = expiry.saturating_sub(now);
    Ok(CookieState::Valid {
        upstream,
        renew: remaining < max_age / 2,
    })
}

/// The request's routing decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The upstream (index into [`Config::upstreams`]) the request goes to.
    pub upstream: usize,
    /// How it got it.
    pub outcome: Outcome,
    /// Whether the response sets a cookie for `upstream` (new choice or renewal).
    pub set_cookie: bool,
}

/// Chooses for a client without a honoured cookie: by the hash of the key when the
/// configuration says so and the request has a non-empty key, else by weight.
fn choose(
    config: &Config,
    key: impl FnOnce() -> Option<Vec<u8>>,
    draw: impl FnOnce() -> u64,
    exclude: Option<usize>,
) -> Option<usize> {
    if let ChooseBy::HashHeader(_) = config.choose_by {
        if let Some(k) = key().filter(|k| !k.is_empty()) {
            return config.chooser.by_key(key_hash(&k), exclude);
        }
    }
    config.chooser.weighted(draw(), exclude)
}

/// Decides where a request goes.
///
/// `cache`: this configuration's verified values; `cookie_header`: the request's `Cookie` field
/// value; `now`: Unix seconds; `key`: the value of the `hash_header`, as bytes (asked only when
/// a choice is made by hash); `draw`: a uniformly random `u64` (asked only for a choice by
/// weight). `None` only if no upstream can be chosen, which a valid configuration rules out.
pub fn decide(
    config: &Config,
    cache: &mut VerifiedCookies,
    cookie_header: Option<&str>,
    now: u64,
    key: impl FnOnce() -> Option<Vec<u8>>,
    draw: impl FnOnce() -> u64,
) -> Option<Decision> {
    let outcome = match read_cookie(config, cache, cookie_header, now) {
        CookieState::Valid { upstream, renew } => {
            return Some(Decision {
                upstream,
                outcome: Outcome::Pinned,
                set_cookie: renew,
            })
        }
        CookieState::Absent => Outcome::New,
        CookieState::Rejected(why) => why,
    };
    let upstream = choose(config, key, draw, None)?;
    Some(Decision {
        upstream,
        outcome,
        set_cookie: true,
    })
}

/// What the response does about the cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseAction {
    /// Nothing.
    Keep,
    /// Set a cookie for this upstream (the request's own: new choice or renewal).
    SetCookie(usize),
    /// Set a cookie for this other upstream: the client is re-pinned.
    Repin(usize),
}

/// Decides what a response does, given the request's `decision` and the response `status`.
///
/// `proxy_generated` says whether the proxy itself produced the response (asked only when the
/// status is a re-pin status and `repin_upstream_answers` is off); `key` and `draw` are as in
/// [`decide`], asked only when re-pinning.
pub fn after_response(
    config: &Config,
    decision: &Decision,
    status: Option<u16>,
    proxy_generated: impl FnOnce() -> bool,
    key: impl FnOnce() -> Option<Vec<u8>>,
    draw: impl FnOnce() -> u64,
) -> ResponseAction {
    let repin_status = status.is_some_and(|s| config.repin_statuses.contains(&s));
    if repin_status && (config.repin_upstream_answers || proxy_generated()) {
        if let Some(other) = choose(config, key, draw, Some(decision.upstream)) {
            return ResponseAction::Repin(other);
        }
    }
    if decision.set_cookie {
        ResponseAction::SetCookie(decision.upstream)
    } else {
        ResponseAction::Keep
    }
}
