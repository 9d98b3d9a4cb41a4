//! What every shared-memory zone (`shm_kv`, metrics, `shm_queue`) shares: how it is attached
//! ([`Init`], [`AttachError`]) and the size/version sentinel at its start: an 8-byte magic,
//! then the layout fields a build derives from its constants and the zone size.
//!
//! [`publish`] writes the fields, then the magic with `Release`, so a process that sees the
//! magic (`Acquire`) sees the whole header. [`verify`] is what `Init::Existing` runs when nginx
//! hands over the previous cycle's zone on reload: a zone of another kind, or written by a
//! build with another layout or for another size, is refused naming the first field that
//! differs, never misread.

use std::sync::atomic::Ordering;

use crate::shm::SharedRegion;

/// Whether nginx gave a new zone or one that already holds data (reused across a reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Initialise the zone (erases whatever the memory held).
    Fresh,
    /// Check the header sentinel and use the data in place.
    Existing,
}

/// Why a zone could not be attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// The region is smaller than the minimum (bytes).
    TooSmall {
        /// Region length.
        len: usize,
        /// Minimum for this kind of zone.
        min: usize,
    },
    /// [`Init::Existing`] on memory that holds no zone of this kind (wrong magic).
    NotInitialized,
    /// [`Init::Existing`] on a zone written with another layout (version, size, counts): the
    /// header field that differs, what this build expects and what the zone holds.
    Mismatch {
        /// Header field.
        field: &'static str,
        /// Value this build computes.
        expected: u64,
        /// Value in the zone.
        found: u64,
    },
    /// A worker index beyond the number of worker slices (metrics zones).
    WorkerOutOfRange {
        /// The index given.
        worker: u32,
        /// Worker slices in the zone.
        workers: u32,
    },
    /// Invalid layout parameters (metrics zones): which one.
    BadLayout(&'static str),
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::TooSmall { len, min } => {
                write!(
                    f,
                    "shared zone of {len} bytes is too small (minimum {min} bytes)"
                )
            }
            AttachError::NotInitialized => write!(f, "shared zone holds no data of this kind"),
            AttachError::Mismatch {
                field,
                expected,
                found,
            } => write!(
                f,
                "shared zone layout mismatch: {field} is {found}, this build expects {expected}"
            ),
            AttachError::WorkerOutOfRange { worker, workers } => {
                write!(
                    f,
                    "worker index {worker} out of range ({workers} worker slices)"
                )
            }
            AttachError::BadLayout(what) => write!(f, "invalid shared zone layout: {what}"),
        }
    }
}

impl std::error::Error for AttachError {}

/// One header field: its name (in [`AttachError::Mismatch`]), its byte offset in the zone,
/// the value this build writes and expects, and its width (`true`: u64, `false`: u32).
pub(crate) type Field = (&'static str, usize, u64, bool);

/// Writes `fields`, then `magic` at `magic_off` (`Release`). `false` when a field lies outside
/// the region or a u32 field's value does not fit (the zone stays unpublished).
pub(crate) fn publish(
    region: &SharedRegion,
    magic_off: usize,
    magic: u64,
    fields: &[Field],
) -> bool {
    for &(_, off, value, wide) in fields {
        if wide {
            let Some(a) = region.u64_at(off) else {
                return false;
            };
            a.store(value, Ordering::Relaxed);
        } else {
            let (Some(a), Ok(v)) = (region.u32_at(off), u32::try_from(value)) else {
                return false;
            };
            a.store(v, Ordering::Relaxed);
        }
    }
    match region.u64_at(magic_off) {
        Some(a) => {
            a.store(magic, Ordering::Release);
            true
        }
        None => false,
    }
}

/// Checks that the zone holds `magic` at `magic_off` and every field's expected value.
///
/// # Errors
/// [`AttachError::NotInitialized`] for another magic (or a header outside the region);
/// [`AttachError::Mismatch`] for the first field that differs.
pub(crate) fn verify(
    region: &SharedRegion,
    magic_off: usize,
    magic: u64,
    fields: &[Field],
) -> Result<(), AttachError> {
    let found = region.u64_at(magic_off).map(|a| a.load(Ordering::Acquire));
    if found != Some(magic) {
        return Err(AttachError::NotInitialized);
    }
    for &(field, off, expected, wide) in fields {
        let found = if wide {
            region.u64_at(off).map(|a| a.load(Ordering::Relaxed))
        } else {
            region
                .u32_at(off)
                .map(|a| u64::from(a.load(Ordering::Relaxed)))
        }
        .ok_or(AttachError::NotInitialized)?;
        if found != expected {
            return Err(AttachError::Mismatch {
                field,
                expected,
                found,
            });
        }
    }
    Ok(())
}
