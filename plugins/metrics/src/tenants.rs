//! The gateway-wide registry of tenant label values: at most `max_tenants` per generation,
//! admitted only from verified identities, and renewed every `max_age_seconds`.
//!
//! Each worker runs its own VM, so a per-VM cap would allow `workers × max_tenants` values and
//! could name a tenant on one worker and call it `other` on another. The registry is therefore
//! kept in proxy-wasm shared data (one store for all VMs of the plugin, see
//! `tollgate_common::shared_data`), as a fixed open-addressing table:
//!
//! - `tollgate.metrics/<registry>/~count`: the generation (`u64`) and the slots taken in it (`u32`),
//!   little-endian, 12 bytes; created by every VM in `on_configure` if missing;
//! - `tollgate.metrics/<registry>/s/<i>` for `i` in `0..2 × max_tenants`: the generation (`u64` LE) and
//!   the tenant label admitted into slot `i` in it. A tenant's slots are probed linearly from a
//!   hash of its label (FNV-1a, the same in every VM), at most [`MAX_PROBES`].
//!
//! **Generations.** The generation is `now / max_age_seconds` (the host's wall clock, the same
//! for every VM): when it changes, every slot and the count are stale, so the table empties
//! itself and tenants are admitted again as they show up. Entries therefore age out after at
//! most `max_age_seconds`, without any delete (shared data has none in the form used here), and
//! a reload or restart needs no clean-up.
//!
//! **Who is admitted.** Only identities from a verified source (the filter's tenant source,
//! `tollgate_common::identity`): a request that jwt-auth did not verify is labelled
//! `unauthenticated` and reads nothing, so unauthenticated traffic can neither take a slot nor
//! cost a shared-data read. Values that the filter must not admit (the cost filter's tenant on an
//! unverified request) are only looked up.
//!
//! **Bound.** Every admitted value reserved a slot of the count first, and the count never
//! exceeds `max_tenants` within a generation, so at most `max_tenants` distinct tenant values are
//! admitted per generation, gateway-wide (exact). A race (two workers admitting the same new
//! tenant, or Envoy's unconditional first write of a missing slot key, see
//! `tollgate_common::shared_data`) can waste a count slot or admit a value twice, never admit more
//! values. The table holds `2 × max_tenants` keys of at most 8 + 64 bytes, forever: its shared
//! memory is bounded whatever the traffic. Series already defined in the host stay there (Envoy
//! never deletes a stat): a tenant that is not admitted again is `other` from then on.
//!
//! Costs: a tenant the VM admitted in this generation costs no host call (VM cache of at most
//! `max_tenants` entries, cleared when the generation changes). Otherwise one read per probe,
//! about 1.5 on average at the table's load of at most 1/2; a new tenant adds two CAS writes.
//!
//! **Numbers.** A label is a [`Label`]: its text and a number that stands for it in the series
//! cache's keys (`crate::series`), so that a request's series are found without hashing the
//! tenant again. `none` is 0, `unauthenticated` 1, `other` [`Label::OTHER`]'s; the VM numbers the
//! others from 2 in the order it first admits them, and a label keeps its number from one
//! generation to the next (its series keep their keys). At most [`MAX_NUMBERED`] labels are
//! numbered per VM (a table of at most that many labels of at most 64 bytes); later ones are
//! [`Label::UNNUMBERED`], keyed by their text.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use tollgate_common::identity::{Identity, UNAUTHENTICATED};
use tollgate_common::shared_data::{cas_update, SharedStore};

use crate::config::{Tenant, NONE};
use crate::labels::{sanitize_bytes, Label};
use tollgate_common::bytes::same_bytes;

use crate::series::MAX_NUMBER;

/// CAS attempts to reserve a slot; when they run out the request is labelled `other`.
pub const RESERVE_ATTEMPTS: u32 = 8;
/// Longest tenant value (bytes of the header value) that gets its own label; longer: `other`.
pub const MAX_TENANT_BYTES: usize = 64;
/// Most slots probed for one tenant; beyond, the tenant is `other`.
pub const MAX_PROBES: u32 = 32;

/// The tenant label `none` (verified, without the claim).
pub const NONE_LABEL: Label<'static> = Label {
    index: 0,
    text: NONE,
};
/// The tenant label `unauthenticated`.
pub const UNAUTHENTICATED_LABEL: Label<'static> = Label {
    index: 1,
    text: UNAUTHENTICATED,
};
/// The first number of an admitted label.
const FIRST_NUMBER: u32 = 2;
/// Most admitted labels one VM numbers: numbers 2 to `crate::series::MAX_NUMBER`, the largest
/// a series key holds as a number.
pub const MAX_NUMBERED: u32 = MAX_NUMBER - FIRST_NUMBER + 1;

/// A label admitted in the current generation and its number.
#[derive(Debug)]
struct Admitted {
    label: Box<str>,
    number: u32,
}

/// One VM's view of the tenant registry.
#[derive(Debug)]
pub struct Tenants {
    prefix: String,
    count_key: String,
    max: u32,
    slots: u32,
    max_age_seconds: u64,
    /// The generation `admitted` and `full` belong to.
    generation: u64,
    /// The labels admitted in `generation` that this VM has seen, by a SipHash keyed per VM
    /// (`hasher`: tenants can be client-chosen, see `IdentitySource::Unverified`).
    admitted: HashTable<Admitted>,
    /// The number of every label this VM has admitted (in any generation), at most
    /// [`MAX_NUMBERED`]; hashed as `admitted`.
    numbers: HashTable<(Box<str>, u32)>,
    hasher: RandomState,
    /// This VM saw the count at the cap in this generation: skip reservation attempts.
    full: bool,
}

fn decode_u64(bytes: Option<&[u8]>) -> Option<u64> {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
}

/// `(generation, slots taken)` of the count record; a missing or malformed record is `(0, 0)`.
fn decode_count(value: Option<&[u8]>) -> (u64, u32) {
    let generation = decode_u64(value.and_then(|v| v.get(..8))).unwrap_or(0);
    let taken = value
        .and_then(|v| v.get(8..12))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_le_bytes);
    (generation, taken)
}

fn encode_count(generation: u64, taken: u32) -> Vec<u8> {
    let mut v = generation.to_le_bytes().to_vec();
    v.extend_from_slice(&taken.to_le_bytes());
    v
}

/// `(generation, label)` of a slot, `None` when missing or malformed (a free slot).
fn decode_slot(value: Option<&[u8]>) -> Option<(u64, &[u8])> {
    let value = value?;
    Some((decode_u64(value.get(..8))?, value.get(8..)?))
}

fn encode_slot(generation: u64, label: &str) -> Vec<u8> {
    let mut v = generation.to_le_bytes().to_vec();
    v.extend_from_slice(label.as_bytes());
    v
}

/// FNV-1a, 64 bits: a hash every VM computes alike.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Tenants {
    /// The registry of `tenant` (nothing read or written yet).
    pub fn new(tenant: &Tenant) -> Self {
        Tenants {
            prefix: format!("{}s/", tenant.key_prefix),
            count_key: format!("{}~count", tenant.key_prefix),
            max: tenant.max_tenants,
            slots: tenant.max_tenants.saturating_mul(2),
            max_age_seconds: tenant.max_age_seconds.max(1),
            generation: 0,
            admitted: HashTable::new(),
            numbers: HashTable::new(),
            hasher: RandomState::new(),
            full: false,
        }
    }

    /// Creates the count record if it does not exist (call in `on_configure`).
    pub fn ensure_registry<S: SharedStore + ?Sized>(&self, store: &S) {
        if matches!(store.get(&self.count_key), Ok((None, _))) {
            let _ = store.set(&self.count_key, &encode_count(0, 0), None);
        }
    }

    /// Number of tenants this VM has cached as admitted in its current generation.
    pub fn cached(&self) -> usize {
        self.admitted.len()
    }

    /// The tenant label of a request whose identity is `identity`, at `now` (Unix seconds):
    /// `unauthenticated`, `none` (verified, no value), the sanitised value if admitted in this
    /// generation (now, when `may_admit`, or before), else `other`; numbered as the module's
    /// documentation says.
    pub fn label<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        identity: &Identity,
        now: u64,
        may_admit: bool,
    ) -> Label<'_> {
        let raw = match identity {
            Identity::Unauthenticated => return UNAUTHENTICATED_LABEL,
            Identity::Absent | Identity::Invalid(_) => return NONE_LABEL,
            Identity::Value(v) if v.is_empty() => return NONE_LABEL,
            Identity::Value(v) => v,
        };
        if raw.len() > MAX_TENANT_BYTES {
            return Label::OTHER;
        }
        let generation = now.checked_div(self.max_age_seconds).unwrap_or(0);
        if generation != self.generation {
            self.generation = generation;
            self.admitted.clear();
            self.full = false;
        }
        // A value admitted as it is: the admitted labels are sanitised, so a value equal to one
        // is its own label, found without the UTF-8 and label checks. (The second lookup
        // borrows the label returned.)
        let raw_hash = self.hasher.hash_one(raw.as_slice());
        let is_raw = |a: &Admitted| same_bytes(a.label.as_bytes(), raw);
        if self.admitted.find(raw_hash, is_raw).is_some() {
            return self
                .admitted
                .find(raw_hash, is_raw)
                .map_or(Label::OTHER, Admitted::as_label);
        }
        let value = sanitize_bytes(raw);
        // Reserved label values: a tenant literally named so shares them.
        for reserved in [Label::OTHER, NONE_LABEL, UNAUTHENTICATED_LABEL] {
            if same_bytes(value.as_bytes(), reserved.text.as_bytes()) {
                return reserved;
            }
        }
        let hash = match &value {
            Cow::Borrowed(_) => raw_hash, // the same bytes
            Cow::Owned(label) => self.hasher.hash_one(label.as_bytes()),
        };
        let is_value = |a: &Admitted| same_bytes(a.label.as_bytes(), value.as_bytes());
        let cached = self.admitted.find(hash, is_value).is_some();
        if !cached && !self.find(store, &value, may_admit) {
            return Label::OTHER;
        }
        self.admitted
            .find(hash, is_value)
            .map_or(Label::OTHER, Admitted::as_label)
    }

    /// Whether `value` is (now) admitted in the current generation; caches it if so.
    fn find<S: SharedStore + ?Sized>(&mut self, store: &S, value: &str, may_admit: bool) -> bool {
        if self.slots == 0 {
            return false;
        }
        let generation = self.generation;
        let slots = u64::from(self.slots);
        let start = fnv1a(value.as_bytes()).checked_rem(slots).unwrap_or(0);
        let mut reserved = false;
        for probe in 0..MAX_PROBES.min(self.slots) {
            let index = start
                .saturating_add(u64::from(probe))
                .checked_rem(slots)
                .unwrap_or(0);
            let key = format!("{}{index}", self.prefix);
            // A store that cannot be read admits nobody: the value is labelled `other`.
            let Ok((current, cas)) = store.get(&key) else {
                return false;
            };
            match decode_slot(current.as_deref()) {
                Some((g, label)) if g == generation && label == value.as_bytes() => {
                    return self.remember(value)
                }
                Some((g, _)) if g == generation => continue,
                // Written by a VM whose clock is already in the next generation.
                Some((g, _)) if g > generation => return false,
                _ => {} // free: missing, malformed or stale
            }
            // Linear probing without deletes: the first free slot ends the search.
            if !may_admit || self.full {
                return false;
            }
            if !reserved {
                if !self.reserve(store) {
                    return false;
                }
                reserved = true;
            }
            if store
                .set(&key, &encode_slot(generation, value), cas)
                .is_ok()
            {
                return self.remember(value);
            }
            // Another VM took the slot meanwhile: it may have admitted this very tenant.
            let now_there = store.get(&key).ok().and_then(|(v, _)| v);
            if decode_slot(now_there.as_deref()) == Some((generation, value.as_bytes())) {
                return self.remember(value);
            }
        }
        false
    }

    /// Reserves one of the generation's `max_tenants` slots in the count record.
    fn reserve<S: SharedStore + ?Sized>(&mut self, store: &S) -> bool {
        let (generation, max) = (self.generation, self.max);
        let mut reserved = false;
        let outcome = cas_update(store, &self.count_key, RESERVE_ATTEMPTS, |current| {
            reserved = false;
            let (g, taken) = decode_count(current);
            let taken = match g.cmp(&generation) {
                std::cmp::Ordering::Less => 0,
                std::cmp::Ordering::Equal => taken,
                std::cmp::Ordering::Greater => return None,
            };
            if taken >= max {
                return None;
            }
            reserved = true;
            Some(encode_count(generation, taken.saturating_add(1)))
        });
        if outcome.is_err() {
            return false;
        }
        if !reserved {
            self.full = true;
        }
        reserved
    }

    fn remember(&mut self, value: &str) -> bool {
        if self.admitted.len() >= usize::try_from(self.max).unwrap_or(usize::MAX) {
            // Cannot happen while the registry holds (admitted ⊆ registry ≤ max); stay bounded.
            return false;
        }
        let hasher = &self.hasher;
        let hash = hasher.hash_one(value.as_bytes());
        let known = self
            .numbers
            .find(hash, |(label, _)| {
                same_bytes(label.as_bytes(), value.as_bytes())
            })
            .map(|(_, n)| *n);
        let number = match known {
            Some(n) => n,
            None => match u32::try_from(self.numbers.len()) {
                Ok(taken) if taken < MAX_NUMBERED => {
                    let n = FIRST_NUMBER.saturating_add(taken);
                    self.numbers
                        .insert_unique(hash, (value.into(), n), |(label, _)| {
                            hasher.hash_one(label.as_bytes())
                        });
                    n
                }
                _ => Label::UNNUMBERED,
            },
        };
        let admitted = Admitted {
            label: value.into(),
            number,
        };
        self.admitted
            .insert_unique(hash, admitted, |a| hasher.hash_one(a.label.as_bytes()));
        true
    }
}

impl Admitted {
    fn as_label(&self) -> Label<'_> {
        Label {
            index: self.number,
            text: &self.label,
        }
    }
}
