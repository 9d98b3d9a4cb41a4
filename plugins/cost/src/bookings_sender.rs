//! Global mode's bookings (wasm32): the root context sends each worker's outbox to the rate
//! limit service, one call in flight per worker, the next batch at once on its reply, else on
//! ticks; a failed batch goes to the shared replay queue, replayed from ticks. Sent by the root
//! context because the Rust SDK delivers a call's reply only to the context that made it, and a
//! request's context is gone soon after its booking (see `Shared::wake_root`). The same slot
//! sends the claims of month carries (`crate::month_windows`) before the bookings: a claim won
//! queues the carry as a booking.

use tollgate_common::host_calls::{count, count_n, now_unix_millis};
use tollgate_common::rls::CallFailure;
use tollgate_common::shared_data::HostSharedData;

use crate::global::{
    batch_request, claim_outcome, claim_request, BatchLimits, Booking, Claim, Limits, BATCH_MAX,
};
use crate::period::Periods;
use crate::worker::Shared;

/// A booking call not reported after its timeout plus this (ms) is taken as failed.
const BOOKING_GRACE_MS: u64 = 1_000;

/// The root context's booking call in flight (at most one per worker).
#[derive(Default)]
pub(crate) struct BookingSender {
    booking: Option<InFlight>,
}

/// A batch of bookings, or a claim, sent to the rate limit service.
struct InFlight {
    token: u32,
    sent: Vec<Booking>,
    /// A claim instead of bookings, and the tenant's month budget in units.
    claim: Option<(Claim, u32)>,
    descriptors: usize,
    /// When it was sent (Unix ms): a call not reported by its timeout plus BOOKING_GRACE_MS is
    /// taken as failed.
    since: u64,
}

impl BookingSender {
    /// Sends the next batch of bookings, unless one is in flight: this worker's outbox first,
    /// else the shared replay queue.
    pub(crate) fn flush(&mut self, shared: &Shared) {
        self.send_next(shared);
        if let Some(g) = shared.global.as_ref() {
            g.ticks.set_in_flight(self.booking.is_some());
        }
    }

    fn send_next(&mut self, shared: &Shared) {
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        let now_ms = now_unix_millis();
        if let Some(f) = &self.booking {
            let deadline = f
                .since
                .saturating_add(u64::from(g.call.config().timeout_ms))
                .saturating_add(BOOKING_GRACE_MS);
            if now_ms < deadline {
                return;
            }
            // Never reported: taken as failed, replayed (it may also have been counted: see the
            // README).
            if let Some(f) = self.booking.take() {
                g.call
                    .failed(&CallFailure::Grpc(4), "a booking call was never reported");
                Self::failed(shared, &f);
            }
        }
        if !g.call.admits() {
            return;
        }
        let config = &shared.config;
        let ledger = config.ledger.name();
        let claim = g.claims.borrow_mut().take_next();
        if let Some(claim) = claim {
            let limits = Limits::of(&g.config, &config.budget(&claim.tenant));
            let Some(limit) = limits.month else {
                return;
            };
            let request = claim_request(&g.call.config().domain, ledger, &claim, limit);
            let f = InFlight {
                token: 0,
                sent: Vec::new(),
                claim: Some((claim, limit)),
                descriptors: request.descriptors.len(),
                since: now_ms,
            };
            match g.call.dispatch(&request) {
                Ok(token) => self.booking = Some(InFlight { token, ..f }),
                Err(failure) => {
                    g.call
                        .failed(&failure, "the carry is claimed on a later check");
                    Self::failed(shared, &f);
                }
            }
            return;
        }
        let mut batch = g.outbox.borrow_mut().take(BATCH_MAX);
        if batch.is_empty() {
            batch = match g.queue.take(&HostSharedData, BATCH_MAX) {
                Ok(b) => b,
                Err(_) => return,
            };
            if batch.is_empty() {
                return;
            }
            count(shared.counters.global_replays);
        }
        let now = Periods::at(now_ms / 1_000);
        let limits = BatchLimits {
            budget: |t: &str| Limits::of(&g.config, &config.budget(t)),
            tokens: |t: &str, name: &str, per| {
                let limits = &config.token_limits;
                let found = limits.of(t).iter().find(|l| l.name == name && l.per == per);
                found
                    .filter(|_| limits.global)
                    .map(crate::token_limits::global::tokens_u32)
            },
        };
        let built = batch_request(&g.call.config().domain, ledger, batch, &now, &limits);
        count_n(shared.counters.global_stale, u64::from(built.stale));
        let Some(request) = built.request else {
            return;
        };
        let descriptors = request.descriptors.len();
        match g.call.dispatch(&request) {
            Ok(token) => {
                self.booking = Some(InFlight {
                    token,
                    sent: built.sent,
                    claim: None,
                    descriptors,
                    since: now_ms,
                });
            }
            Err(failure) => {
                g.call.failed(&failure, "bookings queued for replay");
                shared.requeue(g, &built.sent);
            }
        }
    }

    /// The reply (or failure) of the booking call in flight.
    pub(crate) fn on_reply(
        &mut self,
        shared: &Shared,
        token_id: u32,
        status_code: u32,
        response_size: usize,
    ) {
        let Some(f) = self.booking.take_if(|f| f.token == token_id) else {
            return;
        };
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        g.ticks.set_in_flight(false);
        match g.call.reply(status_code, response_size, f.descriptors) {
            Ok(verdict) if f.claim.is_some() => {
                if let Some((claim, limit)) = f.claim {
                    Self::claimed(shared, &claim, claim_outcome(&verdict, limit));
                }
                self.flush(shared);
            }
            Ok(_) => {
                count_n(
                    shared.counters.global_booked,
                    u64::try_from(f.sent.len()).unwrap_or(u64::MAX),
                );
                // The next batch at once: bookings wait at most one round trip per batch.
                self.flush(shared);
            }
            Err(failure) => {
                g.call.failed(&failure, "bookings queued for replay");
                Self::failed(shared, &f);
            }
        }
    }

    /// A call that got no answer: its bookings go to the replay queue, its claim is forgotten
    /// (a later check of the tenant asks it again).
    fn failed(shared: &Shared, f: &InFlight) {
        let Some(g) = shared.global.as_ref() else {
            return;
        };
        shared.requeue(g, &f.sent);
        if let Some((claim, _)) = &f.claim {
            g.claims.borrow_mut().failed(claim);
        }
    }

    /// A claim's answer: when this worker won it, the carry is queued as a booking into the
    /// carry's counter (`units`: the month spend that counter misses).
    fn claimed(shared: &Shared, claim: &Claim, units: Option<u32>) {
        let (Some(g), Some(units)) = (shared.global.as_ref(), units) else {
            return;
        };
        log::info!(
            "global budgets: {units} units of tenant {}'s month {} carried from the {} counter \
             into the {} counter",
            claim.tenant,
            claim.month,
            claim.carry.from.name(),
            claim.carry.to.name()
        );
        if units == 0 {
            return;
        }
        if !g.outbox.borrow_mut().push(claim.booking(units)) {
            count(shared.counters.global_dropped);
            shared.dropped("a month carry dropped: the outbox is full");
        }
    }
}
