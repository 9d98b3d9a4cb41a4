//! Phase 4, the booking: once the response is complete for the client (or the stream ended
//! without that), what it is charged (`crate::charge`) booked in the ledger and, in global
//! mode, queued for the rate limit service; the outcome published (`tollgate_common::signals`)
//! for the metrics filter and access logs. Also the refusal before the upstream, which
//! publishes its outcome the same way.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{count, now_unix_millis, send_json_error};
use tollgate_common::logfmt::Line;
use tollgate_common::shared_data::HostSharedData;
use tollgate_common::signals::{self, field};

use crate::charge::{charge, Charge, Exchange};
use crate::global::{Booking, Limits, OUTBOX_MAX};
use crate::period::Periods;
use crate::worker::Shared;

use super::Request;

impl Request {
    /// Books and publishes the outcome of the response (once).
    pub(crate) fn finish(&mut self, shared: &Shared) {
        self.finish_at(shared, None);
    }

    /// [`Request::finish`], with the host clock already read in this callback (Unix
    /// milliseconds), if it was.
    pub(crate) fn finish_at(&mut self, shared: &Shared, clock_ms: Option<u64>) {
        if self.done {
            return;
        }
        self.done = true;
        let token_holds = std::mem::take(&mut self.token_holds);
        let config = &shared.config;
        let table = shared.table();
        let request_model = self.request_model.as_deref();
        let outcome = self.response.outcome(request_model);
        // Only a stream without its final usage is looked at again (the common case is not).
        let partial = match outcome {
            Err(_) => self.response.partial(request_model),
            Ok(_) => None,
        };
        let exchange = Exchange {
            request_model,
            // What providers bill: a 2xx answer to a request that named a model.
            llm_call: self.success && self.request_model.is_some(),
            request_bytes: self.request_bytes,
            response_bytes: self.response.bytes(),
            partial: partial.as_ref(),
        };
        self.book_tokens(shared, (&outcome, &exchange), token_holds);
        let (nano, status, usage) = match charge(config, &table, outcome, &exchange) {
            Charge::Priced { usage, nano } => {
                count(shared.counters.priced);
                (nano, "priced", Some(usage))
            }
            Charge::Unpriced { reason } => {
                if let Some(reason) = reason {
                    count(shared.counters.unpriced_reasons.id(reason));
                    self.log_unpriced(shared, reason.label(), None);
                }
                count(shared.counters.unpriced);
                self.publish("unpriced", |_| {});
                self.release(shared);
                return;
            }
            Charge::Estimated { reason, nano } => {
                count(shared.counters.unpriced_reasons.id(reason));
                self.log_unpriced(shared, reason.label(), Some(nano));
                count(shared.counters.estimated);
                (nano, "estimated", None)
            }
        };
        // The key read at the request headers (the tenant is the same).
        let key = self
            .ledger_key
            .take()
            .unwrap_or_else(|| config.ledger.key(&self.tenant));
        let now_ms = clock_ms.unwrap_or_else(now_unix_millis);
        match config
            .ledger
            .book(&HostSharedData, &key, now_ms, nano, self.hold.take())
        {
            Ok(stats) => shared.counters.add(&stats),
            Err(not) => {
                shared.counters.add(&not.stats);
                count(shared.counters.booking_failures);
                match not.failed {
                    Some(status) => shared.store_failed(
                        &format!("tenant {}: {nano} nano-USD not booked", self.tenant),
                        status,
                    ),
                    None => log::warn!(
                        "tenant {}: {nano} nano-USD not booked (CAS retries exhausted)",
                        self.tenant
                    ),
                }
            }
        }
        if let Some(g) = shared.global.as_ref().filter(|_| self.budgeted) {
            let budget = config.budget(&self.tenant);
            let limits = Limits::of(&g.config, &budget);
            let now = Periods::at(now_ms / 1_000);
            if let Some(b) = Booking::new(&g.config, &self.tenant, &limits, &now, nano) {
                // Sent by the root context (this stream may end before a reply).
                let queued = g.outbox.borrow_mut().push(b);
                if queued {
                    shared.wake_root(g);
                } else {
                    count(shared.counters.global_dropped);
                    shared.dropped(&format!(
                        "tenant {}: {nano} nano-USD dropped: this worker's outbox is full \
                         ({OUTBOX_MAX} bookings)",
                        self.tenant
                    ));
                }
            }
        }
        self.publish(status, |line| {
            if let Some(usage) = &usage {
                if let Some(model) = &usage.model {
                    line.text(field::MODEL, model);
                }
                line.int(field::INPUT_TOKENS, usage.input_tokens)
                    .int(field::OUTPUT_TOKENS, usage.output_tokens);
                // The kinds inside those counts, for the metrics filter's token types.
                for (key, tokens) in [
                    (field::CACHED_INPUT_TOKENS, usage.cached_input_tokens),
                    (
                        field::CACHE_CREATION_INPUT_TOKENS,
                        usage.cache_creation_input_tokens,
                    ),
                    (field::REASONING_TOKENS, usage.reasoning_tokens),
                ] {
                    if tokens > 0 {
                        line.int(key, tokens);
                    }
                }
            }
            line.int(field::COST_NANO_USD, nano);
        });
    }

    /// Publishes the request's line (`tollgate_common::signals::COST`): `outcome`, `tenant`,
    /// then what `more` adds, then `first_byte_us` when the response had bytes. Once per
    /// request, where it is decided.
    pub(super) fn publish(&self, outcome: &str, more: impl FnOnce(&mut Line)) {
        let mut line = Line::new();
        line.text(field::OUTCOME, outcome)
            .text(field::TENANT, &self.tenant);
        more(&mut line);
        if let Some(us) = self.first_byte_us {
            line.int(field::FIRST_BYTE_US, us);
        }
        signals::publish(signals::COST, &line);
    }

    /// Logs an LLM response that could not be priced (`charged`: the estimate, if any), at most
    /// once per interval and worker.
    fn log_unpriced(&self, shared: &Shared, reason: &str, charged: Option<u64>) {
        if let Some(unlogged) = shared.logs.unpriced.due(now_unix_millis()) {
            log::warn!(
                "tenant {}: a {} response could not be priced ({reason}); charged {} nano-USD \
                 ({unlogged} more since the last line)",
                self.tenant,
                self.request_model.as_deref().unwrap_or("?"),
                charged.map_or_else(|| "nothing".to_string(), |n| n.to_string()),
            );
        }
    }

    /// Refuses the request of a tenant whose ledger record cannot be read or written (at the
    /// request headers or at its reservation; the caller has logged why): `store_full.status`,
    /// `retry-after: 1`, code `budget_unavailable`, counted and published as `store_failure`.
    pub(super) fn ledger_unavailable(&mut self, shared: &Shared) -> Action {
        self.refuse(
            shared.counters.store_failure,
            "store_failure",
            (
                shared.config.store_full.status,
                &[("retry-after", "1")],
                "budget_unavailable",
                "the spend of this tenant cannot be read or stored; retry later",
            ),
        )
    }

    /// Refuses the request before the upstream (the stream ends here).
    pub(super) fn refuse(
        &mut self,
        counter: Option<u32>,
        status: &str,
        reply: (u32, &[(&str, &str)], &str, &str),
    ) -> Action {
        self.refuse_publishing(counter, status, |_| {}, reply)
    }

    /// [`Request::refuse`], with `more` fields in the published line.
    pub(super) fn refuse_publishing(
        &mut self,
        counter: Option<u32>,
        status: &str,
        more: impl FnOnce(&mut Line),
        reply: (u32, &[(&str, &str)], &str, &str),
    ) -> Action {
        self.done = true;
        count(counter);
        self.publish(status, more);
        let (code, headers, error, message) = reply;
        send_json_error(code, headers, error, message);
        Action::Pause
    }
}
