//! Unit tests of `shm_kv` zones (on ordinary memory, threads and forked processes).

use super::layout::*;
use super::table::*;
use super::{route_index, DuplicateZone, ZoneSet};
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

fn zone(len: usize, eviction: Eviction) -> KvZone {
    let region = SharedRegion::anonymous(len).unwrap();
    KvZone::attach(region, "*", Init::Fresh, eviction).unwrap()
}

#[test]
fn cas_semantics_follow_ngx_wasm_module() {
    let z = zone(64 * 1024, Eviction::None);
    assert_eq!(z.get(b"k"), Err(KvError::NotFound));
    // missing key, cas != 0: mismatch
    assert_eq!(z.set(b"k", b"v", 7), Err(KvError::CasMismatch));
    // missing key, cas 0: created with token 1
    z.set(b"k", b"v1", 0).unwrap();
    assert_eq!(z.get(b"k").unwrap(), (b"v1".to_vec(), 1));
    // existing key, cas 0: mismatch (Envoy would overwrite)
    assert_eq!(z.set(b"k", b"x", 0), Err(KvError::CasMismatch));
    // existing key, wrong token: mismatch
    assert_eq!(z.set(b"k", b"x", 2), Err(KvError::CasMismatch));
    // existing key, its token: written, token + 1
    z.set(b"k", b"v2", 1).unwrap();
    assert_eq!(z.get(b"k").unwrap(), (b"v2".to_vec(), 2));
    // stale token after a write: mismatch
    assert_eq!(z.set(b"k", b"v3", 1), Err(KvError::CasMismatch));
    // tokens are per key
    z.set(b"other", b"o", 0).unwrap();
    assert_eq!(z.get(b"other").unwrap().1, 1);
    // empty key and empty value are fine
    z.set(b"", b"", 0).unwrap();
    assert_eq!(z.get(b"").unwrap(), (Vec::new(), 1));
    // delete needs the token
    assert_eq!(z.delete(b"k", 1), Err(KvError::CasMismatch));
    z.delete(b"k", 2).unwrap();
    assert_eq!(z.get(b"k"), Err(KvError::NotFound));
    assert_eq!(z.delete(b"k", 2), Err(KvError::NotFound));
}

/// The keys' buckets come from a hash keyed by seeds drawn when a zone is formatted: a client
/// who learns where its keys fall in one zone learns nothing of another (hash flooding), while
/// every process attached to one zone places a key alike.
#[test]
fn bucket_placement_is_keyed_per_zone_and_shared_by_its_processes() {
    let keys: Vec<Vec<u8>> = (0..64)
        .map(|i| format!("ratelimit/ns/r/0/client-{i}").into_bytes())
        .collect();
    let place = |z: &KvZone| -> Vec<(usize, usize, u32)> {
        keys.iter().map(|k| z.locate(k).unwrap()).collect()
    };
    let region = SharedRegion::anonymous(256 * 1024).unwrap();
    let a = KvZone::attach(region.clone(), "*", Init::Fresh, Eviction::None).unwrap();
    let again = KvZone::attach(region, "*", Init::Existing, Eviction::None).unwrap();
    assert_eq!(place(&a), place(&again));
    let b = zone(256 * 1024, Eviction::None);
    assert_ne!(
        place(&a),
        place(&b),
        "two zones' seeds placed 64 keys alike"
    );
}

#[test]
fn token_skips_zero_when_it_wraps() {
    let z = zone(8192, Eviction::None);
    z.set(b"k", b"v", 0).unwrap();
    let (stripe, head_off, tag) = z.locate(b"k").unwrap();
    let entry = {
        let _g = z.lock_stripe(stripe).unwrap();
        z.find(head_off, tag, b"k").unwrap().unwrap().1
    };
    z.put(entry, E_CAS, u32::MAX).unwrap();
    z.set(b"k", b"w", u32::MAX).unwrap();
    assert_eq!(z.get(b"k").unwrap(), (b"w".to_vec(), 1));
}

fn increment(z: &KvZone, key: &[u8]) -> u32 {
    let mut mismatches = 0;
    loop {
        let (n, cas) = match z.get(key) {
            Ok((v, cas)) => (u64::from_le_bytes(v.try_into().unwrap()), cas),
            Err(KvError::NotFound) => (0, 0),
            Err(e) => panic!("{e}"),
        };
        match z.set(key, &(n + 1).to_le_bytes(), cas) {
            Ok(()) => return mismatches,
            Err(KvError::CasMismatch) => mismatches += 1,
            Err(e) => panic!("{e}"),
        }
    }
}

fn count(z: &KvZone, key: &[u8]) -> u64 {
    u64::from_le_bytes(z.get(key).unwrap().0.try_into().unwrap())
}

#[test]
fn threads_incrementing_by_cas_lose_no_update() {
    let z = zone(64 * 1024, Eviction::None);
    const THREADS: usize = 4;
    const EACH: u64 = 3000;
    let mismatches: u32 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let z = z.clone();
                s.spawn(move || (0..EACH).map(|_| increment(&z, b"counter")).sum::<u32>())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(count(&z, b"counter"), THREADS as u64 * EACH);
    assert_eq!(z.get(b"counter").unwrap().1, (THREADS as u64 * EACH) as u32);
    eprintln!("threads: {mismatches} CAS mismatches retried");
}

#[test]
fn forked_processes_incrementing_by_cas_lose_no_update() {
    let region = SharedRegion::anonymous(64 * 1024).unwrap();
    let z = KvZone::attach(region.clone(), "*", Init::Fresh, Eviction::None).unwrap();
    const CHILDREN: usize = 3;
    const EACH: u64 = 3000;
    let codes = crate::shm::fork_children(CHILDREN, |i| {
        // Each child attaches the existing zone, as an nginx worker would.
        let Ok(z) = KvZone::attach(region.clone(), "*", Init::Existing, Eviction::None) else {
            return false;
        };
        for _ in 0..EACH {
            increment(&z, b"shared");
            // a per-child key too, in other stripes
            increment(&z, format!("child-{i}").as_bytes());
        }
        true
    });
    assert_eq!(codes, vec![0; CHILDREN]);
    assert_eq!(count(&z, b"shared"), CHILDREN as u64 * EACH);
    for i in 0..CHILDREN {
        assert_eq!(count(&z, format!("child-{i}").as_bytes()), EACH);
    }
    assert_eq!(z.stats().keys, 1 + CHILDREN as u32);
}

#[test]
fn a_worker_dying_with_a_lock_does_not_wedge_the_zone() {
    let region = SharedRegion::anonymous(64 * 1024).unwrap();
    let z = KvZone::attach(region.clone(), "*", Init::Fresh, Eviction::None).unwrap();
    z.set(b"k", b"v", 0).unwrap();
    // The parent's pid is cached before the fork; the child must not reuse it.
    let parent = crate::shm::current_pid();
    let codes = crate::shm::fork_children(1, |_| {
        if crate::shm::current_pid() == parent || crate::shm::current_pid() != std::process::id() {
            return false;
        }
        // Take k's stripe lock and exit without releasing it (a crashed worker).
        let Ok((stripe, _, _)) = z.locate(b"k") else {
            return false;
        };
        let Ok(guard) = z.lock_stripe(stripe) else {
            return false;
        };
        std::mem::forget(guard);
        true
    });
    assert_eq!(codes, vec![0]);
    // The child is dead and reaped: the next writer takes the lock over.
    z.set(b"k", b"w", 1).unwrap();
    assert_eq!(z.get(b"k").unwrap(), (b"w".to_vec(), 2));
    assert_eq!(z.stats().lock_takeovers, 1);
}

#[test]
fn sentinel_mismatch_refuses_to_attach() {
    let region = SharedRegion::anonymous(64 * 1024).unwrap();
    let z = KvZone::attach(region.clone(), "a", Init::Fresh, Eviction::None).unwrap();
    z.set(b"k", b"v", 0).unwrap();
    // Same memory, same size: attaches and sees the data.
    let again = KvZone::attach(region.clone(), "a", Init::Existing, Eviction::None).unwrap();
    assert_eq!(again.get(b"k").unwrap().0, b"v");
    // Another size (e.g. the directive changed): refused.
    let smaller = region.prefix(32 * 1024).unwrap();
    assert_eq!(
        KvZone::attach(smaller, "a", Init::Existing, Eviction::None).unwrap_err(),
        AttachError::Mismatch {
            field: "zone size",
            expected: 32 * 1024,
            found: 64 * 1024
        }
    );
    // Another layout version: refused.
    region
        .u32_at(H_VERSION)
        .unwrap()
        .store(VERSION + 1, Ordering::Relaxed);
    assert!(matches!(
        KvZone::attach(region.clone(), "a", Init::Existing, Eviction::None),
        Err(AttachError::Mismatch {
            field: "layout version",
            ..
        })
    ));
    // Memory that never held a zone: refused.
    let blank = SharedRegion::anonymous(64 * 1024).unwrap();
    assert_eq!(
        KvZone::attach(blank, "a", Init::Existing, Eviction::None).unwrap_err(),
        AttachError::NotInitialized
    );
    // Too small.
    let tiny = SharedRegion::anonymous(1024).unwrap();
    assert_eq!(
        KvZone::attach(tiny, "a", Init::Fresh, Eviction::None).unwrap_err(),
        AttachError::TooSmall {
            len: 1024,
            min: MIN_ZONE_BYTES
        }
    );
}

#[test]
fn full_zone_refuses_without_corruption() {
    let z = zone(MIN_ZONE_BYTES, Eviction::None);
    let blocks = z.layout().blocks;
    // Each entry: 8-byte key + 100-byte value = 108 bytes = 3 blocks.
    let value = [7u8; 100];
    let mut stored = Vec::new();
    loop {
        let key = format!("key{:05}", stored.len());
        match z.set(key.as_bytes(), &value, 0) {
            Ok(()) => stored.push(key),
            Err(KvError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(stored.len(), blocks as usize / 3);
    // Everything stored reads back intact; the zone is still usable.
    for key in &stored {
        assert_eq!(z.get(key.as_bytes()).unwrap(), (value.to_vec(), 1));
    }
    // Growing a value that no longer fits fails and leaves the old value.
    let big = vec![1u8; 500];
    assert_eq!(z.set(stored[0].as_bytes(), &big, 1), Err(KvError::NoSpace));
    assert_eq!(z.get(stored[0].as_bytes()).unwrap(), (value.to_vec(), 1));
    // Larger than the zone: TooLarge.
    assert_eq!(
        z.set(b"huge", &vec![0u8; MIN_ZONE_BYTES * 2], 0),
        Err(KvError::TooLarge)
    );
    // Freeing makes room again, and all blocks come back.
    for key in &stored {
        z.delete(key.as_bytes(), 1).unwrap();
    }
    let s = z.stats();
    assert_eq!((s.keys, s.free_blocks), (0, blocks));
    z.set(stored[0].as_bytes(), &big, 0).unwrap();
}

#[test]
fn lru_evicts_old_entries_to_make_room() {
    let z = zone(16 * 1024, Eviction::Lru);
    let value = [3u8; 100];
    // Stamps have the coarse clock's resolution (a few ms): make k0 strictly the oldest.
    z.set(b"k0", &value, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    for i in 1..2000u32 {
        z.set(format!("k{i}").as_bytes(), &value, 0).unwrap();
    }
    let s = z.stats();
    assert!(s.evictions > 0, "{s:?}");
    // The most recent key is there; the very first ones were evicted.
    assert_eq!(z.get(b"k1999").unwrap().0, value);
    assert_eq!(z.get(b"k0"), Err(KvError::NotFound));
    // A value needing many blocks evicts several entries.
    let jwks = vec![b'j'; 4096];
    z.set(b"jwks", &jwks, 0).unwrap();
    assert_eq!(z.get(b"jwks").unwrap().0, jwks);
}

#[test]
fn eviction_directive_values() {
    assert_eq!(Eviction::from_directive(None), Ok(Eviction::Lru));
    assert_eq!(
        Eviction::from_directive(Some("eviction=none")),
        Ok(Eviction::None)
    );
    assert_eq!(
        Eviction::from_directive(Some("eviction=lru")),
        Ok(Eviction::Lru)
    );
    assert_eq!(
        Eviction::from_directive(Some("eviction=slru")),
        Ok(Eviction::Lru)
    );
    assert_eq!(
        Eviction::from_directive(Some("eviction=fifo")),
        Err(UnsupportedEviction("fifo".into()))
    );
}

#[test]
fn eviction_policies_keep_the_directives_name() {
    let table = [
        (None, EvictionPolicy::Lru, "lru", Eviction::Lru),
        (
            Some("eviction=lru"),
            EvictionPolicy::Lru,
            "lru",
            Eviction::Lru,
        ),
        (
            Some("eviction=slru"),
            EvictionPolicy::Slru,
            "slru",
            Eviction::Lru,
        ),
        (
            Some("eviction=none"),
            EvictionPolicy::None,
            "none",
            Eviction::None,
        ),
    ];
    for (arg, policy, name, eviction) in table {
        assert_eq!(EvictionPolicy::from_directive(arg), Ok(policy), "{arg:?}");
        assert_eq!((policy.as_str(), policy.eviction()), (name, eviction));
    }
    assert_eq!(
        EvictionPolicy::from_directive(Some("eviction=NONE")),
        Err(UnsupportedEviction("NONE".into()))
    );
}

#[test]
fn large_values_round_trip_and_resize() {
    let z = zone(256 * 1024, Eviction::None);
    let initial_free = z.stats().free_blocks;
    let jwks: Vec<u8> = (0..16 * 1024).map(|i| (i % 251) as u8).collect();
    z.set(b"jwks/issuer", &jwks, 0).unwrap();
    assert_eq!(z.get(b"jwks/issuer").unwrap(), (jwks.clone(), 1));
    assert_eq!(
        initial_free - z.stats().free_blocks,
        KvLayout::blocks_for(11, jwks.len()) as u32
    );
    // shrink, grow, shrink to inline
    z.set(b"jwks/issuer", b"small", 1).unwrap();
    assert_eq!(z.get(b"jwks/issuer").unwrap(), (b"small".to_vec(), 2));
    let mid = vec![9u8; 1000];
    z.set(b"jwks/issuer", &mid, 2).unwrap();
    assert_eq!(z.get(b"jwks/issuer").unwrap(), (mid, 3));
    z.set(b"jwks/issuer", &jwks, 3).unwrap();
    assert_eq!(z.get(b"jwks/issuer").unwrap(), (jwks, 4));
    z.delete(b"jwks/issuer", 4).unwrap();
    assert_eq!(z.stats().free_blocks, initial_free);
}

#[test]
fn get_into_replaces_what_the_buffer_held() {
    // One buffer read into again and again (the host core's): each read gives exactly the
    // value, longer or shorter than the last, and a missing key leaves nothing of the last.
    let z = zone(256 * 1024, Eviction::None);
    let long: Vec<u8> = (0..5000).map(|i| (i % 251) as u8).collect();
    z.set(b"a", &long, 0).unwrap();
    z.set(b"b", b"short", 0).unwrap();
    let mut buf = Vec::new();
    assert_eq!(z.get_into(b"a", &mut buf), Ok(1));
    assert_eq!(buf, long);
    assert_eq!(z.get_into(b"b", &mut buf), Ok(1));
    assert_eq!(buf, b"short");
    assert_eq!(z.get_into(b"missing", &mut buf), Err(KvError::NotFound));
    assert!(buf.is_empty());
    assert_eq!(z.get_into(b"a", &mut buf), Ok(1));
    assert_eq!(buf, long);
}

#[test]
fn random_operations_match_a_model() {
    let z = zone(32 * 1024, Eviction::None);
    let initial_free = z.stats().free_blocks;
    let mut model: HashMap<Vec<u8>, (Vec<u8>, u32)> = HashMap::new();
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..20_000 {
        let key = format!("key-{}", rnd(200)).into_bytes();
        match rnd(10) {
            0..=5 => {
                let len = match rnd(4) {
                    0 => rnd(20),
                    1 => rnd(100),
                    2 => rnd(400),
                    _ => 0,
                } as usize;
                let value: Vec<u8> = (0..len).map(|i| (i as u8) ^ (len as u8)).collect();
                let cas = model.get(&key).map_or(0, |(_, c)| *c);
                match z.set(&key, &value, cas) {
                    Ok(()) => {
                        model.insert(key, (value, cas + 1));
                    }
                    Err(KvError::NoSpace) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            6 => {
                if let Some((_, cas)) = model.get(&key) {
                    z.delete(&key, *cas).unwrap();
                    model.remove(&key);
                }
            }
            _ => match model.get(&key) {
                Some(v) => assert_eq!(&z.get(&key).unwrap(), v),
                None => assert_eq!(z.get(&key), Err(KvError::NotFound)),
            },
        }
    }
    assert_eq!(z.stats().keys as usize, model.len());
    let used: usize = model
        .iter()
        .map(|(k, (v, _))| KvLayout::blocks_for(k.len(), v.len()))
        .sum();
    assert_eq!((initial_free - z.stats().free_blocks) as usize, used);
}

#[test]
fn zone_set_routes_like_ngx_wasm_module() {
    let mk = |name: &str| {
        KvZone::attach(
            SharedRegion::anonymous(8192).unwrap(),
            name,
            Init::Fresh,
            Eviction::None,
        )
        .unwrap()
    };
    let mut set = ZoneSet::new();
    set.insert(mk("rl")).unwrap();
    assert_eq!(set.insert(mk("rl")), Err(DuplicateZone("rl".into())));
    // No default zone yet: keys outside "rl/" have nowhere to go.
    assert_eq!(set.set(b"other/x", b"v", 0), Err(KvError::NoZone));
    assert_eq!(set.get(b"x"), Err(KvError::NoZone));
    set.insert(mk("*")).unwrap();
    set.set(b"rl/a", b"1", 0).unwrap();
    set.set(b"other/x", b"2", 0).unwrap();
    set.set(b"/x", b"3", 0).unwrap();
    set.set(b"plain", b"4", 0).unwrap();
    assert_eq!(set.route(b"rl/a").unwrap().name(), "rl");
    assert_eq!(set.route(b"rl").unwrap().name(), "*");
    assert_eq!(set.route(b"rlx/a").unwrap().name(), "*");
    assert_eq!(set.zone("rl").unwrap().get(b"rl/a").unwrap().0, b"1");
    assert_eq!(set.zone("*").unwrap().get(b"other/x").unwrap().0, b"2");
    assert_eq!(set.zone("*").unwrap().get(b"/x").unwrap().0, b"3");
    assert_eq!(set.get(b"plain").unwrap().0, b"4");
}

#[test]
fn route_index_routes_names_as_the_zone_set_routes_zones() {
    let names = ["rl", "*", "cost"];
    let route = |key: &[u8]| route_index(names, key);
    assert_eq!(route(b"rl/a"), Some(0));
    assert_eq!(route(b"cost/tenant/x"), Some(2));
    assert_eq!(route(b"rl"), Some(1));
    assert_eq!(route(b"rlx/a"), Some(1));
    assert_eq!(route(b"/rl/a"), Some(1));
    assert_eq!(route(b""), Some(1));
    assert_eq!(route(b"*/x"), Some(1));
    // Without a `*` zone, only named keys have a zone.
    assert_eq!(route_index(["rl"], b"rl/a"), Some(0));
    assert_eq!(route_index(["rl"], b"other/a"), None);
    assert_eq!(route_index(std::iter::empty::<&str>(), b"x"), None);
}

#[test]
fn a_zone_of_ngx_wasm_modules_minimum_size_holds_entries() {
    // `shm_kv NAME 12k;` is the smallest zone Kong's module accepts (3 pages); nginx-compat
    // accepts it too. Its layout has room for a couple of hundred small entries.
    let z = zone(12 * 1024, Eviction::None);
    let layout = KvLayout::for_len(12 * 1024).unwrap();
    assert!(layout.blocks >= 150, "{layout:?}");
    for i in 0..150u32 {
        z.set(format!("k{i}").as_bytes(), b"value", 0).unwrap();
    }
    assert_eq!(z.get(b"k149").unwrap().0, b"value");
}
