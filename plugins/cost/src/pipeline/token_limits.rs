//! Token limits' hooks in a request (`crate::token_limits`; README, "Token limits"): at the end
//! of the request body (the model known), the windows of the limits that apply are read and a
//! spent one refuses the request before the upstream (429 with the RateLimit fields and
//! Retry-After); when the response is complete, its usage is added to each of those windows.
//! In global mode (`token_limits.global`) the service's windows decide: the request is paused
//! for one `ShouldRateLimit` call, and the usage is also booked there by the root context.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{add_response_header, count, count_n, now_unix_millis};
use tollgate_common::rls::{self, CallFailure, OnError};
use tollgate_common::shared_data::{HostSharedData, StoreError};

use crate::charge::Exchange;
use crate::token_limits::config::Limit;
use crate::token_limits::counted::counted;
use crate::token_limits::gate::{decide, fields, Reading, Refusal};
use crate::token_limits::global as token_global;
use crate::token_limits::window::Window;
use crate::unpriced::Reason;
use crate::usage::Usage;
use crate::worker::{GlobalState, Shared};

use super::{Request, TokenCheck};

/// Status of a refusal for a spent window (RFC 6585 section 4).
pub(crate) const TOKEN_LIMITED_STATUS: u32 = 429;

/// The windows of `tenant`'s limits that apply to `model`, read at `now_ms`, and their keys.
fn read_windows<'a>(
    shared: &'a Shared,
    tenant: &str,
    model: Option<&str>,
    now_ms: u64,
) -> Result<(Vec<Reading<'a>>, Vec<String>), StoreError> {
    let config = &shared.config;
    let store = &config.token_store;
    let mut readings = Vec::new();
    let mut keys = Vec::new();
    for limit in config
        .token_limits
        .of(tenant)
        .iter()
        .filter(|l| l.applies_to(model))
    {
        let window = Window::at(limit.per, now_ms);
        let key = store.key(tenant, limit);
        let used = store.used(&HostSharedData, &key, limit.per, &window)?;
        readings.push(Reading {
            limit,
            used: used.tokens,
            window,
        });
        keys.push(key);
    }
    Ok((readings, keys))
}

impl Request {
    /// Phase 1: whether the tenant has token limits (its request bodies are then read).
    pub(super) fn note_token_limits(&mut self, shared: &Shared) {
        self.token_limited = !shared.config.token_limits.of(&self.tenant).is_empty();
    }

    /// Phase 2, once the body's model is known: the token limits, then the reservation
    /// (`declared`: the request's output bound). `Some(action)` when the request is refused, or
    /// paused for the global check (its reply continues: `token_check_reply`).
    pub(super) fn admit_body(&mut self, shared: &Shared, declared: Option<u64>) -> Option<Action> {
        // Local counts first: they also give the keys the usage is added to (and what
        // `on_error: local` decides with); a window spent here is spent on the service too.
        if let Some(refused) = self.admit_tokens(shared, 0) {
            return Some(refused);
        }
        if let (true, true, Some(g)) = (
            self.token_limited,
            shared.config.token_limits.global,
            shared.global.as_ref(),
        ) {
            let applying = self.applying_limits(shared);
            let request = token_global::check_request(
                &g.call.config().domain,
                shared.config.ledger.name(),
                &self.tenant,
                &applying,
            );
            if let Some(request) = request {
                if !g.call.admits() {
                    return self.token_fallback(shared, g, declared, &CallFailure::BreakerOpen);
                }
                return match g.call.dispatch(&request) {
                    Ok(token) => {
                        self.token_check = Some(TokenCheck {
                            token,
                            descriptors: request.descriptors.len(),
                            declared,
                        });
                        Some(Action::Pause)
                    }
                    Err(failure) => self.token_fallback(shared, g, declared, &failure),
                };
            }
        }
        self.reserve(shared, declared)
    }

    /// The tenant's limits that apply to the request's model.
    fn applying_limits<'a>(&self, shared: &'a Shared) -> Vec<&'a Limit> {
        let model = self.request_model.as_deref();
        shared
            .config
            .token_limits
            .of(&self.tenant)
            .iter()
            .filter(|l| l.applies_to(model))
            .collect()
    }

    /// The global token check gave no verdict: `on_error` of the `global` block: `local` (the
    /// local counts, read before the call, admitted the request) and `allow` go on to the
    /// reservation; `deny` refuses (503, `retry-after: 1`, `token_limit_unavailable`).
    fn token_fallback(
        &mut self,
        shared: &Shared,
        g: &GlobalState,
        declared: Option<u64>,
        failure: &CallFailure,
    ) -> Option<Action> {
        match g.call.fall_back(failure) {
            OnError::Local | OnError::Allow => self.reserve(shared, declared),
            OnError::Deny => Some(self.refuse(
                shared.counters.global_unavailable,
                "global_unavailable",
                (
                    503,
                    &[("retry-after", "1")],
                    "token_limit_unavailable",
                    "the token limit service is unavailable; retry later",
                ),
            )),
        }
    }

    /// The reply (or failure) of the global token check: refuse, or go on to the reservation
    /// and resume the request. Whether `token_id` was this check's.
    pub(crate) fn token_check_reply(
        &mut self,
        shared: &Shared,
        token_id: u32,
        status_code: u32,
        response_size: usize,
    ) -> bool {
        let Some(check) = self.token_check.take_if(|c| c.token == token_id) else {
            return false;
        };
        let Some(g) = shared.global.as_ref() else {
            return true;
        };
        let outcome = match g.call.reply(status_code, response_size, check.descriptors) {
            Ok(verdict) => {
                let applying = self.applying_limits(shared);
                let readings = token_global::readings(&applying, &verdict, now_unix_millis());
                match decide(&readings, 0) {
                    None => {
                        count(shared.counters.global_admitted);
                        if !readings.is_empty() {
                            self.token_headers = Some(fields(&readings));
                        }
                        self.reserve(shared, check.declared)
                    }
                    Some(refusal) => {
                        count(shared.counters.global_refused);
                        Some(self.token_limited(shared, &refusal))
                    }
                }
            }
            Err(failure) => self.token_fallback(shared, g, check.declared, &failure),
        };
        if outcome.is_none() {
            if let Err(status) = rls::host_calls::resume_request() {
                log::warn!("cannot resume the request after the token check: host status {status}");
            }
        }
        true
    }

    /// The 429 of a spent window, with its RateLimit fields and Retry-After.
    fn token_limited(&mut self, shared: &Shared, refusal: &Refusal) -> Action {
        self.refuse(
            shared.counters.token_limited,
            "token_limited",
            (
                TOKEN_LIMITED_STATUS,
                &[
                    ("retry-after", &refusal.retry_after),
                    ("ratelimit-policy", &refusal.policy),
                    ("ratelimit", &refusal.ratelimit),
                ],
                "token_limit_exceeded",
                &refusal.message,
            ),
        )
    }

    /// Admits the request against the token limits that apply to it if each of their windows
    /// has room for `estimate` weighted tokens (0 today: then a window refuses only once it is
    /// spent; reservations will pass their estimate here). A count that cannot be read refuses
    /// (fail closed) with `store_full.status` and `retry-after: 1`.
    pub(crate) fn admit_tokens(&mut self, shared: &Shared, estimate: u64) -> Option<Action> {
        if !self.token_limited {
            return None;
        }
        let now_ms = now_unix_millis();
        let read = read_windows(shared, &self.tenant, self.request_model.as_deref(), now_ms);
        let (readings, keys) = match read {
            Ok(read) => read,
            Err(e) => {
                let status = match e {
                    StoreError::CasMismatch => tollgate_common::shared_data::status::CAS_MISMATCH,
                    StoreError::Failed(status) => status,
                };
                shared.store_failed(
                    &format!(
                        "tenant {}: token counts unavailable, request refused",
                        self.tenant
                    ),
                    status,
                );
                return Some(self.refuse(
                    shared.counters.store_failure,
                    "store_failure",
                    (
                        shared.config.store_full.status,
                        &[("retry-after", "1")],
                        "token_limit_unavailable",
                        "the token counts of this tenant cannot be read; retry later",
                    ),
                ));
            }
        };
        let Some(refusal) = decide(&readings, estimate) else {
            if !readings.is_empty() {
                self.token_headers = Some(fields(&readings));
            }
            self.token_keys = Some(keys);
            return None;
        };
        Some(self.token_limited(shared, &refusal))
    }

    /// Phase 3: the RateLimit fields read at admission, on the response.
    pub(super) fn token_limit_headers(&self) {
        if let Some((policy, ratelimit)) = &self.token_headers {
            add_response_header("ratelimit-policy", policy);
            add_response_header("ratelimit", ratelimit);
        }
    }

    /// Phase 4: adds what the response counts (`outcome`'s usage, or the byte estimate) to the
    /// window of each limit checked at admission, one CAS update per limit (a request that was
    /// not checked, without a body, counts nothing).
    pub(super) fn book_tokens(
        &self,
        shared: &Shared,
        outcome: &Result<Usage, Reason>,
        exchange: &Exchange<'_>,
    ) {
        let Some(keys) = &self.token_keys else {
            return;
        };
        let config = &shared.config;
        let Some(usage) = counted(outcome, exchange, config.unpriced_charge) else {
            return;
        };
        let now_ms = now_unix_millis();
        let model = self.request_model.as_deref();
        let store = &config.token_store;
        let applying = config
            .token_limits
            .of(&self.tenant)
            .iter()
            .filter(|l| l.applies_to(model));
        for (limit, key) in applying.zip(keys) {
            let tokens = limit.weights.weighted(&usage);
            if tokens == 0 {
                continue;
            }
            let stats = match store.add(&HostSharedData, key, limit.per, now_ms, tokens) {
                Ok(stats) => stats,
                Err(not) => {
                    count(shared.counters.token_booking_failures);
                    let why = not.failed.map_or_else(
                        || "CAS retries exhausted".to_string(),
                        |s| format!("host status {s}"),
                    );
                    shared.store_failed(
                        &format!(
                            "tenant {}: {tokens} tokens not counted in limit {} ({why})",
                            self.tenant, limit.name
                        ),
                        not.failed.unwrap_or(0),
                    );
                    not.stats
                }
            };
            count_n(shared.counters.cas_retries, u64::from(stats.cas_retries));
            count_n(shared.counters.token_keys_created, u64::from(stats.created));
            count_n(shared.counters.token_overflow, u64::from(stats.overflowed));
            if let (true, Some(g)) = (config.token_limits.global, shared.global.as_ref()) {
                self.book_global_tokens(shared, g, limit, now_ms, tokens);
            }
        }
    }

    /// Global mode: `tokens` of `limit`'s window queued for the service (sent by the root
    /// context; dropped, counted and logged, when the outbox is full).
    fn book_global_tokens(
        &self,
        shared: &Shared,
        g: &GlobalState,
        limit: &Limit,
        now_ms: u64,
        tokens: u64,
    ) {
        let Some(booking) = token_global::booking(&self.tenant, limit, now_ms, tokens) else {
            return;
        };
        if g.outbox.borrow_mut().push(booking) {
            shared.wake_root(g);
        } else {
            count(shared.counters.global_dropped);
            shared.dropped(&format!(
                "tenant {}: {tokens} tokens of limit {} dropped: the outbox is full",
                self.tenant, limit.name
            ));
        }
    }
}
