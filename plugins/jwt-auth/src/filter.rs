//! proxy-wasm glue: the root context (configuration, metrics, remote JWKS on ticks) and the
//! HTTP context (one request), a thin shell over the host-free modules.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action as HostAction, ContextType};
use tollgate_common::abi_codec::{text, HeaderList};
use tollgate_common::authority::canonical_host;
use tollgate_common::bytes::same_bytes;
use tollgate_common::host::{
    count, forward_normal_path, now_unix_secs, plugin_configuration, property, refuse_authority,
    refuse_path, request_header, request_header_list, send_json_error, set_request_header,
};
use tollgate_common::http::{names_are_plain, split_path_query, PLAIN_HEADER_NAMES_PROPERTY};
use tollgate_common::remote::TICK_MILLIS;
use tollgate_common::remote_fetch::RemoteDocument;
use tollgate_common::signals;

use crate::cache::{TokenKey, VerifiedCache};
use crate::config::{Action, Config, KeySource, JWKS_NAMESPACE};
use crate::counters::Counters;
use crate::keys::KeySet;
use crate::token::{extract, TokenLocation};
use crate::verify::{authorize, verify, Reason};

proxy_wasm::main! {{
    tollgate_common::host::init_log(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(JwtAuthRoot::default()) });
}}

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

#[derive(Default)]
struct JwtAuthRoot {
    shared: Option<Rc<Shared>>,
    remotes: Vec<RemoteState>,
}

impl JwtAuthRoot {
    /// Installs provider `provider`'s keys from a JWKS document checked when it was fetched.
    fn install(&self, provider: usize, body: &[u8]) {
        match KeySet::from_jwks(&String::from_utf8_lossy(body), false) {
            Ok((set, skipped)) => self.install_set(provider, set, skipped),
            Err(e) => log::warn!("JWKS of provider {provider} unusable: {e}"),
        }
    }

    fn install_set(&self, provider: usize, set: KeySet, skipped: Vec<String>) {
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        for s in skipped {
            log::warn!("JWKS of provider {provider}: skipped {s}");
        }
        if let Some(slot) = shared.remote_keys.borrow_mut().get_mut(provider) {
            *slot = Some(set);
        }
        shared.cache.borrow_mut().clear();
    }
}

impl Context for JwtAuthRoot {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(state) = self.remotes.iter_mut().find(|r| r.document.owns(token_id)) else {
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
                    self.install_set(provider, set, skipped);
                }
            }
            Err(e) => state.document.reject(now, &e),
        }
    }
}

impl RootContext for JwtAuthRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = plugin_configuration();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        self.remotes = config
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
        let providers = config.providers.len();
        self.shared = Some(Rc::new(Shared {
            cache: RefCell::new(VerifiedCache::new(config.cache_entries)),
            remote_keys: RefCell::new((0..providers).map(|_| None).collect()),
            counters: Counters::define(),
            plain_header_names: !config.cgi_folds.is_empty()
                && names_are_plain(property(&PLAIN_HEADER_NAMES_PROPERTY).as_deref()),
            config,
        }));
        if !self.remotes.is_empty() {
            if let Err(e) = tollgate_common::host::set_tick_period_ms(TICK_MILLIS) {
                log::error!("cannot set the tick period for remote JWKS: host status {e}");
                return false;
            }
        }
        true
    }

    fn on_tick(&mut self) {
        let now = now_unix_secs();
        let mut newer = Vec::new();
        for state in &mut self.remotes {
            if let Some((_, body)) = state.document.tick(now) {
                newer.push((state.provider, body));
            }
        }
        for (provider, body) in newer {
            self.install(provider, &body);
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(JwtAuthHttp {
            shared: self.shared.clone(),
        }))
    }
}

struct JwtAuthHttp {
    shared: Option<Rc<Shared>>,
}

/// Removes every client copy of the headers this filter writes, so that no later filter (e.g. the
/// metrics filter's `on_log` on a refused request) reads a forged one.
fn strip_output_headers(config: &Config) {
    for h in &config.output_headers {
        set_request_header(h, None);
    }
}

/// The request's headers as this filter reads them: from one read of the whole list when the
/// filter must look at every name (`Config::cgi_folds`), else one host call per header asked.
/// The names need no look when the host vouches that no client's has an `_` or `.`
/// (`Shared::plain_header_names`: Tollgate's nginx module with nginx's defaults does; Envoy and
/// Kong's module do not).
enum Headers {
    List(HeaderList),
    Each,
}

impl Headers {
    /// `None` when the host cannot list the headers: then the filter cannot tell that no forged
    /// copy is left, and the request is refused (500, `headers_unavailable`).
    fn read(shared: &Shared) -> Option<Headers> {
        if shared.config.cgi_folds.is_empty() || shared.plain_header_names {
            return Some(Headers::Each);
        }
        match request_header_list() {
            Ok(list) => Some(Headers::List(list)),
            Err(status) => {
                log::error!(
                    "cannot read the request's headers (host status {status}); \
                     refusing the request"
                );
                count(shared.counters.headers_unavailable);
                strip_output_headers(&shared.config);
                signals::set(signals::JWT_AUTH_RESULT, "headers_unavailable");
                send_json_error(
                    500,
                    &[],
                    "internal_error",
                    "jwt-auth cannot read the request's headers",
                );
                None
            }
        }
    }

    /// A header's value as text (`tollgate_common::host::request_header`).
    fn get(&self, name: &str) -> Option<String> {
        match self {
            Headers::List(list) => list.first(name).map(|v| text(v.to_vec())),
            Headers::Each => request_header(name),
        }
    }

    /// Removes the client's copies of the headers this filter writes or removes under the other
    /// spellings a CGI-style upstream reads as them (`x_jwt_sub` for `x-jwt-sub`: README, "On
    /// success"), found in the list read when the request came in.
    fn strip_cgi_aliases(&self, config: &Config) {
        if let Headers::List(list) = self {
            for name in list.cgi_aliases(&config.cgi_folds) {
                // An alias folds to ASCII, so it is ASCII itself.
                if let Ok(name) = std::str::from_utf8(name) {
                    set_request_header(name, None);
                }
            }
        }
    }
}

impl JwtAuthHttp {
    fn deny(
        &self,
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
        signals::set(signals::JWT_AUTH_RESULT, reason.as_str());
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
}

impl JwtAuthHttp {
    fn verify_uncached(
        &self,
        shared: &Shared,
        token: &str,
        now: u64,
    ) -> Result<Rc<crate::verify::Verified>, Reason> {
        let remote = shared.remote_keys.borrow();
        verify(&shared.config, |i| shared.key_set(i, &remote), token, now).map(Rc::new)
    }
}

impl Context for JwtAuthHttp {}

impl HttpContext for JwtAuthHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> HostAction {
        let Some(shared) = self.shared.clone() else {
            log::error!("no configuration; refusing the request");
            send_json_error(500, &[], "internal_error", "jwt-auth is not configured");
            return HostAction::Pause;
        };
        let config = &shared.config;
        let needs = config.needs;
        let Some(headers) = Headers::read(&shared) else {
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
        let host = if needs.host {
            match canonical_host(authority.as_bytes()) {
                Ok(host) => host,
                Err(e) => {
                    count(shared.counters.invalid_authority);
                    strip_output_headers(config);
                    signals::set(signals::JWT_AUTH_RESULT, "invalid_authority");
                    refuse_authority("jwt-auth", e);
                    return HostAction::Pause;
                }
            }
        } else {
            Cow::Borrowed("")
        };
        let request_path = if needs.path {
            match config.request_path(target.as_bytes()) {
                Ok(p) => Some(p),
                Err(e) => {
                    count(shared.counters.invalid_path);
                    strip_output_headers(config);
                    signals::set(signals::JWT_AUTH_RESULT, "invalid_path");
                    refuse_path("jwt-auth", e);
                    return HostAction::Pause;
                }
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
            signals::set(signals::JWT_AUTH_RESULT, "bypass");
            if let Some(p) = &request_path {
                forward_normal_path(p);
            }
            return HostAction::Continue;
        };
        let Some(found) = extract(locations, |name| headers.get(name), query) else {
            return self.deny(&shared, &headers, Reason::MissingToken, &method, path);
        };
        let now = now_unix_secs();
        let location = found.location;
        let token = TokenKey::from(found.token);
        let cached = shared.cache.borrow_mut().get(&token, now);
        let verified = match cached {
            Some(v) => v,
            None => match self.verify_uncached(&shared, token.as_str(), now) {
                Ok(v) => {
                    shared.cache.borrow_mut().insert(token, &v);
                    v
                }
                Err(reason) => return self.deny(&shared, &headers, reason, &method, path),
            },
        };
        if let Err(reason) = authorize(config, action, &verified, now) {
            return self.deny(&shared, &headers, reason, &method, path);
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
        signals::set(signals::JWT_AUTH_RESULT, "ok");
        HostAction::Continue
    }
}
