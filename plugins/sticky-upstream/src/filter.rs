//! sticky-upstream on the filters' skeleton (`tollgate_common::skeleton`): what its root context
//! shares (configuration, counters, random draws, verified cookies) and its two phases, a thin
//! shell over [`crate::sticky`].
//!
//! Per request on the sticky-read path (a valid cookie): one `Cookie` header read, one cookie
//! parse, one cache lookup (an HMAC verification the first time a value is seen, see
//! [`crate::cookie_cache`]), one request-header write (`proxy_replace_header_map_value`, which
//! also overwrites a copy sent by the client), one counter increment; on the response, one
//! `:status` read (skipped when `repin_statuses` is empty).
//!
//! Header values are read as bytes (`proxy_get_header_map_value` gives bytes; the SDK's `String`
//! getters unwrap `String::from_utf8` and would trap on a non-UTF-8 value, which HTTP allows as
//! obs-text, and a trap leaves Envoy's VM failed: every later request on that worker gets 503).
//! The `Cookie` value is converted lossily (`abi_codec::text`: valid UTF-8, the usual case, is
//! kept as it is): the filter's own cookie is ASCII, so replacing invalid sequences elsewhere in
//! the header cannot change it.
//!
//! Routing: Envoy resolves the route before the filter chain runs and caches it, but its Wasm
//! host clears the route cache whenever a filter adds, replaces or removes a request header
//! (`Context::replaceHeaderMapValue` calls `clearRouteCache()` for request headers), so the
//! router re-evaluates `cluster_header` with the value written here. No explicit
//! `clear_route_cache` call is needed (the end-to-end tests check it).

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::types::{Action, MapType};
use tollgate_common::abi_codec::text;
use tollgate_common::clock::UnixNanos;
use tollgate_common::config::ConfigError;
use tollgate_common::host_calls::{self as host_calls, count, now_unix_secs, send_json_error};
use tollgate_common::skeleton::{Filter, FilterConfig};

use crate::choose::Draws;
use crate::config::{ChooseBy, Config};
use crate::cookie_cache::{VerifiedCookies, SLOTS};
use crate::counters::Counters;
use crate::sticky::{after_response, decide, Decision, Outcome, ResponseAction};

proxy_wasm::main! {{
    tollgate_common::skeleton::contexts::main::<StickyUpstream>();
}}

/// The filter, for the skeleton.
struct StickyUpstream;

impl FilterConfig for Config {
    fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse(bytes)
    }
}

/// What the root context shares with its HTTP contexts.
struct Shared {
    config: Config,
    counters: Counters,
    draws: RefCell<Draws>,
    /// Cookie values of this configuration that verified.
    verified: RefCell<VerifiedCookies>,
}

impl Shared {
    fn count(&self, outcome: Outcome) {
        count(self.counters.outcomes.id(outcome));
    }

    fn draw(&self) -> u64 {
        self.draws.borrow_mut().next_u64()
    }

    /// The value of the configured `hash_header`, if the configuration chooses by hash.
    fn hash_key(&self) -> Option<Vec<u8>> {
        match &self.config.choose_by {
            ChooseBy::HashHeader(h) => host_calls::request_header_bytes(h),
            ChooseBy::Weighted => None,
        }
    }
}

impl Filter for StickyUpstream {
    const NAME: &'static str = "sticky-upstream";
    type Config = Config;
    type Shared = Shared;
    type Root = ();
    /// The request's upstream and why, once chosen.
    type Request = Option<Decision>;

    fn configure(config: Config, _root: &mut (), _started: Option<UnixNanos>) -> Option<Shared> {
        Some(Shared {
            config,
            counters: Counters::define(),
            draws: RefCell::new(Draws::from_platform()),
            verified: RefCell::new(VerifiedCookies::new(SLOTS)),
        })
    }

    fn request_headers(request: &mut Option<Decision>, shared: &Rc<Shared>, _end: bool) -> Action {
        let config = &shared.config;
        let cookie = host_calls::request_header_bytes("cookie").map(text);
        let decision = decide(
            config,
            &mut shared.verified.borrow_mut(),
            cookie.as_deref(),
            now_unix_secs(),
            || shared.hash_key(),
            || shared.draw(),
        );
        let Some(decision) = decision.filter(|d| config.upstream_name(d.upstream).is_some()) else {
            // Unreachable with a valid configuration (the total weight is positive); never
            // route on a client's copy of the header.
            host_calls::set_request_header(&config.route_header, None);
            send_json_error(503, &[], "no_upstream", "no upstream can take the request");
            return Action::Pause;
        };
        // Replaces every copy the client may have sent (the host's replace removes the others).
        host_calls::set_request_header(
            &config.route_header,
            config.upstream_name(decision.upstream),
        );
        shared.count(decision.outcome);
        *request = Some(decision);
        Action::Continue
    }

    fn response_headers(request: &mut Option<Decision>, shared: &Rc<Shared>, _end: bool) -> Action {
        let Some(decision) = *request else {
            return Action::Continue;
        };
        let config = &shared.config;
        let status = if config.repin_statuses.is_empty() {
            None
        } else {
            host_calls::header_bytes(MapType::HttpResponseHeaders, ":status")
                .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
        };
        let action = after_response(
            config,
            &decision,
            status,
            || {
                // Envoy: `via_upstream` when the upstream answered; anything else (or a host
                // without the property) is the proxy's own answer. Not the SDK's
                // `get_property`, which unwraps host errors.
                host_calls::property(&["response", "code_details"])
                    .is_none_or(|details| details != b"via_upstream")
            },
            || shared.hash_key(),
            || shared.draw(),
        );
        let upstream = match action {
            ResponseAction::Keep => return Action::Continue,
            ResponseAction::SetCookie(u) => u,
            ResponseAction::Repin(u) => {
                log::info!(
                    "status {} from upstream {:?}: re-pinning the client to {:?}",
                    status.unwrap_or(0),
                    config.upstream_name(decision.upstream).unwrap_or("?"),
                    config.upstream_name(u).unwrap_or("?")
                );
                shared.count(Outcome::Repinned);
                u
            }
        };
        if let Some(set_cookie) = config.set_cookie(upstream, now_unix_secs()) {
            host_calls::add_response_header("set-cookie", &set_cookie);
        }
        Action::Continue
    }
}
