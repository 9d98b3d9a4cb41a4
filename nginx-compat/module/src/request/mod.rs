//! One request through a `proxy_wasm` chain.
//!
//! - rewrite (or access) phase: `on_request_headers` for each filter in order; a local response
//!   ends the chain and is sent by nginx; `Pause` parks the request until a `Vm` resumes it
//!   (`proxy_continue_stream` from `on_http_call_response`, `on_tick` or `on_queue_ready`; a
//!   posted event); then the client body (if any filter reads it) is read in memory and
//!   `on_request_body(end_of_stream)` runs (where a filter may pause too); header and body
//!   changes are written back.
//! - header filter: `on_response_headers`; body filter: `on_response_body` per chunk (a filter
//!   returning `Pause` on a chunk makes the body buffered until the end of the stream), then,
//!   with the last chunk, `on_response_trailers` when nginx has response trailers by then.
//!   Trailer changes go to `headers_out.trailers`. There are never request trailers (nginx
//!   discards them): writes to that map return `BadArgument`.
//! - log phase: `on_log`, `on_done`, `on_delete` (or at pool cleanup when the log phase did not
//!   run).
//!
//! Response callbacks run for the filters whose `on_request_headers` ran (as in Envoy, where a
//! local reply goes back through the filters it passed).
//!
//! Fail closed: a filter of the chain that cannot run on the request (no root context in the
//! worker, its HTTP context could not be created, its instance trapped or was replaced, the
//! worker state is unavailable) fails the request with 500 and an error log line naming the
//! filter, never skips it (Envoy's `fail_open: false`).
//!
//! Internal redirects (`rewrite ... last`, `try_files`, `error_page`, `index`,
//! `X-Accel-Redirect`, named locations): the context lives in the request's pool and survives
//! them. When the request reaches a location whose chain differs from the one it ran, the
//! filters of the new chain that have not run on this request (a filter is the same when its
//! module, name and plugin configuration are) are added and run from `on_request_headers`; the
//! filters that already ran are not run again, so nothing is counted twice. Subrequests
//! (`auth_request`, SSI, `mirror`...) into a location with a chain run that chain as requests of
//! their own (their own contexts and stream).
//!
//! # Where things are
//! - `context.rs`: the per-request state ([`context::RequestCtx`]: the filters' slots, the
//!   request side's progress) and the way to it from a worker's handle;
//! - `context_lifetime.rs`: the context created in the request's pool, found again after an
//!   internal redirect, freed (finishing the filters) by the pool's cleanup;
//! - `chain.rs`: entering a location's chain: the filters added, their HTTP contexts created
//!   (in the worker's instances or the request's own);
//! - `callbacks.rs`: running a callback over the filters, fail closed, and how the run ended
//!   ([`callbacks::Outcome`]); the log phase's callbacks;
//! - `resume.rs`: resuming paused requests (a `Vm`'s resume, a replaced instance's orphans);
//! - `local_response.rs`: sending a filter's local response (HTTP, or gRPC trailers-only);
//! - `spares.rs`: the allocations a worker keeps from one request for the next (the context and
//!   its stream's sources).

pub mod callbacks;
mod chain;
pub mod context;
pub mod context_lifetime;
pub mod in_flight;
pub mod local_response;
pub mod resume;
pub mod spare_bounds;
pub mod spares;
