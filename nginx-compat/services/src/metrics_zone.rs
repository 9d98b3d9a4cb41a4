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

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::exposition::{self, LabelPolicy, Series, Value};
use crate::lock::lock;
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};

const LINE: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"TGMETRC1");
/// Layout version; bump on any change of the layout (2: the overflow counter).
const VERSION: u32 = 2;
/// Bytes per metric definition.
const DEF_SIZE: usize = 256;
/// Longest metric name (bytes).
pub const MAX_NAME_BYTES: usize = 200;
/// Most bucket bounds per histogram.
pub const MAX_BUCKETS: usize = 31;
/// Distinct bucket sets per zone.
const MAX_SETS: usize = 16;
const SET_SIZE: usize = 256;
const SETS_OFF: usize = 128;
const INDEX_OFF: usize = SETS_OFF + MAX_SETS * SET_SIZE;

// Header.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_LINE: usize = 12;
const H_BYTES: usize = 16;
const H_MAX_METRICS: usize = 24;
const H_WORKERS: usize = 28;
const H_SLOTS: usize = 32;
const H_DEF_SIZE: usize = 36;
const H_INDEX_SLOTS: usize = 40;
const H_MAX_BUCKETS: usize = 44;
const H_MAX_NAME: usize = 48;
const H_MAX_SETS: usize = 52;
// Control.
const C_LOCK: usize = 64;
const C_COUNT: usize = 68;
const C_NEXT_SLOT: usize = 72;
const C_STEALS: usize = 76;
const C_SETS: usize = 80;
/// `define` calls refused because definitions or slots ran out (u32, saturating).
const C_OVERFLOW: usize = 84;
// Definition fields.
const D_STATE: usize = 0;
const D_KIND: usize = 4;
const D_NAME_LEN: usize = 8;
const D_SLOT: usize = 12;
const D_SET: usize = 16;
const D_NBUCKETS: usize = 20;
const D_GAUGE: usize = 24;
const D_NAME: usize = 56;

/// The buckets of `tollgate_request_duration_microseconds` in `envoy/metrics.yaml`
/// (`histogram_bucket_settings`), in microseconds: the default for every histogram.
pub const DEFAULT_BUCKETS: [u64; 13] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// proxy-wasm `MetricType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Monotonic counter.
    Counter = 0,
    /// Gauge.
    Gauge = 1,
    /// Histogram.
    Histogram = 2,
}

impl MetricKind {
    fn from_u32(v: u32) -> Option<MetricKind> {
        match v {
            0 => Some(MetricKind::Counter),
            1 => Some(MetricKind::Gauge),
            2 => Some(MetricKind::Histogram),
            _ => None,
        }
    }
}

/// Errors of metric operations; the proxy-wasm status of the same name applies
/// (`Corrupt`: `InternalFailure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsError {
    /// No metric with that id.
    NotFound,
    /// Wrong kind for the call, `delta <= 0` on a counter, an empty or too long name, or a name
    /// defined with another kind.
    BadArgument,
    /// No definition or slot left (see the module documentation).
    NoSpace,
    /// The zone holds an impossible value (offset out of range).
    Corrupt,
}

impl std::fmt::Display for MetricsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricsError::NotFound => "metric not found",
            MetricsError::BadArgument => "bad argument",
            MetricsError::NoSpace => "metrics zone full",
            MetricsError::Corrupt => "metrics zone corrupted",
        })
    }
}

impl std::error::Error for MetricsError {}

/// An invalid bucket configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBuckets(pub String);

impl std::fmt::Display for BadBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadBuckets {}

/// Histogram bucket bounds by name prefix (the ABI carries none; Envoy's
/// `stats_config.histogram_bucket_settings`). The first rule whose prefix the metric's raw name
/// starts with applies, else the default. Bounds are inclusive upper bounds (`le`), strictly
/// increasing, 1 to [`MAX_BUCKETS`] of them. Applied when a histogram is defined: the bounds are
/// stored in the zone with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramBuckets {
    default: Vec<u64>,
    rules: Vec<(String, Vec<u64>)>,
}

impl Default for HistogramBuckets {
    /// [`DEFAULT_BUCKETS`] for every histogram.
    fn default() -> Self {
        HistogramBuckets {
            default: DEFAULT_BUCKETS.to_vec(),
            rules: Vec::new(),
        }
    }
}

fn check_bounds(bounds: &[u64]) -> Result<(), BadBuckets> {
    if bounds.is_empty() || bounds.len() > MAX_BUCKETS {
        return Err(BadBuckets(format!(
            "histogram buckets: {} bounds, expected 1 to {MAX_BUCKETS}",
            bounds.len()
        )));
    }
    if bounds.windows(2).any(|w| w.first() >= w.get(1)) {
        return Err(BadBuckets(
            "histogram buckets must be strictly increasing".into(),
        ));
    }
    Ok(())
}

impl HistogramBuckets {
    /// `bounds` for every histogram no rule matches.
    ///
    /// # Errors
    /// [`BadBuckets`] (see the type documentation).
    pub fn with_default(bounds: Vec<u64>) -> Result<HistogramBuckets, BadBuckets> {
        check_bounds(&bounds)?;
        Ok(HistogramBuckets {
            default: bounds,
            rules: Vec::new(),
        })
    }

    /// Adds a rule: histograms whose name starts with `prefix` get `bounds`.
    ///
    /// # Errors
    /// [`BadBuckets`] (see the type documentation), or more than 15 distinct bucket sets.
    pub fn rule(mut self, prefix: &str, bounds: Vec<u64>) -> Result<HistogramBuckets, BadBuckets> {
        check_bounds(&bounds)?;
        self.rules.push((prefix.to_string(), bounds));
        let mut distinct: Vec<&Vec<u64>> = vec![&self.default];
        for (_, b) in &self.rules {
            if !distinct.contains(&b) {
                distinct.push(b);
            }
        }
        if distinct.len() > MAX_SETS {
            return Err(BadBuckets(format!(
                "more than {MAX_SETS} distinct bucket sets"
            )));
        }
        Ok(self)
    }

    /// The bounds for a histogram named `name`.
    pub fn for_name(&self, name: &str) -> &[u64] {
        self.rules
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
            .map_or(&self.default, |(_, b)| b)
    }
}

/// Configuration of this process's view of the zone (not stored in shared memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Bucket bounds for histograms defined from now on.
    pub buckets: HistogramBuckets,
    /// Which name segments become labels in [`MetricsZone::render`].
    pub labels: LabelPolicy,
}

impl Default for MetricsConfig {
    /// [`DEFAULT_BUCKETS`] and [`LabelPolicy::tollgate`] (Envoy's output with `envoy/metrics.yaml`).
    fn default() -> Self {
        MetricsConfig {
            buckets: HistogramBuckets::default(),
            labels: LabelPolicy::tollgate(),
        }
    }
}

/// The size parameters of a metrics zone; the same on every attach (checked by the sentinel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsLayout {
    /// Most metrics (definitions).
    pub max_metrics: u32,
    /// Worker slices (nginx `worker_processes`).
    pub workers: u32,
    /// `u64` slots per worker slice: a counter takes 1, a histogram with `b` bounds `b + 2`.
    pub slots_per_worker: u32,
}

fn align_line(n: usize) -> Option<usize> {
    n.checked_add(LINE - 1)
        .map(|v| v / LINE)
        .and_then(|v| v.checked_mul(LINE))
}

impl MetricsLayout {
    /// A layout for `workers` workers with room for `max_metrics` metrics and `slots_per_worker`
    /// slots (e.g. 2048 metrics and 8192 slots: 512 KiB of definitions, 64 KiB per worker).
    ///
    /// # Errors
    /// [`AttachError::BadLayout`] for a zero parameter or a zone above 4 GiB.
    pub fn new(
        max_metrics: u32,
        workers: u32,
        slots_per_worker: u32,
    ) -> Result<MetricsLayout, AttachError> {
        let layout = MetricsLayout {
            max_metrics,
            workers,
            slots_per_worker,
        };
        if max_metrics == 0 || workers == 0 || slots_per_worker == 0 {
            return Err(AttachError::BadLayout("zero metrics, workers or slots"));
        }
        match layout.bytes() {
            Some(b) if b <= u32::MAX as usize => Ok(layout),
            _ => Err(AttachError::BadLayout("zone larger than 4 GiB")),
        }
    }

    fn index_slots(&self) -> Option<usize> {
        (self.max_metrics as usize)
            .checked_mul(2)?
            .checked_next_power_of_two()
    }

    fn defs_off(&self) -> Option<usize> {
        align_line(INDEX_OFF.checked_add(self.index_slots()?.checked_mul(4)?)?)
    }

    fn slices_off(&self) -> Option<usize> {
        self.defs_off()?
            .checked_add((self.max_metrics as usize).checked_mul(DEF_SIZE)?)
    }

    fn slice_stride(&self) -> Option<usize> {
        align_line((self.slots_per_worker as usize).checked_mul(8)?)
    }

    /// Bytes the zone needs (ask nginx for at least this much; extra bytes are unused).
    pub fn bytes(&self) -> Option<usize> {
        self.slices_off()?
            .checked_add(self.slice_stride()?.checked_mul(self.workers as usize)?)
    }
}

/// A metrics zone attached in one worker (or the master). `Send + Sync`.
#[derive(Debug, Clone)]
pub struct MetricsZone {
    region: SharedRegion,
    layout: MetricsLayout,
    worker: u32,
    config: MetricsConfig,
    index_slots: usize,
    defs_off: usize,
    slices_off: usize,
    slice_stride: usize,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One metric as read from the zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSnapshot {
    /// Id.
    pub id: u32,
    /// Name as defined.
    pub name: String,
    /// Kind.
    pub kind: MetricKind,
    /// Value summed over the workers.
    pub value: Value,
}

impl MetricsZone {
    /// Attaches the zone for worker `worker` (0-based, `< layout.workers`; the master may use
    /// 0: it only defines and renders).
    ///
    /// [`Init::Fresh`] formats the region (zeroes it all); [`Init::Existing`] checks the header
    /// sentinel against `layout` and keeps the values (counters survive a reload).
    ///
    /// # Errors
    /// [`AttachError::TooSmall`] when the region is smaller than [`MetricsLayout::bytes`],
    /// [`AttachError::WorkerOutOfRange`], and for `Existing` [`AttachError::NotInitialized`] or
    /// [`AttachError::Mismatch`].
    pub fn attach(
        region: SharedRegion,
        layout: &MetricsLayout,
        init: Init,
        worker: u32,
        config: MetricsConfig,
    ) -> Result<MetricsZone, AttachError> {
        let bad = AttachError::BadLayout("size overflow");
        let bytes = layout.bytes().ok_or(bad.clone())?;
        if region.len() < bytes {
            return Err(AttachError::TooSmall {
                len: region.len(),
                min: bytes,
            });
        }
        if worker >= layout.workers {
            return Err(AttachError::WorkerOutOfRange {
                worker,
                workers: layout.workers,
            });
        }
        let zone = MetricsZone {
            region,
            layout: *layout,
            worker,
            config,
            index_slots: layout.index_slots().ok_or(bad.clone())?,
            defs_off: layout.defs_off().ok_or(bad.clone())?,
            slices_off: layout.slices_off().ok_or(bad.clone())?,
            slice_stride: layout.slice_stride().ok_or(bad)?,
        };
        match init {
            Init::Fresh => zone
                .format(bytes)
                .map_err(|_| AttachError::BadLayout("format"))?,
            Init::Existing => zone.verify(bytes)?,
        }
        Ok(zone)
    }

    /// The worker index this handle writes to.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The same zone, writing to another worker's slice (for a worker that learns its index
    /// after the master attached).
    ///
    /// # Errors
    /// [`AttachError::WorkerOutOfRange`].
    pub fn for_worker(&self, worker: u32) -> Result<MetricsZone, AttachError> {
        if worker >= self.layout.workers {
            return Err(AttachError::WorkerOutOfRange {
                worker,
                workers: self.layout.workers,
            });
        }
        let mut z = self.clone();
        z.worker = worker;
        Ok(z)
    }

    fn header_values(&self, bytes: usize) -> [crate::zone::Field; 11] {
        [
            ("layout version", H_VERSION, u64::from(VERSION), false),
            ("line size", H_LINE, LINE as u64, false),
            ("zone size", H_BYTES, bytes as u64, true),
            (
                "max metrics",
                H_MAX_METRICS,
                u64::from(self.layout.max_metrics),
                false,
            ),
            ("workers", H_WORKERS, u64::from(self.layout.workers), false),
            (
                "slots per worker",
                H_SLOTS,
                u64::from(self.layout.slots_per_worker),
                false,
            ),
            ("definition size", H_DEF_SIZE, DEF_SIZE as u64, false),
            ("index slots", H_INDEX_SLOTS, self.index_slots as u64, false),
            ("max buckets", H_MAX_BUCKETS, MAX_BUCKETS as u64, false),
            ("max name bytes", H_MAX_NAME, MAX_NAME_BYTES as u64, false),
            ("bucket sets", H_MAX_SETS, MAX_SETS as u64, false),
        ]
    }

    fn format(&self, bytes: usize) -> Result<(), MetricsError> {
        self.f64(H_MAGIC)?.store(0, Ordering::Release);
        if !self.region.zero(0, bytes) {
            return Err(MetricsError::Corrupt);
        }
        if !crate::zone::publish(&self.region, H_MAGIC, MAGIC, &self.header_values(bytes)) {
            return Err(MetricsError::Corrupt);
        }
        Ok(())
    }

    fn verify(&self, bytes: usize) -> Result<(), AttachError> {
        crate::zone::verify(&self.region, H_MAGIC, MAGIC, &self.header_values(bytes))
    }

    fn f32(&self, off: usize) -> Result<&AtomicU32, MetricsError> {
        self.region.u32_at(off).ok_or(MetricsError::Corrupt)
    }

    fn f64(&self, off: usize) -> Result<&AtomicU64, MetricsError> {
        self.region.u64_at(off).ok_or(MetricsError::Corrupt)
    }

    fn def_off(&self, id: u32) -> Result<usize, MetricsError> {
        if id >= self.layout.max_metrics {
            return Err(MetricsError::Corrupt);
        }
        (id as usize)
            .checked_mul(DEF_SIZE)
            .and_then(|o| o.checked_add(self.defs_off))
            .ok_or(MetricsError::Corrupt)
    }

    fn def32(&self, id: u32, field: usize) -> Result<u32, MetricsError> {
        Ok(self
            .f32(self.def_off(id)?.saturating_add(field))?
            .load(Ordering::Relaxed))
    }

    fn slot(&self, worker: u32, slot: usize) -> Result<&AtomicU64, MetricsError> {
        let off = (worker as usize)
            .checked_mul(self.slice_stride)
            .and_then(|o| o.checked_add(self.slices_off))
            .and_then(|o| o.checked_add(slot.checked_mul(8)?))
            .ok_or(MetricsError::Corrupt)?;
        if slot >= self.layout.slots_per_worker as usize {
            return Err(MetricsError::Corrupt);
        }
        self.f64(off)
    }

    fn count(&self) -> Result<u32, MetricsError> {
        Ok(self.f32(C_COUNT)?.load(Ordering::Acquire))
    }

    fn name_of(&self, id: u32) -> Result<Vec<u8>, MetricsError> {
        let len = self.def32(id, D_NAME_LEN)? as usize;
        if len > MAX_NAME_BYTES {
            return Err(MetricsError::Corrupt);
        }
        let mut name = vec![0u8; len];
        if !self
            .region
            .read(self.def_off(id)?.saturating_add(D_NAME), &mut name)
        {
            return Err(MetricsError::Corrupt);
        }
        Ok(name)
    }

    fn index_off(&self, slot: usize) -> usize {
        INDEX_OFF.saturating_add(slot.saturating_mul(4))
    }

    /// Looks `name` up in the index: `Ok(Some(id))`, or `Ok(None)` with the empty index slot
    /// where it would go.
    fn lookup(&self, name: &[u8]) -> Result<Result<u32, usize>, MetricsError> {
        let mask = self.index_slots.saturating_sub(1);
        let mut i = (fnv1a(name) as usize) & mask;
        for _ in 0..self.index_slots {
            let v = self.f32(self.index_off(i))?.load(Ordering::Acquire);
            if v == 0 {
                return Ok(Err(i));
            }
            let id = v.saturating_sub(1);
            if self.def32(id, D_STATE)? == 1 && self.name_of(id)? == name {
                return Ok(Ok(id));
            }
            i = i.wrapping_add(1) & mask;
        }
        Err(MetricsError::NoSpace)
    }

    /// The index of the bucket set equal to `bounds`, adding it (define lock held).
    fn bucket_set(&self, bounds: &[u64]) -> Result<u32, MetricsError> {
        let sets = self.f32(C_SETS)?;
        let n = sets.load(Ordering::Relaxed);
        for s in 0..n {
            if self.set_bounds(s)? == bounds {
                return Ok(s);
            }
        }
        if n as usize >= MAX_SETS || bounds.len() > MAX_BUCKETS {
            return Err(MetricsError::NoSpace);
        }
        let off = SETS_OFF.saturating_add((n as usize).saturating_mul(SET_SIZE));
        self.f32(off)?.store(
            u32::try_from(bounds.len()).map_err(|_| MetricsError::Corrupt)?,
            Ordering::Relaxed,
        );
        for (i, b) in bounds.iter().enumerate() {
            self.f64(off.saturating_add(8).saturating_add(i.saturating_mul(8)))?
                .store(*b, Ordering::Relaxed);
        }
        sets.store(n.saturating_add(1), Ordering::Release);
        Ok(n)
    }

    /// Bound `i` of bucket set `set`.
    fn set_bound(&self, set: u32, i: usize) -> Result<u64, MetricsError> {
        if set as usize >= MAX_SETS || i >= MAX_BUCKETS {
            return Err(MetricsError::Corrupt);
        }
        let off = SETS_OFF
            .saturating_add((set as usize).saturating_mul(SET_SIZE))
            .saturating_add(8)
            .saturating_add(i.saturating_mul(8));
        Ok(self.f64(off)?.load(Ordering::Relaxed))
    }

    fn set_bounds(&self, set: u32) -> Result<Vec<u64>, MetricsError> {
        if set as usize >= MAX_SETS {
            return Err(MetricsError::Corrupt);
        }
        let off = SETS_OFF.saturating_add((set as usize).saturating_mul(SET_SIZE));
        let n = (self.f32(off)?.load(Ordering::Relaxed) as usize).min(MAX_BUCKETS);
        (0..n)
            .map(|i| {
                Ok(self
                    .f64(off.saturating_add(8).saturating_add(i.saturating_mul(8)))?
                    .load(Ordering::Relaxed))
            })
            .collect()
    }

    /// `proxy_define_metric`: the id of metric `name` (bytes ≤ [`MAX_NAME_BYTES`], the
    /// labels encoded in it, see [`crate::exposition`]), defining it on first use. Takes the
    /// zone's define lock only when the name is new.
    ///
    /// # Errors
    /// [`MetricsError::BadArgument`] for an empty or too long name or one defined with another
    /// kind; [`MetricsError::NoSpace`] when definitions, slots or bucket sets run out.
    pub fn define(&self, kind: MetricKind, name: &str) -> Result<u32, MetricsError> {
        let name_bytes = name.as_bytes();
        if name_bytes.is_empty() || name_bytes.len() > MAX_NAME_BYTES {
            return Err(MetricsError::BadArgument);
        }
        let existing = |id: u32| -> Result<u32, MetricsError> {
            if self.def32(id, D_KIND)? == kind as u32 {
                Ok(id)
            } else {
                Err(MetricsError::BadArgument)
            }
        };
        if let Ok(id) = self.lookup(name_bytes)? {
            return existing(id);
        }
        let _g = lock(self.f32(C_LOCK)?, self.region.u32_at(C_STEALS));
        let index_slot = match self.lookup(name_bytes)? {
            Ok(id) => return existing(id),
            Err(slot) => slot,
        };
        let id = self.f32(C_COUNT)?.load(Ordering::Relaxed);
        if id >= self.layout.max_metrics {
            return Err(self.overflowed());
        }
        let (set, nbuckets, slots) = match kind {
            MetricKind::Counter => (0, 0, 1usize),
            MetricKind::Gauge => (0, 0, 0),
            MetricKind::Histogram => {
                let bounds = self.config.buckets.for_name(name);
                let set = self.bucket_set(bounds).map_err(|e| match e {
                    MetricsError::NoSpace => self.overflowed(),
                    e => e,
                })?;
                (set, bounds.len(), bounds.len().saturating_add(2))
            }
        };
        let next_slot = self.f32(C_NEXT_SLOT)?;
        let first = next_slot.load(Ordering::Relaxed);
        let end = (first as usize).saturating_add(slots);
        if end > self.layout.slots_per_worker as usize {
            return Err(self.overflowed());
        }
        let def = self.def_off(id)?;
        let put = |field: usize, v: u32| -> Result<(), MetricsError> {
            self.f32(def.saturating_add(field))?
                .store(v, Ordering::Relaxed);
            Ok(())
        };
        put(D_KIND, kind as u32)?;
        put(
            D_NAME_LEN,
            u32::try_from(name_bytes.len()).map_err(|_| MetricsError::Corrupt)?,
        )?;
        put(D_SLOT, first)?;
        put(D_SET, set)?;
        put(
            D_NBUCKETS,
            u32::try_from(nbuckets).map_err(|_| MetricsError::Corrupt)?,
        )?;
        self.f64(def.saturating_add(D_GAUGE))?
            .store(0, Ordering::Relaxed);
        if !self.region.write(def.saturating_add(D_NAME), name_bytes) {
            return Err(MetricsError::Corrupt);
        }
        self.f32(def.saturating_add(D_STATE))?
            .store(1, Ordering::Release);
        next_slot.store(
            u32::try_from(end).map_err(|_| MetricsError::Corrupt)?,
            Ordering::Relaxed,
        );
        self.f32(self.index_off(index_slot))?
            .store(id.saturating_add(1), Ordering::Release);
        self.f32(C_COUNT)?
            .store(id.saturating_add(1), Ordering::Release);
        Ok(id)
    }

    /// (kind, first slot, bucket count) of a published metric.
    fn def(&self, id: u32) -> Result<(MetricKind, usize, usize), MetricsError> {
        if id >= self.count()? || self.def32(id, D_STATE)? != 1 {
            return Err(MetricsError::NotFound);
        }
        let kind = MetricKind::from_u32(self.def32(id, D_KIND)?).ok_or(MetricsError::Corrupt)?;
        let slot = self.def32(id, D_SLOT)? as usize;
        let nbuckets = (self.def32(id, D_NBUCKETS)? as usize).min(MAX_BUCKETS);
        Ok((kind, slot, nbuckets))
    }

    /// `proxy_increment_metric` (semantics in the module documentation).
    ///
    /// # Errors
    /// [`MetricsError::NotFound`], [`MetricsError::BadArgument`].
    pub fn increment(&self, id: u32, delta: i64) -> Result<(), MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => {
                let delta = u64::try_from(delta).map_err(|_| MetricsError::BadArgument)?;
                if delta == 0 {
                    return Err(MetricsError::BadArgument);
                }
                self.slot(self.worker, slot)?
                    .fetch_add(delta, Ordering::Relaxed);
                Ok(())
            }
            (MetricKind::Gauge, _, _) => {
                // Two's complement: adding the bit pattern of a negative delta subtracts.
                self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                    .fetch_add(delta as u64, Ordering::Relaxed);
                Ok(())
            }
            (MetricKind::Histogram, _, _) => Err(MetricsError::BadArgument),
        }
    }

    /// `proxy_record_metric` (semantics in the module documentation).
    ///
    /// # Errors
    /// [`MetricsError::NotFound`].
    pub fn record(&self, id: u32, value: u64) -> Result<(), MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => {
                self.slot(self.worker, slot)?
                    .fetch_add(value, Ordering::Relaxed);
            }
            (MetricKind::Gauge, _, _) => {
                self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                    .store(value, Ordering::Relaxed);
            }
            (MetricKind::Histogram, slot, nbuckets) => {
                let set = self.def32(id, D_SET)?;
                let mut bucket = nbuckets;
                for i in 0..nbuckets {
                    if value <= self.set_bound(set, i)? {
                        bucket = i;
                        break;
                    }
                }
                self.slot(self.worker, slot.saturating_add(bucket))?
                    .fetch_add(1, Ordering::Relaxed);
                self.slot(self.worker, slot.saturating_add(nbuckets).saturating_add(1))?
                    .fetch_add(value, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn sum_slot(&self, slot: usize) -> Result<u64, MetricsError> {
        (0..self.layout.workers).try_fold(0u64, |acc, w| {
            Ok(acc.wrapping_add(self.slot(w, slot)?.load(Ordering::Relaxed)))
        })
    }

    /// `proxy_get_metric`: a counter summed over the workers, or a gauge's value.
    ///
    /// # Errors
    /// [`MetricsError::NotFound`]; [`MetricsError::BadArgument`] for a histogram (as Envoy).
    pub fn get(&self, id: u32) -> Result<u64, MetricsError> {
        match self.def(id)? {
            (MetricKind::Counter, slot, _) => self.sum_slot(slot),
            (MetricKind::Gauge, _, _) => Ok(self
                .f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                .load(Ordering::Relaxed)),
            (MetricKind::Histogram, _, _) => Err(MetricsError::BadArgument),
        }
    }

    /// Every metric with its value summed over the workers, in definition order.
    ///
    /// # Errors
    /// [`MetricsError::Corrupt`].
    pub fn snapshot(&self) -> Result<Vec<MetricSnapshot>, MetricsError> {
        let n = self.count()?.min(self.layout.max_metrics);
        let mut out = Vec::with_capacity(n as usize);
        for id in 0..n {
            let (kind, slot, nbuckets) = match self.def(id) {
                Ok(d) => d,
                Err(MetricsError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let name = String::from_utf8_lossy(&self.name_of(id)?).into_owned();
            let value = match kind {
                MetricKind::Counter => Value::Counter(self.sum_slot(slot)?),
                MetricKind::Gauge => Value::Gauge(
                    self.f64(self.def_off(id)?.saturating_add(D_GAUGE))?
                        .load(Ordering::Relaxed) as i64,
                ),
                MetricKind::Histogram => {
                    let mut bounds = self.set_bounds(self.def32(id, D_SET)?)?;
                    bounds.truncate(nbuckets);
                    let counts = (0..=nbuckets)
                        .map(|b| self.sum_slot(slot.saturating_add(b)))
                        .collect::<Result<Vec<u64>, _>>()?;
                    let sum = self.sum_slot(slot.saturating_add(nbuckets).saturating_add(1))?;
                    Value::Histogram {
                        bounds,
                        counts,
                        sum,
                    }
                }
            };
            out.push(MetricSnapshot {
                id,
                name,
                kind,
                value,
            });
        }
        Ok(out)
    }

    /// Every metric in Prometheus text exposition format 0.0.4 (see [`crate::exposition`]);
    /// serve it with `Content-Type: text/plain; version=0.0.4`.
    ///
    /// # Errors
    /// [`MetricsError::Corrupt`].
    pub fn render(&self) -> Result<String, MetricsError> {
        let series: Vec<Series> = self
            .snapshot()?
            .into_iter()
            .map(|m| Series {
                name: m.name,
                value: m.value,
            })
            .collect();
        Ok(exposition::render(&series, &self.config.labels))
    }

    /// Counts a `define` refused for lack of space; returns [`MetricsError::NoSpace`].
    fn overflowed(&self) -> MetricsError {
        if let Ok(c) = self.f32(C_OVERFLOW) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
        }
        MetricsError::NoSpace
    }

    /// How many `define` calls were refused because the zone was full, since it was created
    /// (saturating at `u32::MAX`).
    pub fn overflow(&self) -> u32 {
        self.region
            .u32_at(C_OVERFLOW)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// Metrics defined so far, and slots used per worker.
    pub fn usage(&self) -> (u32, u32) {
        let load = |off| {
            self.region
                .u32_at(off)
                .map_or(0, |a| a.load(Ordering::Relaxed))
        };
        (load(C_COUNT), load(C_NEXT_SLOT))
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    fn layout() -> MetricsLayout {
        MetricsLayout::new(64, 2, 256).unwrap()
    }

    /// Two workers' handles on one zone.
    fn zone_pair(config: MetricsConfig) -> (MetricsZone, MetricsZone) {
        let l = layout();
        let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
        let w0 = MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, config.clone()).unwrap();
        let w1 = MetricsZone::attach(region, &l, Init::Existing, 1, config).unwrap();
        (w0, w1)
    }

    #[test]
    fn worker_slices_sum() {
        let (w0, w1) = zone_pair(MetricsConfig::default());
        let a = w0.define(MetricKind::Counter, "c").unwrap();
        // The other worker gets the same id for the same name.
        assert_eq!(w1.define(MetricKind::Counter, "c").unwrap(), a);
        let b = w1.define(MetricKind::Counter, "d").unwrap();
        assert_ne!(a, b);
        w0.increment(a, 5).unwrap();
        w1.increment(a, 7).unwrap();
        w1.record(a, 1).unwrap();
        assert_eq!(w0.get(a).unwrap(), 13);
        assert_eq!(w1.get(a).unwrap(), 13);
        assert_eq!(w0.get(b).unwrap(), 0);
        // Each worker wrote only its own slice.
        assert_eq!(w0.slot(0, 0).unwrap().load(Ordering::Relaxed), 5);
        assert_eq!(w0.slot(1, 0).unwrap().load(Ordering::Relaxed), 8);
    }

    #[test]
    fn envoy_call_semantics() {
        let (w0, w1) = zone_pair(MetricsConfig::default());
        let c = w0.define(MetricKind::Counter, "c").unwrap();
        let g = w0.define(MetricKind::Gauge, "g").unwrap();
        let h = w0.define(MetricKind::Histogram, "h").unwrap();
        assert_eq!(w0.increment(c, 0), Err(MetricsError::BadArgument));
        assert_eq!(w0.increment(c, -1), Err(MetricsError::BadArgument));
        assert_eq!(w0.increment(h, 1), Err(MetricsError::BadArgument));
        assert_eq!(w0.get(h), Err(MetricsError::BadArgument));
        assert_eq!(w0.get(99), Err(MetricsError::NotFound));
        assert_eq!(w0.increment(99, 1), Err(MetricsError::NotFound));
        assert_eq!(w0.record(99, 1), Err(MetricsError::NotFound));
        // Gauges are global: set replaces, increments from any worker add.
        w0.record(g, 10).unwrap();
        w1.increment(g, -4).unwrap();
        w0.increment(g, 1).unwrap();
        assert_eq!(w1.get(g).unwrap(), 7);
        w1.record(g, 2).unwrap();
        assert_eq!(w0.get(g).unwrap(), 2);
        // Same name, other kind: refused.
        assert_eq!(
            w1.define(MetricKind::Gauge, "c"),
            Err(MetricsError::BadArgument)
        );
        assert_eq!(
            w1.define(MetricKind::Counter, ""),
            Err(MetricsError::BadArgument)
        );
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            w1.define(MetricKind::Counter, &long),
            Err(MetricsError::BadArgument)
        );
        assert!(w1
            .define(MetricKind::Counter, &"x".repeat(MAX_NAME_BYTES))
            .is_ok());
    }

    #[test]
    fn runs_out_of_definitions_and_slots() {
        let l = MetricsLayout::new(4, 1, 20).unwrap();
        let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
        let z = MetricsZone::attach(region, &l, Init::Fresh, 0, MetricsConfig::default()).unwrap();
        // A default histogram takes 13 + 2 slots, a counter 1: 20 slots hold one of each + 4.
        z.define(MetricKind::Histogram, "h").unwrap();
        assert_eq!(
            z.define(MetricKind::Histogram, "h2"),
            Err(MetricsError::NoSpace)
        );
        for i in 0..3 {
            z.define(MetricKind::Counter, &format!("c{i}")).unwrap();
        }
        assert_eq!(
            z.define(MetricKind::Counter, "c3"),
            Err(MetricsError::NoSpace)
        );
        assert_eq!(z.usage(), (4, 18));
        // Existing names still resolve, and are no overflow.
        assert_eq!(z.define(MetricKind::Counter, "c1").unwrap(), 2);
        assert_eq!(z.overflow(), 2, "the two refused definitions are counted");
        assert_eq!(
            z.define(MetricKind::Counter, "c4"),
            Err(MetricsError::NoSpace)
        );
        assert_eq!(z.overflow(), 3);
    }

    #[test]
    fn sentinel_mismatch_refuses_to_attach() {
        let l = layout();
        let region = SharedRegion::anonymous(l.bytes().unwrap() * 2).unwrap();
        let cfg = MetricsConfig::default();
        MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, cfg.clone()).unwrap();
        let more_workers = MetricsLayout::new(64, 3, 256).unwrap();
        assert!(matches!(
            MetricsZone::attach(
                region.clone(),
                &more_workers,
                Init::Existing,
                0,
                cfg.clone()
            ),
            Err(AttachError::Mismatch {
                field: "zone size",
                ..
            })
        ));
        assert_eq!(
            MetricsZone::attach(region.clone(), &l, Init::Existing, 2, cfg.clone()).unwrap_err(),
            AttachError::WorkerOutOfRange {
                worker: 2,
                workers: 2
            }
        );
        let blank = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
        assert_eq!(
            MetricsZone::attach(blank, &l, Init::Existing, 0, cfg.clone()).unwrap_err(),
            AttachError::NotInitialized
        );
        region
            .u32_at(H_VERSION)
            .unwrap()
            .store(VERSION + 1, Ordering::Relaxed);
        assert!(matches!(
            MetricsZone::attach(region, &l, Init::Existing, 0, cfg),
            Err(AttachError::Mismatch {
                field: "layout version",
                ..
            })
        ));
    }

    #[test]
    fn forked_workers_count_exactly() {
        let l = MetricsLayout::new(16, 3, 64).unwrap();
        let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
        let cfg = MetricsConfig::default();
        let master = MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, cfg.clone()).unwrap();
        let codes = crate::shm::fork_children(3, |w| {
            let Ok(z) = master.for_worker(w as u32) else {
                return false;
            };
            // Every worker defines the same names concurrently.
            let (Ok(c), Ok(h)) = (
                z.define(MetricKind::Counter, "tollgate_x_total"),
                z.define(
                    MetricKind::Histogram,
                    "tollgate_request_duration_microseconds",
                ),
            ) else {
                return false;
            };
            (0..10_000u64).all(|i| z.increment(c, 1).is_ok() && z.record(h, i).is_ok())
        });
        assert_eq!(codes, vec![0, 0, 0]);
        assert_eq!(master.usage().0, 2);
        assert_eq!(master.get(0).unwrap(), 30_000);
        let snap = master.snapshot().unwrap();
        let Value::Histogram { counts, sum, .. } = &snap[1].value else {
            panic!()
        };
        assert_eq!(counts.iter().sum::<u64>(), 30_000);
        assert_eq!(*sum, 3 * (0..10_000u64).sum::<u64>());
        // 0..=1000 in the first bucket, per worker.
        assert_eq!(counts[0], 3 * 1001);
    }

    const EXPECTED: &str = "\
# TYPE tollgate_auth_total counter
tollgate_auth_total{result=\"ok\"} 4
# TYPE tollgate_body_bytes histogram
tollgate_body_bytes_bucket{le=\"10\"} 1
tollgate_body_bytes_bucket{le=\"100\"} 2
tollgate_body_bytes_bucket{le=\"+Inf\"} 3
tollgate_body_bytes_sum 555
tollgate_body_bytes_count 3
# TYPE tollgate_inflight gauge
tollgate_inflight 3
# TYPE tollgate_request_duration_microseconds histogram
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"1000\"} 2
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"2500\"} 2
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"5000\"} 2
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"10000\"} 2
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"25000\"} 2
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"50000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"100000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"250000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"500000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"1000000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"2500000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"5000000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"10000000\"} 3
tollgate_request_duration_microseconds_bucket{route=\"chat\",le=\"+Inf\"} 4
tollgate_request_duration_microseconds_sum{route=\"chat\"} 20031999
tollgate_request_duration_microseconds_count{route=\"chat\"} 4
# TYPE tollgate_requests_total counter
tollgate_requests_total{method=\"get\",status_class=\"2xx\",route=\"chat\",tenant=\"acme\"} 3
tollgate_requests_total{method=\"get\",status_class=\"4xx\",route=\"chat\",tenant=\"acme\"} 1
";

    fn sample() -> MetricsZone {
        let config = MetricsConfig {
            buckets: HistogramBuckets::default()
                .rule("tollgate_body", vec![10, 100])
                .unwrap(),
            labels: LabelPolicy::tollgate(),
        };
        let (w0, w1) = zone_pair(config);
        let ok = "tollgate_requests_total.method.get.status_class.2xx.route.chat.tenant.acme";
        let bad = "tollgate_requests_total.method.get.status_class.4xx.route.chat.tenant.acme";
        let dur = "tollgate_request_duration_microseconds.route.chat";
        // Defined in an order unlike the output's.
        let h = w1.define(MetricKind::Histogram, dur).unwrap();
        let r4 = w1.define(MetricKind::Counter, bad).unwrap();
        let r2 = w0.define(MetricKind::Counter, ok).unwrap();
        let g = w0.define(MetricKind::Gauge, "tollgate_inflight").unwrap();
        let a = w0
            .define(MetricKind::Counter, "tollgate_auth_total.result.ok")
            .unwrap();
        let b = w1
            .define(MetricKind::Histogram, "tollgate_body_bytes")
            .unwrap();
        w0.increment(r2, 2).unwrap();
        w1.increment(r2, 1).unwrap();
        w1.increment(r4, 1).unwrap();
        w0.record(g, 5).unwrap();
        w1.increment(g, -2).unwrap();
        w0.increment(a, 4).unwrap();
        for (w, v) in [(&w0, 999), (&w1, 1000), (&w0, 30_000), (&w1, 20_000_000)] {
            w.record(h, v).unwrap();
        }
        for v in [5, 50, 500] {
            w0.record(b, v).unwrap();
        }
        w0
    }

    #[test]
    fn exposition_matches_expected_text() {
        assert_eq!(sample().render().unwrap(), EXPECTED);
    }

    /// `promtool check metrics` (Debian package `prometheus`) accepts the output: exit 0, or 3
    /// with lint findings only, and only those Envoy's output draws too (tests/e2e/test_metrics.py).
    #[test]
    fn exposition_passes_promtool() {
        let text = sample().render().unwrap();
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("promtool not installed: skipped (apt-get install prometheus)");
            return;
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(code == Some(0) || code == Some(3), "{code:?}: {report}");
        for line in report.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                line.ends_with(" no help text")
                    || line.ends_with(" use base unit \"seconds\" instead of \"microseconds\""),
                "unexpected promtool finding: {line}"
            );
        }
    }

    #[test]
    fn bucket_configuration_is_checked() {
        assert!(HistogramBuckets::with_default(vec![]).is_err());
        assert!(HistogramBuckets::with_default(vec![2, 2]).is_err());
        assert!(HistogramBuckets::with_default((1..=32).collect()).is_err());
        let b = HistogramBuckets::with_default(vec![1, 2])
            .unwrap()
            .rule("a", vec![5])
            .unwrap()
            .rule("ab", vec![7])
            .unwrap();
        // First matching rule wins, as in Envoy's histogram_bucket_settings.
        assert_eq!(b.for_name("abc"), &[5]);
        assert_eq!(b.for_name("x"), &[1, 2]);
    }
}
