//! The per-worker services nginx gives Tollgate's proxy-wasm host (`tollgate-host`), free of
//! nginx and of the host, unit-testable on ordinary memory:
//!
//! - [`kv`]: `shm_kv` zones, proxy-wasm shared data in nginx shared memory (ngx_wasm_module's
//!   directive and CAS semantics), and [`kv::ZoneSet`] for its `NAME/key` routing.
//! - [`metrics_zone`]: proxy-wasm metrics in shared memory, one slice of counters per worker, and
//!   their Prometheus text exposition ([`exposition`]: the same names and labels Envoy gives).
//! - [`queue`]: `shm_queue` zones, proxy-wasm shared queues in nginx shared memory (a FIFO of
//!   messages shared by every worker, dropping the oldest when full).
//! - [`http_client`]: `proxy_dispatch_http_call` on background threads of the worker, with a
//!   completion queue the worker polls.
//! - [`grpc_client`]: unary `proxy_grpc_call`s over HTTP/2; [`grpc_status`]: gRPC statuses and
//!   `grpc-message` text as Envoy reads and writes them, and the trailers-only local reply a
//!   filter's `proxy_send_local_response` becomes on a gRPC request.
//! - [`zone`]: what every zone shares (attaching, the size/version sentinel at its start).
//!
//! Private: `shm` (the region and all `unsafe` code), `lock` (a spinlock across processes),
//! `http_pool` (each HTTP client thread's kept-alive connections), `bench` (micro-benchmarks,
//! tests only).
//!
//! Shared memory comes in as a [`SharedRegion`]: the address and size of a zone nginx mapped
//! `MAP_SHARED` before forking its workers (`ngx_shared_memory_add`, then `shm.addr` and
//! `shm.size` in the zone's `init`), wrapped once with the `unsafe` [`SharedRegion::from_raw`].
//! All `unsafe` code of the crate is in its private `shm` module.
//!
//! # Mapping onto `tollgate_host::Host` (one call to one call)
//! ```text
//! get_shared_data(key)           zones.get(key)                  -> Ok((value, cas))
//! set_shared_data(key, v, cas)   zones.set(key, v, cas)          -> Ok(())
//! define_metric(kind, name)      metrics.define(kind, name)      -> Ok(id)
//! increment_metric(id, delta)    metrics.increment(id, delta)
//! record_metric(id, value)       metrics.record(id, value)
//! get_metric(id)                 metrics.get(id)                 -> Ok(u64)
//! dispatch_http_call(call)       runner.dispatch(tag, addr, &HttpRequest { headers, body,
//!                                  timeout: call.timeout_ms })  (then, from the poll timer,
//!                                runner.poll() -> [(tag, Option<HttpResponse>)] ->
//!                                Vm::on_http_call_response(token, response.map(|r|
//!                                  HttpCallResponse { headers: r.headers, body: r.body,
//!                                                     trailers: r.trailers })))
//! ```
//! Errors map to `Status` as documented on [`kv::KvError`] (`NotFound`, `CasMismatch`, `NoSpace`
//! → `InternalFailure`...), [`metrics_zone::MetricsError`] (same names) and [`http_client::DispatchError`]
//! (`MissingPseudoHeader`, `InvalidHeader` → `BadArgument`; `TooManyPending`, `Spawn` →
//! `InternalFailure`).
//!
//! # Lifecycle in nginx
//! - configuration (master): one `shm_kv` zone per directive
//!   ([`kv::Eviction::from_directive`] validates `eviction=`), one metrics zone of
//!   [`metrics_zone::MetricsLayout::bytes`]; in each zone's `init`: [`kv::KvZone::attach`] /
//!   [`metrics_zone::MetricsZone::attach`] with [`zone::Init::Fresh`], or [`zone::Init::Existing`] when
//!   nginx hands over the previous cycle's zone (`data` set) on reload;
//! - each worker (after fork): [`metrics_zone::MetricsZone::for_worker`]`(ngx_worker)`, a
//!   [`http_client::CallRunner`] (its threads start on the first call);
//! - the metrics location: [`metrics_zone::MetricsZone::render`] with
//!   `Content-Type: text/plain; version=0.0.4`.

#[allow(unsafe_code)]
mod shm;

mod lock;

pub mod exposition;
pub mod grpc_client;
pub mod grpc_status;
pub mod http_client;
mod http_pool;
pub mod kv;
pub mod metrics_zone;
pub mod queue;
pub mod zone;

pub use shm::{RegionError, SharedRegion};

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod bench;
