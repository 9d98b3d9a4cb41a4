//! The replay queue: bookings whose call failed, kept in shared data for every worker's tick to
//! send again (bounded at [`crate::global::REPLAY_MAX`]; a corrupt value is replaced), and its compact
//! binary encoding.

use tollgate_common::shared_data::{SharedStore, StoreError};

use std::collections::BTreeMap;

use crate::global::TokenTarget;
use crate::global::{merge, Booking, BookingKey, REPLAY_CAS_ATTEMPTS};
use crate::month_windows::Counter;
use crate::token_limits::window::Per;

/// Version byte of the replay queue's encoding (2; version 1, without the kind byte, is still
/// read: a queue written before an upgrade is replayed).
const QUEUE_VERSION: u8 = 2;
/// The kind byte of a token booking (0 is spend, 1 and 2 a carry's counter).
const KIND_TOKENS: u8 = 3;

/// The replay queue's value: version `2`, then per booking: tenant length (u8), tenant, day id,
/// month id, units (u32 LE each), then its kind: `0` spend, a carry's counter
/// (`month_windows::Counter::code`), or `3` tokens followed by the limit's name length (u8),
/// name, window length (`1` minute, `2` hour, `3` day) and window index (u64 LE). Version `1` is
/// version 2 without the kind byte. `None` for anything else (a corrupt value is replaced).
pub fn decode_queue(bytes: &[u8]) -> Option<Vec<Booking>> {
    let (&version, mut rest) = bytes.split_first()?;
    if version != 1 && version != QUEUE_VERSION {
        return None;
    }
    let mut out = Vec::new();
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            b.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        let tenant = std::str::from_utf8(tail.get(..len)?).ok()?.to_string();
        let fields = tail.get(len..)?;
        let (day, month, units) = (u32_at(fields, 0)?, u32_at(fields, 4)?, u32_at(fields, 8)?);
        rest = fields.get(12..)?;
        let (mut into, mut tokens) = (None, None);
        if version == QUEUE_VERSION {
            let (&kind, after) = rest.split_first()?;
            rest = after;
            match kind {
                0 => {}
                KIND_TOKENS => {
                    let (&n, after) = rest.split_first()?;
                    let n = usize::from(n);
                    let limit = std::str::from_utf8(after.get(..n)?).ok()?.to_string();
                    let per = match after.get(n)? {
                        1 => Per::Minute,
                        2 => Per::Hour,
                        3 => Per::Day,
                        _ => return None,
                    };
                    let at = n.checked_add(1)?;
                    let window =
                        u64::from_le_bytes(after.get(at..at.checked_add(8)?)?.try_into().ok()?);
                    rest = after.get(at.checked_add(8)?..)?;
                    tokens = Some(TokenTarget { limit, per, window });
                }
                c => into = Some(Counter::from_code(c)?),
            }
        }
        out.push(Booking {
            key: BookingKey {
                tenant,
                day,
                month,
                into,
                tokens,
            },
            units,
        });
    }
    Some(out)
}

/// [`decode_queue`]'s input from `bookings` (tenants or limit names over 255 bytes, impossible
/// for valid ones, are skipped).
pub fn encode_queue(bookings: &[Booking]) -> Vec<u8> {
    let mut out = vec![QUEUE_VERSION];
    for b in bookings {
        let Ok(len) = u8::try_from(b.key.tenant.len()) else {
            continue;
        };
        let token_name = b.key.tokens.as_ref().map(|t| u8::try_from(t.limit.len()));
        if matches!(token_name, Some(Err(_))) {
            continue;
        }
        out.push(len);
        out.extend_from_slice(b.key.tenant.as_bytes());
        out.extend_from_slice(&b.key.day.to_le_bytes());
        out.extend_from_slice(&b.key.month.to_le_bytes());
        out.extend_from_slice(&b.units.to_le_bytes());
        match (&b.key.tokens, token_name) {
            (Some(t), Some(Ok(n))) => {
                out.push(KIND_TOKENS);
                out.push(n);
                out.extend_from_slice(t.limit.as_bytes());
                out.push(match t.per {
                    Per::Minute => 1,
                    Per::Hour => 2,
                    Per::Day => 3,
                });
                out.extend_from_slice(&t.window.to_le_bytes());
            }
            _ => out.push(b.key.into.map_or(0, Counter::code)),
        }
    }
    out
}

/// What a replay-queue update did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Queued {
    /// Bookings added or merged.
    pub kept: u32,
    /// Bookings dropped: the queue was full.
    pub dropped: u32,
    /// The stored value was not a queue and was replaced (its bookings lost).
    pub corrupt: bool,
}

/// Why the replay queue could not be updated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueError {
    /// The store failed (host status).
    Failed(u32),
    /// Every CAS attempt lost to another worker.
    Contended,
}

/// Bookings that failed, shared by every worker of the gateway in one shared-data key
/// (`cost/<ledger>/~replay`), at most `max`, updated with CAS.
#[derive(Debug, Clone)]
pub struct ReplayQueue {
    /// The shared-data key.
    pub key: String,
    /// Most bookings held.
    pub max: usize,
}

impl ReplayQueue {
    /// The queue of ledger `ledger`.
    pub fn new(ledger: &str, max: usize) -> ReplayQueue {
        ReplayQueue {
            key: format!("cost/{ledger}/~replay"),
            max,
        }
    }

    /// One CAS update: `f` turns the queue into the new one and a result.
    fn update<S: SharedStore + ?Sized, T>(
        &self,
        store: &S,
        mut f: impl FnMut(&mut Vec<Booking>) -> T,
    ) -> Result<(T, bool), QueueError> {
        for _ in 0..REPLAY_CAS_ATTEMPTS {
            let (value, cas) = match store.get(&self.key) {
                Ok(read) => read,
                Err(StoreError::Failed(s)) => return Err(QueueError::Failed(s)),
                Err(StoreError::CasMismatch) => continue,
            };
            let (mut queue, corrupt) = match value.as_deref().map(decode_queue) {
                None => (Vec::new(), false),
                Some(Some(q)) => (q, false),
                Some(None) => (Vec::new(), true),
            };
            let out = f(&mut queue);
            match store.set(&self.key, &encode_queue(&queue), cas) {
                Ok(()) => return Ok((out, corrupt)),
                Err(StoreError::CasMismatch) => continue,
                Err(StoreError::Failed(s)) => return Err(QueueError::Failed(s)),
            }
        }
        Err(QueueError::Contended)
    }

    /// Adds `bookings` (merged with a queued booking of the same key), dropping those that find
    /// the queue full.
    ///
    /// # Errors
    /// [`QueueError`]: none was queued.
    pub fn push<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        bookings: &[Booking],
    ) -> Result<Queued, QueueError> {
        let max = self.max;
        let ((kept, dropped), corrupt) = self.update(store, |queue| {
            let mut map: BTreeMap<BookingKey, u32> = std::mem::take(queue)
                .into_iter()
                .map(|b| (b.key, b.units))
                .collect();
            let (mut kept, mut dropped) = (0u32, 0u32);
            for b in bookings {
                if merge(&mut map, b.key.clone(), b.units, max) {
                    kept = kept.saturating_add(1);
                } else {
                    dropped = dropped.saturating_add(1);
                }
            }
            *queue = map
                .into_iter()
                .map(|(key, units)| Booking { key, units })
                .collect();
            (kept, dropped)
        })?;
        Ok(Queued {
            kept,
            dropped,
            corrupt,
        })
    }

    /// Takes up to `n` bookings out of the queue.
    ///
    /// # Errors
    /// [`QueueError`]: nothing was taken.
    pub fn take<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        n: usize,
    ) -> Result<Vec<Booking>, QueueError> {
        // A read first: an empty queue is the common case and costs no write.
        match store.get(&self.key) {
            Ok((None, _)) => return Ok(Vec::new()),
            Ok((Some(v), _)) if decode_queue(&v).is_some_and(|q| q.is_empty()) => {
                return Ok(Vec::new())
            }
            Ok(_) | Err(StoreError::CasMismatch) => {}
            Err(StoreError::Failed(s)) => return Err(QueueError::Failed(s)),
        }
        let (taken, _) = self.update(store, |queue| {
            let rest = queue.split_off(n.min(queue.len()));
            std::mem::replace(queue, rest)
        })?;
        Ok(taken)
    }
}
