//! Global token limits (`token_limits::global`): 3 gateways on the reference server's model with
//! its windows and an injected clock, each booking through its own outbox.

use tollgate_cost::global::{batch_request, BatchLimits, Limits, Outbox};
use tollgate_cost::period::Periods;
use tollgate_cost::token_limits::config::Limit;
use tollgate_cost::token_limits::gate::decide;
use tollgate_cost::token_limits::global::{booking, check_request, readings};
use tollgate_cost::token_limits::window::Per;

use crate::reference::{verdict_of, Engine};
use crate::support::JAN31_NOON;

fn tpm() -> Limit {
    Limit::total("tpm", 10_000, Per::Minute)
}

/// Gateway `outbox`'s request of 2,500 tokens at `secs` (the check, then the booking queued):
/// whether it was admitted.
fn request(engine: &mut Engine, outbox: &mut Outbox, secs: u64) -> bool {
    let limit = tpm();
    engine.now = secs;
    let req = check_request("d", "l", "alice", &[&limit]).unwrap();
    let verdict = verdict_of(&engine.call(&req), 1).unwrap();
    let admitted = decide(&readings(&[&limit], &verdict, secs * 1_000)).is_none();
    if admitted {
        assert!(outbox.push(booking("alice", &limit, secs * 1_000, 2_500).unwrap()));
    }
    admitted
}

/// Sends `outbox` at `secs`: how many bookings were stale.
fn send(engine: &mut Engine, outbox: &mut Outbox, secs: u64) -> u32 {
    engine.now = secs;
    let limits = BatchLimits {
        budget: |_: &str| Limits::default(),
        tokens: |_: &str, name: &str, per: Per| {
            (name == "tpm" && per == Per::Minute).then_some(10_000)
        },
    };
    let built = batch_request("d", "l", outbox.take(64), &Periods::at(secs), &limits);
    if let Some(r) = built.request {
        engine.call(&r);
    }
    built.stale
}

#[test]
fn one_limit_holds_across_three_gateways_and_restarts_with_its_window() {
    let mut engine = Engine::default();
    let mut outboxes: Vec<Outbox> = (0..3).map(|_| Outbox::new(64)).collect();
    let minute = JAN31_NOON; // 12:00:00, a minute's start
    let mut admitted = 0;
    for k in 0..12u64 {
        let i = (k % 3) as usize;
        admitted += u32::from(request(&mut engine, &mut outboxes[i], minute + k));
        assert_eq!(send(&mut engine, &mut outboxes[i], minute + k), 0);
    }
    assert_eq!(
        admitted, 4,
        "10,000 tokens a minute, 2,500 a request, whatever the gateway"
    );
    // The next minute starts from 0.
    assert!(request(&mut engine, &mut outboxes[0], minute + 60));
    // A booking sent after its window ended is dropped, not counted in the next one.
    assert!(request(&mut engine, &mut outboxes[1], minute + 119));
    assert_eq!(send(&mut engine, &mut outboxes[1], minute + 120), 1);
}

#[test]
fn unsent_bookings_are_the_overshoot() {
    // Requests admitted while earlier bookings wait in the outboxes: each gateway admits until
    // the service has counted the limit, so the window ends above it by what was unsent.
    let mut engine = Engine::default();
    let mut outboxes: Vec<Outbox> = (0..3).map(|_| Outbox::new(64)).collect();
    let mut admitted = 0u64;
    for k in 0..12u64 {
        let i = (k % 3) as usize;
        admitted += u64::from(request(&mut engine, &mut outboxes[i], JAN31_NOON + 1));
        if k % 3 == 2 {
            for o in &mut outboxes {
                send(&mut engine, o, JAN31_NOON + 1);
            }
        }
    }
    let overshoot = admitted * 2_500 - 10_000;
    assert!(
        overshoot > 0 && overshoot <= 3 * 2_500,
        "{admitted} admitted"
    );
}
