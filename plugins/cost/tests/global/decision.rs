//! The decision from the service's reply: a spent budget refused as in local mode, this worker's
//! unsent bookings taken off the remaining, and hostile replies (failures for `on_error`, never
//! traps).

use tollgate_common::rls::{self, CallFailure, ReplyError};
use tollgate_cost::global::{decide, Decision, Pending, Period};
use tollgate_cost::period::Periods;
use tollgate_cost::replay_queue::decode_queue;

use crate::reference::{reply, verdict_of};
use crate::support::JAN31_NOON;

#[test]
fn the_decision_refuses_a_spent_budget_as_local_mode_does() {
    let now = Periods::at(JAN31_NOON);
    let both = [Period::Month, Period::Day];
    let decision = |s: &[(u32, u64)], needed| {
        decide(
            &both,
            &verdict_of(&reply(s), 2).unwrap(),
            &now,
            needed,
            &Pending::default(),
        )
    };
    assert_eq!(decision(&[(100, 10), (10, 9)], 0), Decision::Admit);
    // Exactly at the limit: the server answers OK with 0 remaining; spend >= budget refuses.
    let Decision::Refuse(e) = decision(&[(100, 10), (10, 10)], 0) else {
        panic!("admitted at the limit");
    };
    assert_eq!((e.period, e.reset_secs), ("day", now.day_reset_secs));
    assert_eq!(
        e.reset_secs,
        12 * 3600,
        "the calendar day's reset, not the server's"
    );
    // Over the month: refused as month, also when the day is spent too.
    let Decision::Refuse(e) = decision(&[(100, 101), (10, 10)], 0) else {
        panic!("admitted over the month");
    };
    assert_eq!((e.period, e.reset_secs), ("month", now.month_reset_secs));
    // Less left than the request is known to need.
    assert_eq!(decision(&[(100, 10), (10, 7)], 3), Decision::Admit);
    assert!(matches!(
        decision(&[(100, 10), (10, 7)], 4),
        Decision::Refuse(_)
    ));
    // A budget below one unit (limit 0) is always spent.
    assert!(matches!(
        decide(
            &[Period::Day],
            &verdict_of(&reply(&[(0, 0)]), 1).unwrap(),
            &now,
            0,
            &Pending::default()
        ),
        Decision::Refuse(_)
    ));
}

#[test]
fn the_decision_takes_this_workers_unsent_bookings_off_the_remaining() {
    let now = Periods::at(JAN31_NOON);
    let both = [Period::Month, Period::Day];
    let decision = |s: &[(u32, u64)], needed, pending: Pending| {
        decide(
            &both,
            &verdict_of(&reply(s), 2).unwrap(),
            &now,
            needed,
            &pending,
        )
    };
    // 100 - 90 = 10 units left of the day by the service's count.
    let day = |day| Pending { month: 0, day };
    assert_eq!(
        decision(&[(1000, 90), (100, 90)], 0, day(9)),
        Decision::Admit
    );
    // 10 queued here: the budget is spent once they are counted (spend >= budget refuses).
    let Decision::Refuse(e) = decision(&[(1000, 90), (100, 90)], 0, day(10)) else {
        panic!("admitted with the day's remaining all queued here");
    };
    assert_eq!(e.period, "day");
    // More queued than the service has left (counted elsewhere meanwhile): no underflow.
    assert!(matches!(
        decision(&[(1000, 90), (100, 90)], 0, day(u32::MAX)),
        Decision::Refuse(_)
    ));
    // Per period: the month's pending spends the month, not the day.
    let Decision::Refuse(e) = decision(&[(1000, 995), (100, 90)], 0, Pending { month: 5, day: 0 })
    else {
        panic!("admitted with the month's remaining all queued here");
    };
    assert_eq!(e.period, "month");
    assert_eq!(
        decision(&[(1000, 995), (100, 90)], 0, Pending { month: 4, day: 9 }),
        Decision::Admit
    );
    // A cost known in advance must fit in what is left after the pending spend.
    assert_eq!(
        decision(&[(1000, 90), (100, 90)], 4, day(6)),
        Decision::Admit
    );
    assert!(matches!(
        decision(&[(1000, 90), (100, 90)], 5, day(6)),
        Decision::Refuse(_)
    ));
}

#[test]
fn hostile_replies_are_failures_for_on_error_never_traps() {
    // Every one is an Err the filter maps to `on_error`; none panics.
    let ok = reply(&[(100, 1), (10, 1)]);
    assert!(verdict_of(&ok, 2).is_ok());
    assert_eq!(
        verdict_of(&ok, 1),
        Err(CallFailure::Reply(ReplyError::StatusCount(1, 2)))
    );
    for n in 0..ok.len() {
        assert!(verdict_of(&ok[..n], 2).is_err(), "prefix {n}");
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for len in 0..300 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = verdict_of(&bytes, 2);
        let _ = decode_queue(&bytes);
    }
    // Timeouts, unreachable services: gRPC statuses without a body.
    assert_eq!(rls::reply_verdict(4, 0, None, 2), Err(CallFailure::Grpc(4)));
    assert_eq!(
        rls::reply_verdict(14, 0, None, 2),
        Err(CallFailure::Grpc(14))
    );
    assert!(matches!(
        rls::reply_verdict(0, 1 << 20, None, 2),
        Err(CallFailure::Reply(ReplyError::Oversize(_)))
    ));
}
