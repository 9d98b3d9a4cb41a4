//! The shared replay queue: round trips, merging and its bound, and an encoding that refuses
//! truncations.

use tollgate_common::shared_data::{MemoryStore, Semantics, SharedStore};
use tollgate_cost::global::{Booking, BookingKey};
use tollgate_cost::month_windows::Counter;
use tollgate_cost::replay_queue::{decode_queue, encode_queue, ReplayQueue};
use tollgate_cost::token_limits::global::TokenTarget;
use tollgate_cost::token_limits::window::Per;

use crate::support::key;

#[test]
fn the_replay_queue_round_trips_merges_and_is_bounded() {
    for sem in [Semantics::Envoy, Semantics::NgxWasm] {
        let store = MemoryStore::new(sem);
        let q = ReplayQueue::new("default", 3);
        assert_eq!(q.key, "cost/default/~replay");
        assert_eq!(q.take(&store, 10).unwrap(), vec![], "missing: empty");
        store.set(&q.key, &encode_queue(&[]), None).unwrap();
        let b = |t: &str, u| Booking {
            key: key(t, 20250131, 202501),
            units: u,
        };
        let r = q.push(&store, &[b("a", 1), b("b", 2), b("a", 3)]).unwrap();
        assert_eq!((r.kept, r.dropped, r.corrupt), (3, 0, false));
        let r = q.push(&store, &[b("c", 1), b("d", 1), b("b", 1)]).unwrap();
        assert_eq!(
            (r.kept, r.dropped),
            (2, 1),
            "{sem:?}: d finds the queue full"
        );
        assert_eq!(q.take(&store, 2).unwrap(), vec![b("a", 4), b("b", 3)]);
        assert_eq!(q.take(&store, 2).unwrap(), vec![b("c", 1)]);
        assert_eq!(q.take(&store, 2).unwrap(), vec![]);
        // A value that is not a queue is replaced, said so.
        let (_, cas) = store.get(&q.key).unwrap();
        store.set(&q.key, b"\x07garbage", cas).unwrap();
        let r = q.push(&store, &[b("e", 1)]).unwrap();
        assert!(r.corrupt);
        assert_eq!(q.take(&store, 9).unwrap(), vec![b("e", 1)]);
        // A store that fails: an error, nothing taken.
        store.set_failing_reads(true);
        assert!(q.take(&store, 1).is_err());
        assert!(q.push(&store, &[b("f", 1)]).is_err());
    }
}

#[test]
fn the_queue_encoding_refuses_truncations() {
    let bookings = vec![
        Booking {
            key: key("alice", 20250131, 202501),
            units: 9,
        },
        Booking {
            key: key(&"t".repeat(128), 0, 202501),
            units: u32::MAX,
        },
        Booking {
            key: BookingKey {
                into: Some(Counter::Bridge),
                ..key("bob", 0, 202612)
            },
            units: 7,
        },
        Booking {
            key: BookingKey {
                tokens: Some(TokenTarget {
                    limit: "tpm".into(),
                    per: Per::Minute,
                    window: 29_000_000,
                }),
                ..key("carol", 0, 0)
            },
            units: 7,
        },
    ];
    let bytes = encode_queue(&bookings);
    assert_eq!(decode_queue(&bytes), Some(bookings.clone()));
    // Every prefix that ends a booking decodes to the bookings before it; any other is refused.
    let ends: Vec<usize> = (0..=bookings.len())
        .map(|k| encode_queue(&bookings[..k]).len())
        .collect();
    assert_eq!(ends[1], 1 + 1 + 5 + 13);
    for n in 0..bytes.len() {
        let d = decode_queue(&bytes[..n]);
        match ends.iter().position(|&e| e == n) {
            Some(k) => assert_eq!(d, Some(bookings[..k].to_vec()), "prefix {n}"),
            None => assert_eq!(d, None, "prefix {n}"),
        }
    }
    assert_eq!(decode_queue(&[]), None);
    assert_eq!(decode_queue(&[3]), None, "another version");
    // A kind byte that is neither spend (0), a carry's counter (1, 2) nor tokens (3).
    let mut bad = encode_queue(&bookings[..1]);
    if let Some(last) = bad.last_mut() {
        *last = 9;
    }
    assert_eq!(decode_queue(&bad), None);
    // A token record whose window length is not 1, 2 or 3 (it comes before the u64 window).
    let mut bad = encode_queue(&bookings[3..]);
    let per = bad.len() - 9;
    assert_eq!(bad[per], 1, "minute");
    bad[per] = 4;
    assert_eq!(decode_queue(&bad), None);
    // Version 1 (no counter byte), written before an upgrade, is still read.
    let mut v1 = vec![1u8, 5];
    v1.extend_from_slice(b"alice");
    for n in [20250131u32, 202501, 9] {
        v1.extend_from_slice(&n.to_le_bytes());
    }
    assert_eq!(decode_queue(&v1), Some(bookings[..1].to_vec()));
    assert_eq!(
        decode_queue(&[1, 2, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        None,
        "not UTF-8"
    );
}
