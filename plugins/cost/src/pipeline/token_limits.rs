//! Token limits' hooks in a request (`crate::token_limits`; README, "Token limits"): at the end
//! of the request body (the model known), the windows of the limits that apply are read and a
//! spent one refuses the request before the upstream (429 with the RateLimit fields and
//! Retry-After); when the response is complete, its usage is added to each of those windows.
//! In global mode (`token_limits.global`) the service's windows decide: the request is paused
//! for one `ShouldRateLimit` call, and the usage is also booked there by the root context.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{add_response_header, count, count_n, now_unix_millis};
use tollgate_common::rls::{self, CallFailure, OnError};
use tollgate_common::shared_data::HostSharedData;

use crate::charge::Exchange;
use crate::reservation::output_tokens;
use crate::token_limits::config::Limit;
use crate::token_limits::counted::counted;
use crate::token_limits::gate::{decide, fields, Reading, Refusal};
use crate::token_limits::global as token_global;
use crate::token_limits::store::NotAdded;
use crate::token_limits::window::{TokenHold, Window};
use crate::unpriced::Reason;
use crate::usage::Usage;
use crate::worker::{GlobalState, Shared};

use super::{Request, TokenCheck};

/// Status of a refusal for a spent window (RFC 6585 section 4).
pub(crate) const TOKEN_LIMITED_STATUS: u32 = 429;

/// What the admission did in the windows of the limits that apply: each one's reading
/// (counted plus reserved by other requests), key and hold, in the tenant's order.
struct Admitted<'a> {
    readings: Vec<Reading<'a>>,
    keys: Vec<String>,
    holds: Vec<Option<TokenHold>>,
}

/// The windows of `tenant`'s limits that apply to `model` at `now_ms`: in each, `bound`
/// (input, output tokens) weighted by the limit is reserved unless the window is spent
/// (`TokenStore::reserve`: one CAS update). A window that cannot be read or written stops here
/// (its error; the holds taken so far are in `done` for the caller to release).
fn reserve_windows<'a>(
    shared: &'a Shared,
    tenant: &str,
    model: Option<&str>,
    (now_ms, bound): (u64, (u64, u64)),
    done: &mut Admitted<'a>,
) -> Result<(), NotAdded> {
    let config = &shared.config;
    let store = &config.token_store;
    for limit in config.token_limits.applying(tenant, model) {
        let key = store.key(tenant, limit);
        let estimate = limit.weights.bound(bound.0, bound.1);
        let (used, hold, stats) = store.reserve(
            &HostSharedData,
            &key,
            (limit.per, limit.tokens),
            now_ms,
            estimate,
        )?;
        count_n(shared.counters.cas_retries, u64::from(stats.cas_retries));
        count_n(shared.counters.token_keys_created, u64::from(stats.created));
        done.readings.push(Reading {
            limit,
            used: used.tokens.saturating_add(used.reserved),
            window: Window::at(limit.per, now_ms),
        });
        done.keys.push(key);
        done.holds.push(hold);
    }
    Ok(())
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
        if let Some(refused) = self.admit_tokens(shared, declared) {
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
                    let action =
                        self.token_fallback(shared, g, declared, &CallFailure::BreakerOpen);
                    return self.after_tokens(shared, action);
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
                    Err(failure) => {
                        let action = self.token_fallback(shared, g, declared, &failure);
                        self.after_tokens(shared, action)
                    }
                };
            }
        }
        let action = self.reserve(shared, declared);
        self.after_tokens(shared, action)
    }

    /// The tenant's limits that apply to the request's model.
    fn applying_limits<'a>(&self, shared: &'a Shared) -> Vec<&'a Limit> {
        let model = self.request_model.as_deref();
        shared
            .config
            .token_limits
            .applying(&self.tenant, model)
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
                match decide(&readings) {
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
        let outcome = self.after_tokens(shared, outcome);
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

    /// Admits the request against the token limits that apply to it and reserves its bound in
    /// each window (README, "Token limits", "Reservations"): input tokens at most the body's
    /// bytes, output tokens the declared bound (`declared`), else the model's, else
    /// `reservation.default_max_output_tokens`, each at the limit's highest weight. Refused when a
    /// window is spent, counting other requests' reservations (counted + reserved ≥ `tokens`);
    /// the holds are released by the booking, or at once when the request is refused. A count
    /// that cannot be read or written refuses (fail closed) with `store_full.status` and
    /// `retry-after: 1`.
    pub(crate) fn admit_tokens(
        &mut self,
        shared: &Shared,
        declared: Option<u64>,
    ) -> Option<Action> {
        if !self.token_limited {
            return None;
        }
        let config = &shared.config;
        let table = shared.table();
        let model = self.request_model.as_deref();
        let model_max = model
            .and_then(|m| config.price(&table, Some(m)))
            .and_then(|p| p.max_output_tokens);
        let output = output_tokens(
            declared,
            model_max,
            config.reservation.default_max_output_tokens,
        );
        let now_ms = now_unix_millis();
        let mut done = Admitted {
            readings: Vec::new(),
            keys: Vec::new(),
            holds: Vec::new(),
        };
        let bound = (self.request_bytes, output);
        let reserved = reserve_windows(shared, &self.tenant, model, (now_ms, bound), &mut done);
        let Admitted {
            readings,
            keys,
            holds,
        } = done;
        self.token_keys = Some(keys);
        self.token_holds = holds;
        if let Err(not) = reserved {
            self.release_tokens(shared);
            shared.store_failed(
                &format!(
                    "tenant {}: token counts unavailable, request refused",
                    self.tenant
                ),
                not.failed
                    .unwrap_or(tollgate_common::shared_data::status::CAS_MISMATCH),
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
        let Some(refusal) = decide(&readings) else {
            if !readings.is_empty() {
                self.token_headers = Some(fields(&readings));
            }
            return None;
        };
        self.release_tokens(shared);
        Some(self.token_limited(shared, &refusal))
    }

    /// `refused` (a step after the token admission: the global check, the budget's
    /// reservation), with the token reservations released when it is a refusal.
    fn after_tokens(&mut self, shared: &Shared, refused: Option<Action>) -> Option<Action> {
        if matches!(refused, Some(Action::Pause)) && self.token_check.is_none() {
            self.release_tokens(shared);
        }
        refused
    }

    /// Releases the token reservations of a request that will book nothing (refused, or ended
    /// without usage): one CAS update per hold.
    pub(super) fn release_tokens(&mut self, shared: &Shared) {
        let holds = std::mem::take(&mut self.token_holds);
        if let Some(keys) = self.token_keys.take() {
            self.release_holds(shared, &keys, holds);
        }
    }

    /// Releases `holds` (in `keys`' windows, the order of the limits that apply).
    fn release_holds(&self, shared: &Shared, keys: &[String], holds: Vec<Option<TokenHold>>) {
        if holds.iter().all(Option::is_none) {
            return;
        }
        let config = &shared.config;
        let model = self.request_model.as_deref();
        let applying = config.token_limits.applying(&self.tenant, model);
        let now_ms = now_unix_millis();
        for ((limit, key), hold) in applying.zip(keys).zip(holds) {
            if hold.is_none() {
                continue;
            }
            let store = &config.token_store;
            if let Err(not) = store.add(&HostSharedData, key, limit.per, now_ms, (0, hold)) {
                count(shared.counters.token_booking_failures);
                shared.store_failed(
                    &format!(
                        "tenant {}: a reservation of limit {} not released (it expires with its \
                         window)",
                        self.tenant, limit.name
                    ),
                    not.failed.unwrap_or(0),
                );
            }
        }
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
        (outcome, exchange): (&Result<Usage, Reason>, &Exchange<'_>),
        holds: Vec<Option<TokenHold>>,
    ) {
        let Some(keys) = &self.token_keys else {
            return;
        };
        let config = &shared.config;
        let Some(usage) = counted(outcome, exchange, config.unpriced_charge) else {
            self.release_holds(shared, keys, holds);
            return;
        };
        let now_ms = now_unix_millis();
        let model = self.request_model.as_deref();
        let store = &config.token_store;
        let applying = config.token_limits.applying(&self.tenant, model);
        let holds = holds.into_iter().chain(std::iter::repeat(None));
        for ((limit, key), hold) in applying.zip(keys).zip(holds) {
            let tokens = limit.weights.weighted(&usage);
            if tokens == 0 && hold.is_none() {
                continue;
            }
            let stats = match store.add(&HostSharedData, key, limit.per, now_ms, (tokens, hold)) {
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
