//! The size/version sentinel at the start of every zone (`shm_kv`, metrics, `shm_queue`): an
//! 8-byte magic, then the layout fields a build derives from its constants and the zone size.
//!
//! [`publish`] writes the fields, then the magic with `Release`, so a process that sees the
//! magic (`Acquire`) sees the whole header. [`verify`] is what `Init::Existing` runs when nginx
//! hands over the previous cycle's zone on reload: a zone of another kind, or written by a
//! build with another layout or for another size, is refused naming the first field that
//! differs, never misread.

use std::sync::atomic::Ordering;

use crate::kv::AttachError;
use crate::SharedRegion;

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
