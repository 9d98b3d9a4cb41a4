//! Global budgets, host-free: a tenant's day and month spend counted by Envoy's rate limit
//! service (`ShouldRateLimit`, `tollgate_common::rls`) shared by every gateway instead of per
//! instance; the local ledger (`crate::ledger`) keeps booking and is what `on_error: local`
//! decides with.
//!
//! # Units
//!
//! The protocol counts hits in `uint32` (`requests_per_unit`), so spend is counted in **booking
//! units** of `unit_nano_usd` nano-USD (default 100,000 = 10^-4 USD: a budget up to about
//! 429,496 USD fits). A budget is `floor(budget / unit)` units (refused sooner, never later);
//! one that does not fit in a `uint32` refuses the configuration naming its field. A booking is
//! `ceil(cost / unit)` units (never under-counted), at most `u32::MAX` per booking (the reference
//! server passes a descriptor's `uint64` hits to Redis' signed `INCRBY`: values past 2^63 refund
//! or poison a counter, `src/redis/fixed_cache_impl.go`, so nothing past `u32::MAX` is sent).
//!
//! # Descriptors
//!
//! One per budgeted period of the tenant, in this order: the month's (if it has a month budget),
//! then the day's:
//! - entries `("cost", "<len>:<ledger>/month/<yyyymm>")` and `("tenant", <tenant>)`, the limit
//!   override `{month units, YEAR}`;
//! - in a month that holds a YEAR boundary, the bridge: `("cost",
//!   "<len>:<ledger>/month-bridge/<yyyymm>")`, `("tenant", <tenant>)`, `{month units, MONTH}`
//!   (`crate::month_windows`);
//! - entries `("cost", "<len>:<ledger>/day/<yyyymmdd>")` and `("tenant", <tenant>)`, the limit
//!   override `{day units, DAY}`.
//!
//! The reference server keys Redis by `<domain>_<key>_<value>_..._<window start>` joined with `_`
//! without escaping (`src/limiter/cache_key.go`, `GenerateCacheKey`); here the only value a
//! client chooses (the tenant) is last and the `cost` value starts with its own length, so
//! distinct descriptors give distinct keys, and none equals rate-limit's (whose first entry is
//! `rule`).
//!
//! **Windows.** The reference server's windows are aligned on the Unix epoch (`[now - now %
//! length, + length)`, `src/utils/utilities.go` `UnitToDivider`, `CalculateReset`): DAY is the
//! UTC day, MONTH is 30 days and YEAR 365 days from the epoch, not calendar months or years.
//! The day's descriptor names the day it counts, the month's the calendar month (`period.rs`), so
//! a counter never spans two periods. The month's counter lives in a YEAR window, which holds
//! the whole month except in the one calendar month per year that contains a YEAR boundary
//! (epoch + k·365 days: 2026-12-18, 2027-12-18, 2028-12-17 at 00:00 UTC...): there the month is
//! also counted by a bridge in MONTH windows, and the spend before a window's start is carried
//! into it once (`crate::month_windows`).
//!
//! # The check and the booking
//!
//! Before the upstream: one call with every descriptor's `hits_addend` 0, a pure check in the
//! reference server (`src/utils/utilities.go` `GetHitsAddends`: a descriptor's own hits_addend
//! wins, 0 included; `INCRBY key 0`). It answers OK with `limit_remaining` 0 when the counter is
//! exactly at the limit (over means counter > limit: `src/limiter/base_limiter.go`
//! `GetResponseDescriptorStatus`), so a budget is spent when a status is over limit **or** has
//! `limit_remaining` 0, the local rule `spend >= budget`. What this worker has queued for the
//! tenant and not sent yet ([`Outbox::pending`]) is taken off `limit_remaining` first
//! ([`decide`]'s `pending`), and a cost known in advance must fit in what is left (`needed`).
//!
//! After the priced response: the spend in units as the descriptors' `hits_addend`
//! ([`Booking`]). Bookings wait in a per-worker [`Outbox`] (merged per tenant and period,
//! bounded) that the root context sends in batches, one call in flight per worker; a batch that
//! fails goes to the [`ReplayQueue`](crate::replay_queue::ReplayQueue) in shared data (bounded), which any worker's tick replays.
//! A booking for a day or month that has ended by the time it is sent drops that period (its
//! counter no longer matters).

//! One concern a file: [`block`] (the `global` block and its units), [`descriptors`] (the
//! descriptors of every counter: budgets, bridges, claims, token limits), [`check`] (the check
//! before the upstream and its decision), [`outbox`] (bookings waiting to be sent, and the
//! batches that send them), [`carry`] (the claims of month carries).

pub mod block;
pub mod carry;
pub mod check;
pub mod descriptors;
pub mod outbox;

pub use block::{CostGlobal, DEFAULT_UNIT_NANO_USD, MAX_UNIT_NANO_USD};
pub use carry::{claim_outcome, claim_request, Claim, Claims};
pub use check::{check_request, decide, describe, overspend_bound, Decision, Pending};
pub use descriptors::{cost_entry, token_descriptor, Limits, Period, COST_ENTRY, TENANT_ENTRY};
pub(crate) use outbox::merge;
pub use outbox::{
    batch_request, BatchLimits, BatchRequest, Booking, BookingKey, Outbox, SendTicks, TokenTarget,
    BATCH_MAX, OUTBOX_MAX, REPLAY_CAS_ATTEMPTS, REPLAY_MAX,
};
