//! cost: LLM token usage read from provider responses (OpenAI Chat Completions, Responses,
//! Embeddings; Anthropic Messages; JSON and server-sent events), priced exactly from a LiteLLM
//! style price table, booked per tenant in proxy-wasm shared data with CAS, and budgets enforced
//! before the upstream.
//!
//! - [`body_end`]: when a response body is complete for the client (`Content-Length`).
//! - [`charge`]: what a finished response is charged (priced, estimated or nothing).
//! - [`config`]: the plugin configuration (JSON) and its checks.
//! - [`counters`]: the filter's counters, declared once.
//! - [`price`]: exact integer prices (atto-USD per token) and costs (nano-USD).
//! - [`price_table`]: LiteLLM's price file as it is, and the lookup of model names.
//! - [`decode`]: bounded gzip/deflate decoding of compressed responses.
//! - [`request`]: the request body (model, stream flags) and the `include_usage` rewrite.
//! - [`response_reader`]: the response read chunk by chunk (decoded, parsed, the usage event
//!   the filter caused removed), and its usage at the end.
//! - [`unreadable`]: the request bodies the filter cannot read (refused for tenants with a budget).
//! - [`json_scan`]: the incremental JSON scanner that reads `usage` from bodies of any size.
//! - [`usage`]: the providers' usage objects, normalised.
//! - [`sse`]: the bounded incremental event-stream parser and the streaming usage accumulator.
//! - [`unpriced`]: why an LLM response could not be priced, and the estimate it is charged.
//! - [`period`]: UTC days and months.
//! - [`ledger`]: spend per tenant in shared data (CAS), budgets.
//! - [`global`]: budgets counted by Envoy's rate limit service across gateways (opt-in).
//! - [`replay_queue`]: global mode's bookings whose call failed, kept in shared data to be sent
//!   again.
//! - [`token_limits`]: weighted tokens per tenant (and model) per minute, hour or day, local mode.
//! - wasm32 only: `filter` (cost on the filters' skeleton, a thin shell), `worker` (what the root
//!   context shares with the requests), `pipeline` (one request, phase by phase),
//!   `bookings_sender` (global mode's bookings, sent by the root context), `remote_prices` (the
//!   price table refreshed on ticks).

pub mod body_end;
pub mod charge;
pub mod config;
pub mod counters;
pub mod decode;
pub mod global;
#[cfg(test)]
mod json_gen;
pub mod json_scan;
pub mod ledger;
pub mod month_windows;
pub mod partial;
pub mod period;
pub mod price;
pub mod price_table;
pub mod replay_queue;
pub mod request;
pub mod reservation;
pub mod response_reader;
pub mod sse;
pub mod token_limits;
pub mod unpriced;
pub mod unpriced_calls;
pub mod unreadable;
pub mod usage;

#[cfg(target_arch = "wasm32")]
mod bookings_sender;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod pipeline;
#[cfg(target_arch = "wasm32")]
mod remote_prices;
#[cfg(target_arch = "wasm32")]
mod worker;
