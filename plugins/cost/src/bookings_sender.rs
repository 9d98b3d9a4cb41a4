//! Global mode's bookings (wasm32): the root context sends each worker's outbox to the rate
//! limit service, one call in flight per worker, the next batch at once on its reply, else on
//! ticks; a failed batch goes to the shared replay queue, replayed from ticks. Sent by the root
//! context because the Rust SDK delivers a call's reply only to the context that made it, and a
//! request's context is gone soon after its booking (see `Shared::wake_root`).

use tollgate_common::host_calls::{count, count_n, now_unix_millis};
use tollgate_common::rls::CallFailure;
use tollgate_common::shared_data::HostSharedData;

use crate::global::{batch_request, Booking, Limits, BATCH_MAX};
use crate::period::Periods;
use crate::worker::Shared;

/// A booking call not reported after its timeout plus this (ms) is taken as failed.
const BOOKING_GRACE_MS: u64 = 1_000;

/// The root context's booking call in flight (at most one per worker).
#[derive(Default)]
pub(crate) struct BookingSender {
    booking: Option<InFlight>,
}

/// A batch of bookings sent to the rate limit service.
struct InFlight {
    token: u32,
    sent: Vec<Booking>,
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
                shared.requeue(g, &f.sent);
            }
        }
        if !g.call.admits() {
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
        let config = &shared.config;
        let ledger = config.ledger.name();
        let now = Periods::at(now_ms / 1_000);
        let built = batch_request(&g.call.config().domain, ledger, batch, &now, |t| {
            Limits::of(&g.config, &config.budget(t))
        });
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
                shared.requeue(g, &f.sent);
            }
        }
    }
}
