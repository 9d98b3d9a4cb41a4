//! Global budgets (`tollgate_cost::global`): the `global` block and the budgets that must fit
//! the protocol, rounding, the check's descriptors and decision (the reference server's rules as
//! a model), period rollover with an injected clock, the outbox and the shared replay queue and
//! their bounds, hostile replies (a failure for `on_error`, never a trap), and the overspend bound
//! across instances, simulated.
//!
//! One concern a file: `block` (the `global` block, units, rounding), `check` (the check's
//! descriptors and counters), `decision` (a verdict from the service's reply, and hostile
//! replies), `outbox` (bookings waiting to be sent), `replay_queue` (the shared queue and its
//! encoding), `overspend` (the bound across instances, simulated), `month_boundary` (a month
//! budget across the service's YEAR boundary, 3 gateways on an injected clock), `token_limits`
//! (global token limits, 3 gateways); `reference` models the
//! reference server, `support` holds the shared configuration helpers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

mod block;
mod check;
mod decision;
mod month_boundary;
mod outbox;
mod overspend;
mod reference;
mod replay_queue;
mod support;
mod token_limits;
