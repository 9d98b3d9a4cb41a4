//! Token limits' hooks in a request (`crate::token_limits`; README, "Token limits"): at the end
//! of the request body (the model known), the windows of the limits that apply are read and a
//! spent one refuses the request before the upstream (429 with the RateLimit fields and
//! Retry-After); when the response is complete, its usage is added to each of those windows.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{add_response_header, count, count_n, now_unix_millis};
use tollgate_common::shared_data::{HostSharedData, StoreError};

use crate::charge::Exchange;
use crate::token_limits::counted::counted;
use crate::token_limits::gate::{decide, fields, Reading};
use crate::token_limits::window::Window;
use crate::unpriced::Reason;
use crate::usage::Usage;
use crate::worker::Shared;

use super::Request;

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

    /// Phase 2, once the body's model is known: `Some(action)` when the request is refused.
    pub(super) fn check_token_limits(&mut self, shared: &Shared) -> Option<Action> {
        self.admit_tokens(shared, 0)
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
        Some(self.refuse(
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
        ))
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
        }
    }
}
