//! Phase 2's last step and phase 4's first, for a tenant with a budget in local mode: the
//! request's reservation taken at the end of its body (`crate::reservation::reserve`: refused
//! when spend + reserved has reached the budget) and released by its booking, or with nothing
//! booked when the request ends without a charge.

use proxy_wasm::types::Action;
use tollgate_common::clock::UnixNanos;
use tollgate_common::host_calls::{count, now_unix_millis};
use tollgate_common::shared_data::HostSharedData;

use crate::reservation::{estimate_nano, output_tokens, reserve, Reservation};
use crate::worker::Shared;

use super::Request;

impl Request {
    /// Reserves the estimate of this request (its body read, `declared`: the output bound it
    /// declares) against the tenant's budget. `Some` refusal: the budget is reached
    /// (`over_budget_status`, `budget_exceeded`), or the record cannot be read or written
    /// (`store_full.status`, `budget_unavailable`). Nothing is reserved for a tenant without
    /// a budget, in global mode, or for a request without a priced model.
    pub(super) fn reserve(&mut self, shared: &Shared, declared: Option<u64>) -> Option<Action> {
        if !self.budgeted || shared.global.is_some() {
            return None;
        }
        let config = &shared.config;
        let table = shared.table();
        let model = self.request_model.as_deref()?;
        let price = config.price(&table, Some(model))?;
        let output = output_tokens(
            declared,
            price.max_output_tokens,
            config.reservation.default_max_output_tokens,
        );
        let nano = estimate_nano(price, self.request_bytes, output);
        let key = self.ledger_key.as_deref()?;
        let budget = config.budget(&self.tenant);
        let reserved = reserve(
            &config.ledger,
            &HostSharedData,
            key,
            // The time of the admission's check (its read of the record, its periods).
            self.started.map_or_else(now_unix_millis, UnixNanos::millis),
            &budget,
            nano,
            self.ledger_read.take(),
        );
        match reserved {
            Ok(Reservation::Held(hold)) => {
                self.hold = Some(hold);
                None
            }
            Ok(Reservation::NoRecord) => None,
            Ok(Reservation::Refused(exceeded)) => Some(self.over_budget(shared, exceeded)),
            Err(not) => {
                shared.counters.add(&not.stats);
                let what = format!(
                    "tenant {}: {nano} nano-USD not reserved, request refused",
                    self.tenant
                );
                match not.failed {
                    Some(status) => shared.store_failed(&what, status),
                    None => log::warn!("{what} (CAS retries exhausted)"),
                }
                Some(self.ledger_unavailable(shared))
            }
        }
    }

    /// Releases the reservation of a request that ends without a charge (nothing booked).
    pub(super) fn release(&mut self, shared: &Shared) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let config = &shared.config;
        let key = self
            .ledger_key
            .take()
            .unwrap_or_else(|| config.ledger.key(&self.tenant));
        if let Err(not) =
            config
                .ledger
                .book(&HostSharedData, &key, now_unix_millis(), 0, Some(hold))
        {
            shared.counters.add(&not.stats);
            count(shared.counters.booking_failures);
            let what = format!(
                "tenant {}: a reservation of {} nano-USD not released (it expires with its day)",
                self.tenant, hold.nano
            );
            match not.failed {
                Some(status) => shared.store_failed(&what, status),
                None => log::warn!("{what}: CAS retries exhausted"),
            }
        }
    }
}
