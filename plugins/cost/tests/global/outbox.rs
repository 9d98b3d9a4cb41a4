//! The outbox of bookings not yet sent: what a tenant has pending, when a booking asks for a
//! short tick, periods that ended before sending, merging and its bound.

use tollgate_cost::global::{batch_request, Booking, Limits, Outbox, Pending, SendTicks};
use tollgate_cost::ledger::Budget;
use tollgate_cost::period::Periods;

use crate::support::{budget_only, global, key, JAN31_NOON};

#[test]
fn the_outbox_says_what_a_tenant_has_pending_in_the_current_periods() {
    let now = Periods::at(JAN31_NOON);
    let (today, month) = (now.day, now.month);
    let mut o = Outbox::new(16);
    for (k, units) in [
        (key("alice", today, month), 3),
        (key("alice", today, 0), 4),         // no month budget
        (key("alice", 0, month), 5),         // no day budget
        (key("alice", today - 1, month), 6), // yesterday: this month only
        (key("alice", today, month - 1), 7), // a stale month
        (key("alic", today, month), 100),    // a prefix of the tenant
        (key("alice2", today, month), 100),  // the tenant is a prefix
        (key("alice_", today, month), 100),
        (key("", today, month), 100),
    ] {
        assert!(o.push(Booking { key: k, units }));
    }
    assert_eq!(
        o.pending("alice", &now),
        Pending {
            month: 3 + 5 + 6,
            day: 3 + 4 + 7
        }
    );
    assert_eq!(o.pending("nobody", &now), Pending::default());
    // Saturates instead of wrapping (a wrap would admit).
    let mut o = Outbox::new(4);
    assert!(o.push(Booking {
        key: key("t", today, month),
        units: u32::MAX
    }));
    assert!(o.push(Booking {
        key: key("t", 0, month),
        units: 2
    }));
    assert_eq!(o.pending("t", &now).month, u32::MAX);
    // Taking (sending) the bookings empties what is pending.
    o.take(BATCH);
    assert_eq!(o.pending("t", &now), Pending::default());
}

const BATCH: usize = 64;

#[test]
fn a_booking_asks_for_a_short_tick_only_when_nothing_would_send_it_sooner() {
    let t = SendTicks::new(100, 1);
    assert_eq!(t.period_ms(), 100);
    assert_eq!(t.ticked(), None, "idle: nothing to change");
    // The first booking of a quiet worker: a 1 ms tick, asked once.
    assert_eq!(t.queued(), Some(1));
    t.asked(1);
    assert_eq!(t.queued(), None, "already asked for");
    // The tick sends the batch (a call in flight), then asks for the regular period.
    t.set_in_flight(true);
    assert_eq!(t.ticked(), Some(100));
    t.asked(100);
    assert_eq!(t.ticked(), None);
    // While the call is in flight its reply sends the next batch: no early tick.
    assert_eq!(t.queued(), None);
    t.set_in_flight(false);
    assert_eq!(t.queued(), Some(1));
    // A period the host refused is not taken: the next booking asks again.
    assert_eq!(t.queued(), Some(1), "not taken, asked again");
    t.asked(1);
    assert_eq!(t.queued(), None);
    // A tick that could send nothing (breaker open, dispatch refused) still goes back to 100.
    assert_eq!(t.ticked(), Some(100));
}

#[test]
fn bookings_drop_periods_that_ended_before_they_are_sent() {
    let g = global(1);
    let both = Limits::of(
        &g,
        &Budget {
            day: Some(10),
            month: Some(100),
        },
    );
    // 2025-01-31T23:59:59Z, then the next second (a new day and month), and a day later in the
    // same month as the first (2025-01-30 → 01-31).
    let t0 = Periods::at(1_738_367_999);
    let t1 = Periods::at(1_738_368_000);
    let b = Booking::new(&g, "alice", &both, &t0, 7).unwrap();
    let send = |now: &Periods| {
        batch_request(
            "tollgate",
            "default",
            vec![b.clone()],
            now,
            &budget_only(both),
        )
    };
    let same = send(&t0);
    let d = &same.request.unwrap().descriptors;
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|d| d.hits_addend == Some(7)));
    assert_eq!(d[0].entries[0].value, "20:default/month/202501");
    assert_eq!(d[1].entries[0].value, "20:default/day/20250131");
    let later = send(&t1);
    assert_eq!((later.request, later.stale, later.sent.len()), (None, 1, 0));
    let jan30 = Periods::at(1_738_200_000);
    assert_eq!(jan30.day, 20250130);
    let b30 = Booking::new(&g, "alice", &both, &jan30, 7).unwrap();
    let next_day = batch_request("tollgate", "default", vec![b30], &t0, &budget_only(both));
    let d = next_day.request.unwrap().descriptors;
    assert_eq!(d.len(), 1, "only the month is still current");
    assert_eq!(d[0].entries[0].value, "20:default/month/202501");
    // A tenant whose budget was removed since: nothing to send for it.
    let gone = batch_request(
        "tollgate",
        "default",
        vec![b.clone()],
        &t0,
        &budget_only(Limits::default()),
    );
    assert_eq!((gone.request, gone.stale), (None, 1));
    // Several tenants share one call, each with its own hits.
    let c = Booking::new(&g, "carol", &both, &t0, 3).unwrap();
    let two = batch_request("tollgate", "default", vec![b, c], &t0, &budget_only(both));
    let hits: Vec<_> = two
        .request
        .unwrap()
        .descriptors
        .iter()
        .map(|d| d.hits_addend)
        .collect();
    assert_eq!(hits, vec![Some(7), Some(7), Some(3), Some(3)]);
}

#[test]
fn the_outbox_merges_and_is_bounded() {
    let mut o = Outbox::new(2);
    assert!(o.push(Booking {
        key: key("a", 1, 1),
        units: 5
    }));
    assert!(o.push(Booking {
        key: key("a", 1, 1),
        units: u32::MAX
    }));
    assert!(o.push(Booking {
        key: key("b", 1, 1),
        units: 1
    }));
    assert!(
        !o.push(Booking {
            key: key("c", 1, 1),
            units: 1
        }),
        "full: dropped"
    );
    assert!(
        o.push(Booking {
            key: key("b", 1, 1),
            units: 1
        }),
        "merging needs no room"
    );
    assert_eq!(o.len(), 2);
    let first = o.take(1);
    assert_eq!(
        first,
        vec![Booking {
            key: key("a", 1, 1),
            units: u32::MAX
        }],
        "saturated"
    );
    assert_eq!(
        o.take(10),
        vec![Booking {
            key: key("b", 1, 1),
            units: 2
        }]
    );
    assert!(o.is_empty());
}
