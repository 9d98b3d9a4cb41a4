//! metrics: the gateway's Prometheus metrics, recorded with the proxy-wasm metrics ABI
//! (`proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`).
//!
//! The ABI carries a metric name and no labels, so labels are encoded in the name
//! (`family.label.value...`, see `tollgate_common::metrics::metric_name`) and the host turns them
//! back into labels (Envoy: `stats_config.stats_tags`, the rules in `stats_tags.json` and
//! `envoy/metrics.yaml`).
//!
//! - [`config`]: the plugin configuration (JSON) and its checks.
//! - [`labels`]: request → label values (method, status class, route), bounded.
//! - [`log_reads`]: the values `on_log` reads, in one host call where the host offers it.
//! - [`pending`]: counter increments held in the VM between flushes to the host.
//! - [`record`]: one finished request → series and values (host-free).
//! - [`series`]: metric families, series keys and the per-VM cache of metric ids.
//! - [`tenants`]: the gateway-wide cap on distinct tenant values (shared data with CAS).
//! - `filter` (wasm32 only): the proxy-wasm root and HTTP contexts, a thin shell over the above.

pub mod config;
pub mod labels;
pub mod log_reads;
pub mod pending;
pub mod record;
pub mod series;
pub mod tenants;

#[cfg(target_arch = "wasm32")]
mod filter;
