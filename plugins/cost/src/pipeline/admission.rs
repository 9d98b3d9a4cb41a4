//! Phase 1, the request headers: the tenant and its spend, the budget check (locally, or on
//! the rate limit service in global mode, `on_error` when it gives no verdict), then the body
//! held to be read (`Request::admitted`).

use proxy_wasm::types::Action;
use tollgate_common::clock::UnixNanos;
use tollgate_common::host_calls::{
    count, keep_request_target, now_unix_millis, set_request_header,
};
use tollgate_common::prefetch::{HostReader, Prefetched, Read};
use tollgate_common::rls::{self, CallFailure, OnError};
use tollgate_common::shared_data::{HostSharedData, StoreError};

use crate::config::{StoreFullAction, UnknownModelAction};
use crate::global::{check_request, decide, Claim, Decision, Limits};
use crate::ledger::{BookStats, Budget, Exceeded, Lookup, OpenError, Spend, Standing};
use crate::month_windows;
use crate::period::Periods;
use crate::request::stream_usage_on_request;
use crate::unpriced_calls::{classify, starts_work, Target};
use crate::unreadable;
use crate::worker::{GlobalState, PhaseReads as R, Shared};

use super::{Check, Request, BUDGET_RESET_HEADER};

/// The request headers phase's values ([`crate::worker::PhaseReads::request`]).
type RequestValues<'a> = Prefetched<'a, HostReader, 5>;

/// The request's method, read only where it decides something.
const METHOD: Read<'static> = Read::RequestHeader(":method");

/// The proxy-wasm status of a store error.
fn status_of(e: StoreError) -> u32 {
    match e {
        StoreError::CasMismatch => tollgate_common::shared_data::status::CAS_MISMATCH,
        StoreError::Failed(status) => status,
    }
}

impl Request {
    /// The request headers phase.
    pub(crate) fn request_headers(&mut self, shared: &Shared, end_of_stream: bool) -> Action {
        let config = &shared.config;
        // The tenant and what `admitted` reads, in one host call where the host offers it.
        let values = shared.reads.request.fetch(HostReader);
        self.tenant = match config.tenant(&values) {
            Ok(tenant) => tenant,
            Err(e) => {
                log::info!("401 invalid_api_key: {e}");
                return self.refuse(
                    shared.counters.invalid_credential,
                    "invalid_credential",
                    (401, &[], "invalid_api_key", e.description()),
                );
            }
        };
        self.started = values.clock(R::CLOCK);
        let now_ms = self.started.map_or(0, UnixNanos::millis);
        let now = Periods::at(now_ms / 1_000);
        let budget = config.budget(&self.tenant);
        self.budgeted = budget.is_limited();
        self.note_token_limits(shared);
        let key = config.ledger.key(&self.tenant);
        let spend = self.read_spend(shared, &key, self.budgeted, now_ms, &now);
        self.ledger_key = Some(key);
        let spend = match spend {
            Ok(spend) => spend,
            Err(status) => {
                shared.store_failed(
                    &format!(
                        "tenant {}: ledger unavailable, request refused",
                        self.tenant
                    ),
                    status,
                );
                return self.ledger_unavailable(shared);
            }
        };
        self.spend = Some(spend);
        if let Some(g) = shared.global.as_ref().filter(|_| self.budgeted) {
            return self.check_global(shared, g, budget, &now, end_of_stream);
        }
        if let Some(exceeded) = budget.check(&spend, &now) {
            return self.over_budget(shared, exceeded);
        }
        self.admitted(shared, end_of_stream, Some(&values))
    }

    /// The tenant's spend for the budget check. A tenant with a budget (`limited`) and no record
    /// yet gets one now, before its request goes upstream; `Err(status)` when its spend cannot be
    /// known or its record cannot be created and `store_full` says refuse. A tenant without a
    /// budget is never refused for the ledger (its spend then goes to the overflow record).
    fn read_spend(
        &mut self,
        shared: &Shared,
        key: &str,
        limited: bool,
        now_ms: u64,
        now: &Periods,
    ) -> Result<Spend, u32> {
        let ledger = &shared.config.ledger;
        let lookup = match ledger.spend(&HostSharedData, key, now) {
            Ok(lookup) => lookup,
            Err(_) if !limited => return Ok(Spend::default()),
            Err(e) => return Err(status_of(e)),
        };
        match lookup {
            Lookup {
                standing: Standing::New,
                ..
            } if limited => {}
            Lookup { spend, record, .. } => {
                // Only a reservation starts from it (local mode, a budget).
                if limited && shared.global.is_none() {
                    self.ledger_read = record;
                }
                return Ok(spend);
            }
        }
        let mut stats = BookStats::default();
        let opened = ledger.open(&HostSharedData, key, now_ms, &mut stats);
        shared.counters.add(&stats);
        // The tenant shares the overflow record: `max_tenants` reached, or its record refused
        // and `store_full` pools it.
        match opened {
            Ok(Standing::Pooled) => {}
            Ok(_) => return Ok(Spend::default()),
            Err(OpenError::StoreFull(_))
                if shared.config.store_full.action == StoreFullAction::Pool => {}
            Err(OpenError::StoreFull(status) | OpenError::Failed(status)) => return Err(status),
        }
        ledger.pooled(&HostSharedData, now).map_err(status_of)
    }

    /// Refuses the request of a tenant whose budget is spent (either mode).
    pub(super) fn over_budget(&mut self, shared: &Shared, exceeded: Exceeded) -> Action {
        let reset = exceeded.reset_secs.to_string();
        let message = format!(
            "the {} budget of tenant {} is spent; it resets in {reset} s",
            exceeded.period, self.tenant
        );
        self.refuse(
            shared.counters.budget_exceeded,
            "budget_exceeded",
            (
                shared.config.over_budget_status,
                &[(BUDGET_RESET_HEADER, &reset), ("retry-after", &reset)],
                "budget_exceeded",
                &message,
            ),
        )
    }

    /// An admitted request: asks for an identity response and holds its body to read it.
    ///
    /// A tenant whose requests must be read (`must_read`: it has a budget or token limits, or `unknown_model`
    /// refuses an unpriced model for every tenant) has every request body read, whatever the
    /// method (an upstream may serve an LLM call sent as a PUT, or a GET with a body) and
    /// whatever `max_request_body_bytes` (0: none fits, refused with 413); its
    /// `content-encoding` and `content-type` are checked here (`unreadable::headers`), and its
    /// path (`crate::unpriced_calls`): a call that starts billable work the filter cannot price
    /// is refused here (the `:method` read only on such a path; a request without a body starts
    /// none: each of those endpoints requires body members), and a Responses call has its
    /// `background` looked at with the body. Other tenants have a POST's body read, when
    /// `max_request_body_bytes` is not 0, as before. `Continue`, or the refusal.
    /// `values`: the request headers phase's reads ([`crate::worker::PhaseReads`]) when this
    /// runs in that callback (else read here).
    pub(super) fn admitted(
        &mut self,
        shared: &Shared,
        end_of_stream: bool,
        values: Option<&RequestValues<'_>>,
    ) -> Action {
        let config = &shared.config;
        if config.identity_encoding {
            // The filter reads the response: ask for it uncompressed (RFC 9110 section 12.5.3).
            set_request_header("accept-encoding", Some("identity"));
        }
        if end_of_stream {
            return Action::Continue;
        }
        let fetched;
        let values = match values {
            Some(values) => values,
            None => {
                fetched = shared.reads.request.fetch(HostReader);
                &fetched
            }
        };
        self.must_read = self.budgeted
            || self.token_limited
            || (config.unknown_model.action == UnknownModelAction::Refuse
                && config.unknown_model.default_price.is_none());
        if self.must_read {
            self.unreadable_headers = unreadable::headers(
                values.get(R::CONTENT_ENCODING).as_deref(),
                values.get(R::CONTENT_TYPE).as_deref(),
            );
        } else if config.max_request_body_bytes == 0
            || values.value(METHOD).as_deref() != Some(b"POST")
        {
            return Action::Continue;
        }
        self.hold_request = true;
        let target = values.get(R::PATH);
        self.completions_path = target.as_deref().is_some_and(stream_usage_on_request);
        if self.must_read {
            match target.as_deref().map(classify) {
                Some(Target::Unpriced(endpoint))
                    if values.value(METHOD).as_deref().is_none_or(starts_work) =>
                {
                    if let Some(refused) = self.unpriced_call(shared, endpoint) {
                        return refused;
                    }
                }
                Some(Target::Responses) => self.responses_path = true,
                _ => {}
            }
        }
        // For a refusal from the body, which has no request headers in Envoy (the envelope).
        if let Some(target) = target {
            keep_request_target(target.into_owned());
        }
        if config.add_stream_usage && self.completions_path {
            // The body may be rewritten: the host frames it anew (chunked in Envoy, from
            // the new length in nginx).
            set_request_header("content-length", None);
        }
        Action::Continue
    }

    /// Global mode: asks the rate limit service whether the tenant's budgets are spent, the
    /// request paused until the reply (`on_grpc_call_response`); `on_error` at once when the
    /// breaker is open or the host refuses the call.
    fn check_global(
        &mut self,
        shared: &Shared,
        g: &GlobalState,
        budget: Budget,
        now: &Periods,
        end_of_stream: bool,
    ) -> Action {
        let limits = Limits::of(&g.config, &budget);
        let Some(request) = check_request(
            &g.call.config().domain,
            shared.config.ledger.name(),
            &self.tenant,
            &limits,
            now,
        ) else {
            return self.admitted(shared, end_of_stream, None);
        };
        if !g.call.admits() {
            let failure = CallFailure::BreakerOpen;
            return self.global_fallback(shared, g, budget, end_of_stream, &failure);
        }
        if limits.month.is_some() {
            // A month counter to make exact before the other's window ends: asked once per
            // worker, claimed and carried by the root context (`crate::month_windows`); the
            // tenants checked before the carry is due are asked by the root context's tick.
            let mut claims = g.claims.borrow_mut();
            claims.seen(&self.tenant, now.month);
            if let Some(carry) = month_windows::carry_due(now.month, now.secs) {
                let claim = Claim {
                    tenant: self.tenant.clone(),
                    month: now.month,
                    carry,
                };
                if claims.ask(claim) {
                    drop(claims);
                    shared.wake_root(g);
                }
            }
        }
        match g.call.dispatch(&request) {
            Ok(token) => {
                self.check = Some(Check {
                    token,
                    periods: limits.periods(now.month),
                    budget,
                    end_of_stream,
                });
                Action::Pause
            }
            Err(failure) => self.global_fallback(shared, g, budget, end_of_stream, &failure),
        }
    }

    /// The check gave no verdict: counted, logged once per interval, then `on_error`: `local`
    /// (the local ledger's spend read at the request headers decides), `allow`, or `deny` (503,
    /// `retry-after: 1`, `{"error":"budget_unavailable"}`).
    fn global_fallback(
        &mut self,
        shared: &Shared,
        g: &GlobalState,
        budget: Budget,
        end_of_stream: bool,
        failure: &CallFailure,
    ) -> Action {
        let c = &shared.counters;
        match g.call.fall_back(failure) {
            OnError::Local => {
                let now = Periods::at(now_unix_millis() / 1_000);
                let spend = self.spend.unwrap_or_default();
                if let Some(exceeded) = budget.check(&spend, &now) {
                    return self.over_budget(shared, exceeded);
                }
            }
            OnError::Allow => {}
            OnError::Deny => {
                return self.refuse(
                    c.global_unavailable,
                    "global_unavailable",
                    (
                        503,
                        &[("retry-after", "1")],
                        "budget_unavailable",
                        "the budget service is unavailable; retry later",
                    ),
                );
            }
        }
        self.admitted(shared, end_of_stream, None)
    }

    /// The reply (or failure) of the global check: refuse, or resume the request.
    pub(crate) fn check_reply(
        &mut self,
        shared: &Shared,
        token_id: u32,
        status_code: u32,
        response_size: usize,
    ) {
        if self.token_check_reply(shared, token_id, status_code, response_size) {
            return;
        }
        let Some(check) = self.check.take_if(|c| c.token == token_id) else {
            return;
        };
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        let reply = g
            .call
            .reply(status_code, response_size, check.periods.len());
        let action = match reply {
            Ok(verdict) => {
                let now = Periods::at(now_unix_millis() / 1_000);
                // This worker's bookings of the tenant the service has not counted yet.
                let pending = g.outbox.borrow().pending(&self.tenant, &now);
                match decide(&check.periods, &verdict, &now, 0, &pending) {
                    Decision::Admit => {
                        count(shared.counters.global_admitted);
                        self.admitted(shared, check.end_of_stream, None)
                    }
                    Decision::Refuse(exceeded) => {
                        count(shared.counters.global_refused);
                        self.over_budget(shared, exceeded)
                    }
                }
            }
            Err(failure) => {
                self.global_fallback(shared, g, check.budget, check.end_of_stream, &failure)
            }
        };
        if matches!(action, Action::Continue) {
            if let Err(status) = rls::host_calls::resume_request() {
                log::warn!(
                    "cannot resume the request after the global check: host status {status}"
                );
            }
        }
    }
}
