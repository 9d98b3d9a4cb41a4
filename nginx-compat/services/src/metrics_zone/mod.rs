//! proxy-wasm metrics (`proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`; proxy-wasm ABI 0.2.1) in nginx shared memory, with Envoy's semantics
//! (`Context::incrementMetric` and friends in envoy/source/extensions/common/wasm/context.cc):
//!
//! | call        | counter                       | gauge                 | histogram             |
//! |-------------|-------------------------------|-----------------------|-----------------------|
//! | `increment` | adds `delta`; `delta <= 0` is [`MetricsError::BadArgument`] | adds `delta` (may be negative) | [`MetricsError::BadArgument`] |
//! | `record`    | adds `value`                  | sets `value`          | observes `value`      |
//! | `get`       | sum over the workers          | value                 | [`MetricsError::BadArgument`] |
//!
//! Ids are the same in every worker: `define` of a name already defined (by any worker, with the
//! same kind) returns the existing id, as Envoy's stats of one name are one stat. A name defined
//! with another kind is [`MetricsError::BadArgument`].
//!
//! # Layout (offsets from the region's 64-byte-aligned base)
//! ```text
//! line 0    header (the sentinel checked on attach): magic "TGMETRC1", layout version, line
//!           size, region bytes, max metrics, workers, slots per worker, definition size,
//!           index slots, max buckets, max name bytes, max bucket sets
//! line 1    control: define lock, metric count, next free slot, lock takeovers, bucket sets,
//!           overflow (defines refused for lack of space)
//! sets      16 bucket sets x 256 bytes: count, then up to 31 upper bounds (u64)
//! index     open-addressing table, a power of two >= 2 x max metrics of u32 (id + 1; 0 empty),
//!           hashed by name (FNV-1a); written under the define lock, read without it
//! defs      max metrics x 256 bytes: state (1 = published), kind, name length, first slot,
//!           bucket set, bucket count, gauge value (u64), name (up to 200 bytes)
//! slices    one per worker, each starting on a cache line: slots per worker x u64
//! ```
//! A counter takes one slot of every worker slice, a histogram `buckets + 2` (one per bucket,
//! one for `+Inf`, one for the sum), a gauge none (gauges live in their definition: a `set` must
//! replace the value, which per-worker parts cannot do). `increment` and `record` of counters and
//! histograms write only the calling worker's slice (relaxed atomic adds: no lock, no cache line
//! shared with another worker, and still exact when an old and a new worker of the same index
//! overlap during a reload); `get` and rendering sum the slices. `define` takes the lock (rare:
//! once per name per VM).
//!
//! Slots are never reused (there is no "undefine" in the ABI): when the definitions or the slots
//! run out, `define` fails with [`MetricsError::NoSpace`] and the zone's overflow counter
//! ([`MetricsZone::overflow`]) goes up by one.
//!
//! # Where things are
//! `layout.rs`: the offsets above and [`MetricsLayout`]; `handle.rs`: [`MetricsZone`], attaching
//! it and reading its fields; `define.rs`: the name index, bucket sets and `define`; `ops.rs`:
//! `increment`, `record`, `get`; `snapshot.rs`: every metric read at once, rendered, and the
//! zone's usage; `buckets.rs`: histogram bounds; `metric_kind.rs`, `error.rs`: the ABI's metric
//! types and statuses (tests: `tests.rs`).

mod buckets;
mod define;
mod error;
mod handle;
mod layout;
mod metric_kind;
mod ops;
mod snapshot;

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests;

pub use buckets::{BadBuckets, HistogramBuckets, DEFAULT_BUCKETS};
pub use error::MetricsError;
pub use handle::{MetricsConfig, MetricsZone};
pub use layout::{MetricsLayout, MAX_BUCKETS, MAX_NAME_BYTES};
pub use metric_kind::MetricKind;
pub use snapshot::MetricSnapshot;
