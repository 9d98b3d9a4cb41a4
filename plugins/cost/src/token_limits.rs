//! Token limits, local mode: at most N weighted tokens per tenant (and optionally per model)
//! per minute, hour or UTC day, counted exactly across workers in shared data (CAS), checked
//! before the upstream once the request's model is known, and charged from the response's usage
//! when it is complete (a stream's final usage). The crate README's "Token limits" states the
//! rules.
//!
//! - [`config`]: `token_limits` in the configuration, checked.
//! - [`weights`]: the weighted sum of a usage (fixed-point weights, rounded up).
//! - [`window`]: fixed windows aligned to the epoch, and the 25-byte count record (counted, reserved).
//! - [`store`]: the counts in shared data: read at admission, added with CAS, bounded keys.
//! - [`gate`]: the admission decision and the refusal's RateLimit header fields.
//! - [`counted`]: what a finished response counts (its usage, or cost's byte estimate).
//! - [`global`]: global mode's descriptors, readings and bookings (the rate limit service).
//!
//! The request's hooks (wasm32) are in `pipeline/token_limits.rs`.

pub mod config;
pub mod counted;
pub mod gate;
pub mod global;
pub mod store;
pub mod weights;
pub mod window;

pub use config::{Limit, RawTokenLimits, TokenLimits};
pub use store::TokenStore;
