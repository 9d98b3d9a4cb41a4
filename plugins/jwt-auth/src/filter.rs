//! jwt-auth on the filters' skeleton (`tollgate_common::skeleton`): what its root context shares
//! (configuration, counters, keys, the verified-token cache), remote JWKS fetched on ticks, and
//! the request headers phase, a thin shell over the host-free modules.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::types::Action as HostAction;
use tollgate_common::bytes::same_bytes;
use tollgate_common::clock::UnixNanos;
use tollgate_common::config::ConfigError;
use tollgate_common::error_envelope::ErrorFormat;
use tollgate_common::host_calls::{
    count, forward_normal_path, now_unix_secs, property, send_json_error, set_request_header,
};
use tollgate_common::http::{names_are_plain, split_path_query, PLAIN_HEADER_NAMES_PROPERTY};
use tollgate_common::remote::TICK_MILLIS;
use tollgate_common::remote_fetch::RemoteDocument;
use tollgate_common::signals;
use tollgate_common::skeleton::request_stage::Stage;
use tollgate_common::skeleton::{Filter, FilterConfig};

use crate::cache::{TokenKey, VerifiedCache};
use crate::config::{Action, Config, KeySource, JWKS_NAMESPACE};
use crate::counters::Counters;
use crate::keys::KeySet;
use crate::request_headers::{strip_output_headers, Headers};
use crate::token::{extract, TokenLocation};
use crate::verify::{authorize, verify, Reason};

proxy_wasm::main! {{
    tollgate_common::skeleton::contexts::main::<JwtAuth>();
}}

/// The filter, for the skeleton.
struct JwtAuth;

impl FilterConfig for Config {
    fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse(bytes)
    }

    fn error_format(&self) -> ErrorFormat {
        self.error_format
    }
}

/// What the root context shares with its HTTP contexts.
struct Shared {
    config: Config,
    remote_keys: RefCell<Vec<Option<KeySet>>>,
    cache: RefCell<VerifiedCache>,
    counters: Counters,
    /// The host vouches that no client header name has an `_` or `.`
    /// (`http::PLAIN_HEADER_NAMES_PROPERTY`, read once in `on_configure`): then no request's
    /// names are listed to find CGI spellings.
    plain_header_names: bool,
    /// How the path and the authority are refused.
    stage: Stage,
}

impl Shared {
    /// Provider `i`'s keys: static ones from the configuration, remote ones once fetched.
    fn key_set<'a>(&'a self, i: usize, remote: &'a [Option<KeySet>]) -> Option<&'a KeySet> {
        match self.config.providers.get(i).map(|p| &p.keys) {
            Some(KeySource::Static(set)) => Some(set),
            Some(KeySource::Remote(_)) => remote.get(i).and_then(Option::as_ref),
            None => None,
        }
    }
}

struct RemoteState {
    provider: usize,
    document: RemoteDocument,
}

/// The root context's remote JWKS, one per provider with `remote_jwks`.
#[derive(Default)]
struct Remotes(Vec<RemoteState>);

impl Shared {
    /// Installs provider `provider`'s keys from a JWKS document checked when it was fetched.
    fn install(&self, provider: usize, body: &[u8]) {
        match KeySet::from_jwks(&String::from_utf8_lossy(body), false) {
            Ok((set, skipped)) => self.install_set(provider, set, skipped),
            Err(e) => log::warn!("JWKS of provider {provider} unusable: {e}"),
        }
    }

    fn install_set(&self, provider: usize, set: KeySet, skipped: Vec<String>) {
        for s in skipped {
            log::warn!("JWKS of provider {provider}: skipped {s}");
        }
        if let Some(slot) = self.remote_keys.borrow_mut().get_mut(provider) {
            *slot = Some(set);
        }
        self.cache.borrow_mut().clear();
    }
}

impl Filter for JwtAuth {
    const NAME: &'static str = "jwt-auth";
    type Config = Config;
    type Shared = Shared;
    type Root = Remotes;
    type Request = ();

    fn configure(
        config: Config,
        root: &mut Remotes,
        _started: Option<UnixNanos>,
    ) -> Option<Shared> {
        // The root's state changes only with a configuration that loads: a refused one (a
        // second `on_configure` on a live root) leaves the previous pair as it was.
        let remotes: Vec<RemoteState> = config
            .providers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match &p.keys {
                KeySource::Remote(r) => Some(RemoteState {
                    provider: i,
                    document: RemoteDocument::new(r.clone(), JWKS_NAMESPACE, "JWKS"),
                }),
                KeySource::Static(_) => None,
            })
            .collect();
        if !remotes.is_empty() {
            if let Err(e) = tollgate_common::host_calls::set_tick_period_ms(TICK_MILLIS) {
                log::error!("cannot set the tick period for remote JWKS: host status {e}");
                return None;
            }
        }
        root.0 = remotes;
        let providers = config.providers.len();
        let counters = Counters::define();
        Some(Shared {
            cache: RefCell::new(VerifiedCache::new(config.cache_entries)),
            remote_keys: RefCell::new((0..providers).map(|_| None).collect()),
            stage: Stage {
                filter: Self::NAME,
                outcome_property: signals::JWT_AUTH,
                invalid_path: counters.invalid_path,
                invalid_authority: counters.invalid_authority,
            },
            counters,
            plain_header_names: !config.cgi_folds.is_empty()
                && names_are_plain(property(&PLAIN_HEADER_NAMES_PROPERTY).as_deref()),
            config,
        })
    }

    fn request_headers(_request: &mut (), shared: &Rc<Shared>, _end: bool) -> HostAction {
        authenticate(shared)
    }

    fn tick(root: &mut Remotes, shared: &Rc<Shared>) {
        let now = now_unix_secs();
        let mut newer = Vec::new();
        for state in &mut root.0 {
            if let Some((_, body)) = state.document.tick(now) {
                newer.push((state.provider, body));
            }
        }
        for (provider, body) in newer {
            shared.install(provider, &body);
        }
    }

    fn root_http_reply(root: &mut Remotes, shared: &Rc<Shared>, token: u32, body_size: usize) {
        let Some(state) = root.0.iter_mut().find(|r| r.document.owns(token)) else {
            return;
        };
        let provider = state.provider;
        let now = now_unix_secs();
        let Some(body) = state.document.on_response(now, body_size) else {
            return;
        };
        match KeySet::from_jwks(&String::from_utf8_lossy(&body), false) {
            Ok((set, skipped)) => {
                if state.document.accept(now, &body) {
                    shared.install_set(provider, set, skipped);
                }
            }
            Err(e) => state.document.reject(now, &e),
        }
    }
}

/// Refuses the request for `reason` (401 or 403 with its challenge), counted, published and
/// logged.
fn deny(
    shared: &Shared,
    headers: &Headers,
    reason: Reason,
    method: &str,
    path: &str,
) -> HostAction {
    // The fast path skips pseudo-headers no rule needs; the log line wants them anyway.
    let fetch = |given: &str, name: &str| {
        if given.is_empty() {
            headers.get(name).unwrap_or_default()
        } else {
            given.to_string()
        }
    };
    let (method, path) = (fetch(method, ":method"), fetch(path, ":path"));
    log::info!("{method} {path}: {} ({})", reason.status(), reason.as_str());
    count(shared.counters.denied.id(reason));
    strip_output_headers(&shared.config);
    signals::publish_outcome(signals::JWT_AUTH, reason.as_str());
    let challenge = reason.challenge();
    let error = if reason.status() == 403 {
        "forbidden"
    } else {
        "unauthorized"
    };
    send_json_error(
        reason.status(),
        &[("www-authenticate", &challenge)],
        error,
        reason.description(),
    );
    HostAction::Pause
}

/// Verifies a token not in the cache.
fn verify_uncached(
    shared: &Shared,
    token: &str,
    now: u64,
) -> Result<Rc<crate::verify::Verified>, Reason> {
    let remote = shared.remote_keys.borrow();
    verify(&shared.config, |i| shared.key_set(i, &remote), token, now).map(Rc::new)
}

/// The request headers phase: the token found, verified and authorized, or the request refused.
fn authenticate(shared: &Shared) -> HostAction {
    let config = &shared.config;
    let needs = config.needs;
    let Some(headers) = Headers::read(&shared.config, &shared.counters, shared.plain_header_names)
    else {
        return HostAction::Pause;
    };
    let get = |name: &str, needed: bool| {
        if needed {
            headers.get(name).unwrap_or_default()
        } else {
            String::new()
        }
    };
    let target = get(":path", needs.path || needs.query);
    let method = get(":method", needs.method);
    let authority = get(":authority", needs.host);
    let strip = || strip_output_headers(config);
    let host = if needs.host {
        match shared.stage.host(authority.as_bytes(), strip) {
            Some(host) => host,
            None => return HostAction::Pause,
        }
    } else {
        Cow::Borrowed("")
    };
    let request_path = if needs.path {
        match shared.stage.path(target.as_bytes(), &config.paths, strip) {
            Some(p) => Some(p),
            None => return HostAction::Pause,
        }
    } else {
        None
    };
    let (path, query) = match &request_path {
        Some(p) => (p.path.as_ref(), p.query),
        None => split_path_query(&target),
    };
    let action = config.action_for(path, &method, &host);
    let Action::Require { locations, .. } = action else {
        // Headers this filter writes are never taken from the client.
        strip_output_headers(config);
        headers.strip_cgi_aliases(config);
        count(shared.counters.bypass);
        signals::publish_outcome(signals::JWT_AUTH, "bypass");
        if let Some(p) = &request_path {
            forward_normal_path(p);
        }
        return HostAction::Continue;
    };
    let Some(found) = extract(locations, |name| headers.get(name), query) else {
        return deny(shared, &headers, Reason::MissingToken, &method, path);
    };
    let now = now_unix_secs();
    let location = found.location;
    let token = TokenKey::from(found.token);
    let cached = shared.cache.borrow_mut().get(&token, now);
    let verified = match cached {
        Some(v) => v,
        None => match verify_uncached(shared, token.as_str(), now) {
            Ok(v) => {
                shared.cache.borrow_mut().insert(token, &v);
                v
            }
            Err(reason) => return deny(shared, &headers, reason, &method, path),
        },
    };
    if let Err(reason) = authorize(config, action, &verified, now) {
        return deny(shared, &headers, reason, &method, path);
    }
    // Setting a header replaces every client copy; the other headers this filter writes are
    // removed, so a client cannot forge any of them. (A refused request never reaches the
    // upstream, so it needs neither.)
    for h in &config.output_headers {
        let value = verified
            .headers
            .iter()
            .find(|(name, _)| same_bytes(name.as_bytes(), h.as_bytes()))
            .map(|(_, v)| v.as_str());
        set_request_header(h, value);
    }
    let provider = config.providers.get(verified.provider);
    if let (false, TokenLocation::Header { name, .. }) =
        (provider.is_some_and(|p| p.forward), location)
    {
        set_request_header(name, None);
    }
    headers.strip_cgi_aliases(config);
    // The verified claim headers, for later filters that take an identity from them
    // (tollgate_common::identity): a property, which a client cannot set.
    for c in provider.map_or(&[][..], |p| &p.claim_to_headers) {
        let same = |(n, _): &&(String, String)| same_bytes(n.as_bytes(), c.header.as_bytes());
        if let Some((_, value)) = verified.headers.iter().find(same) {
            signals::set(&c.property, value);
        }
    }
    if let Some(p) = &request_path {
        forward_normal_path(p);
    }
    count(shared.counters.ok);
    signals::publish_outcome(signals::JWT_AUTH, "ok");
    HostAction::Continue
}
