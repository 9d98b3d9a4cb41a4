//! One request through rate-limit (wasm32): the request stage (the path's normal form and
//! the canonical host, `tollgate_common::skeleton::request_stage`), the first matching rule,
//! its weight and client key, then its limits checked in shared data (local mode) or asked of
//! the rate limit service (global mode, `on_error` when it gives no verdict).

use std::borrow::Cow;

use proxy_wasm::types::Action;
use smallvec::SmallVec;
use tollgate_common::host_calls::{forward_normal_path, now_unix_millis, send_json_error};
use tollgate_common::identity::IdentityView;
use tollgate_common::rls::{self, CallFailure, OnError};
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::skeleton::request_stage::first_match;

use crate::answer::{decide, decided, refuse};
use crate::config::{MissingKey, Rule};
use crate::headers::RETRY_AFTER;
use crate::key::{client_key, shared_key};
use crate::limiter::{check, Settings, Target, INLINE_LIMITS};
use crate::request_view::HostRequest;
use crate::worker::Shared;

/// One request's state.
#[derive(Default)]
pub(crate) struct Request {
    /// For allowed requests with `headers_on_allowed`: the rule and the RateLimit value.
    pub(crate) response_headers: Option<(usize, String)>,
    /// A global rule's call in flight, the request paused.
    pub(crate) pending: Option<Pending>,
}

/// A `ShouldRateLimit` call in flight for this request.
pub(crate) struct Pending {
    token: u32,
    /// The rule's index.
    index: usize,
    /// The client key (`None`: missing, shared bucket), for the local fallback.
    client: Option<String>,
    weight: u64,
}

impl Request {
    fn limit(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        req: &HostRequest<'_>,
    ) -> Action {
        let config = &shared.config;
        let Some(counters) = shared.counters.get(index) else {
            return Action::Continue;
        };
        let weight = match &rule.weight_header {
            None => 1,
            Some(name) => match rule.weight(req.header(name).as_deref()) {
                Some(w) => w,
                None => {
                    decided(counters.invalid_weight, "invalid_weight", &rule.name);
                    let message = format!(
                        "header {name} must be a whole number of cost units from 1 to {}",
                        rule.max_weight
                    );
                    return refuse(400, &[], "invalid_weight", &message);
                }
            },
        };
        let client = match client_key(&rule.key, req) {
            Ok(client) => client,
            Err(e) => {
                decided(
                    counters.invalid_credential,
                    "invalid_credential",
                    &rule.name,
                );
                log::info!("rule {}: 401 invalid_credential: {e}", rule.name);
                return refuse(401, &[], "invalid_credential", e.description());
            }
        };
        if client.is_none() {
            match rule.missing_key {
                MissingKey::Deny => {
                    decided(
                        counters.missing_key_denied,
                        "missing_key_denied",
                        &rule.name,
                    );
                    log::debug!("rule {}: request without its key", rule.name);
                    let message = format!(
                        "the request lacks what rate-limit rule {} is keyed by",
                        rule.name
                    );
                    return refuse(config.status, &[], "rate_limit_key_missing", &message);
                }
                MissingKey::Allow => {
                    decided(
                        counters.missing_key_allowed,
                        "missing_key_allowed",
                        &rule.name,
                    );
                    return Action::Continue;
                }
                MissingKey::Shared => {}
            }
        }
        match &rule.global {
            Some(_) => self.global(shared, index, rule, client, weight),
            None => self.local(shared, index, rule, client, weight, req.now_unix_millis()),
        }
    }

    /// Checks and charges the request in shared data (local mode, and global mode's
    /// `on_error: local`) at Unix time `now_ms`.
    fn local(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
        now_ms: u64,
    ) -> Action {
        let config = &shared.config;
        let Some(counters) = shared.counters.get(index) else {
            return Action::Continue;
        };
        let mut targets: SmallVec<[Target<'_>; INLINE_LIMITS]> = rule
            .limits
            .iter()
            .map(|l| Target {
                limit: &l.limit,
                key: match &client {
                    Some(c) => shared_key(&l.key_prefix, c),
                    None => l.missing_key.clone(),
                },
                overflow_key: &l.overflow_key,
                counted: client.is_some(),
            })
            .collect();
        let settings = Settings {
            record_key: &rule.record_key,
            cas_retries: config.cas_retries,
            on_contention: config.on_contention,
            max_keys: rule.max_keys,
            store_full: config.store_full.action.limiter(),
        };
        let report = check(&HostSharedData, &settings, &mut targets, now_ms, weight);
        counters.add_stats(&report.stats);
        decide(
            shared,
            index,
            rule,
            report.verdict,
            &mut self.response_headers,
        )
    }

    /// Asks the rule's rate limit service (global mode): pauses the request until the reply
    /// (`Request::reply`), or applies `on_error` at once when the breaker is open or the host
    /// refuses the call.
    fn global(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
    ) -> Action {
        let Some(state) = shared.global.get(index).and_then(Option::as_ref) else {
            return self.local(shared, index, rule, client, weight, now_unix_millis());
        };
        if !state.call.admits() {
            let failure = CallFailure::BreakerOpen;
            return self.fallback(shared, index, rule, client, weight, &failure);
        }
        let g = state.call.config();
        let request = crate::global::request(rule, &g.domain, client.as_deref(), weight);
        match state.call.dispatch(&request) {
            Ok(token) => {
                self.pending = Some(Pending {
                    token,
                    index,
                    client,
                    weight,
                });
                Action::Pause
            }
            Err(failure) => self.fallback(shared, index, rule, client, weight, &failure),
        }
    }

    /// The request of a call that gave no verdict gets the rule's `on_error` (counted and
    /// logged by the skeleton's `GlobalCall::fall_back`).
    fn fallback(
        &mut self,
        shared: &Shared,
        index: usize,
        rule: &Rule,
        client: Option<String>,
        weight: u64,
        failure: &CallFailure,
    ) -> Action {
        let state = shared.global.get(index).and_then(Option::as_ref);
        let policy = state.map_or(OnError::Local, |s| s.call.fall_back(failure));
        let counters = state.map(|s| &s.counters);
        match policy {
            OnError::Local => self.local(shared, index, rule, client, weight, now_unix_millis()),
            OnError::Allow => {
                let counter = counters.and_then(|c| c.error_allowed);
                decided(counter, "global_error_allowed", &rule.name);
                Action::Continue
            }
            OnError::Deny => {
                let counter = counters.and_then(|c| c.error_denied);
                decided(counter, "global_error_denied", &rule.name);
                refuse(
                    503,
                    &[(RETRY_AFTER, "1")],
                    "rate_limit_unavailable",
                    "the rate limit service is unavailable; retry later",
                )
            }
        }
    }

    /// The reply (or failure) of the global rule's call: decide, then resume the request unless
    /// it was answered here.
    pub(crate) fn reply(
        &mut self,
        shared: &Shared,
        token: u32,
        status_code: u32,
        response_size: usize,
    ) {
        let Some(pending) = self.pending.take_if(|p| p.token == token) else {
            return;
        };
        // A call is only made with a rule: it exists here. Should it not, the paused request is
        // refused rather than left hanging.
        let (Some(rule), Some(state)) = (
            shared.config.rules.get(pending.index),
            shared.global.get(pending.index).and_then(Option::as_ref),
        ) else {
            send_json_error(
                500,
                &[],
                "internal_error",
                "rate-limit lost the request's rule",
            );
            return;
        };
        let reply = state
            .call
            .reply(status_code, response_size, rule.limits.len());
        let Pending {
            index,
            client,
            weight,
            ..
        } = pending;
        let action = match reply {
            Ok(verdict) => {
                let verdict = crate::global::verdict(&verdict);
                decide(shared, index, rule, verdict, &mut self.response_headers)
            }
            Err(failure) => self.fallback(shared, index, rule, client, weight, &failure),
        };
        if action == Action::Continue {
            if let Err(status) = rls::host_calls::resume_request() {
                log::error!("cannot resume the request (host status {status})");
            }
        }
    }

    /// The request headers phase: the request stage, the first matching rule, its limits.
    pub(crate) fn headers(&mut self, shared: &Shared) -> Action {
        let mut req = HostRequest::new(&shared.request_reads);
        if shared.config.needs_path {
            let target = req.target();
            let Some(p) = shared.stage.path(&target, &shared.config.paths, || {}) else {
                return Action::Pause;
            };
            forward_normal_path(&p);
            let path = match p.path {
                Cow::Owned(normal) => normal.into_bytes(),
                Cow::Borrowed(path) => path.as_bytes().to_vec(),
            };
            req.path = Some(path);
        }
        if shared.config.needs_host {
            let authority = req.authority();
            let Some(host) = shared.stage.host(&authority, || {}) else {
                return Action::Pause;
            };
            let host = host.into_owned();
            req.host = Some(host);
        }
        let Some((index, rule)) = first_match(&shared.config.rules, |r| r.matches(&req)) else {
            return Action::Continue;
        };
        self.limit(shared, index, rule, &req)
    }
}
