//! Global budgets (`tollgate_cost::global`): the `global` block and the budgets that must fit
//! the protocol, rounding, the check's descriptors and decision (the reference server's rules as
//! a model), period rollover with an injected clock, the outbox and the shared replay queue and
//! their bounds, hostile replies (a failure for `on_error`, never a trap), and the overspend bound
//! across instances, simulated.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::HashMap;

use prost::Message;
use tollgate_common::rls::{
    self, CallFailure, Code, DescriptorStatus, OnError, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, ReplyError, Unit,
};
use tollgate_common::shared_data::{MemoryStore, Semantics, SharedStore};
use tollgate_cost::config::Config;
use tollgate_cost::global::{
    batch_request, check_request, cost_entry, decide, decode_queue, encode_queue, overspend_bound,
    year_boundary_in_month, Booking, BookingKey, CostGlobal, Decision, Limits, Outbox, Pending,
    Period, ReplayQueue, SendTicks, DEFAULT_UNIT_NANO_USD,
};
use tollgate_cost::ledger::Budget;
use tollgate_cost::period::Periods;

const PRICES: &str =
    r#""prices": {"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}}"#;

fn config(rest: &str) -> Result<Config, tollgate_common::config::ConfigError> {
    let json = format!(r#"{{{PRICES}, "tenant": {{"header": "x-jwt-sub"}}, {rest}}}"#);
    Config::parse(json.as_bytes())
}

fn global(unit: u64) -> CostGlobal {
    let json = format!(r#"{{"service":"ratelimit","domain":"tollgate","unit_nano_usd":{unit}}}"#);
    CostGlobal::parse(&json).unwrap()
}

/// 2025-01-31T12:00:00Z.
const JAN31_NOON: u64 = 1_738_324_800;

#[test]
fn the_global_block_defaults_and_units() {
    let c = config(
        r#""budgets": {"default": {"day_nano_usd": 1000000000}},
           "global": {"service": "ratelimit", "domain": "tollgate"}"#,
    )
    .unwrap();
    let g = c.global.unwrap();
    assert_eq!(g.unit_nano_usd, DEFAULT_UNIT_NANO_USD);
    assert_eq!(g.rls.on_error, OnError::Local);
    assert_eq!(
        (g.rls.timeout_ms, g.rls.service.as_str()),
        (50, "ratelimit")
    );
    let c = config(
        r#""global": {"service": "rl", "domain": "d", "on_error": "deny", "unit_nano_usd": 1}"#,
    )
    .unwrap();
    let g = c.global.unwrap();
    assert_eq!((g.unit_nano_usd, g.rls.on_error), (1, OnError::Deny));
    assert!(config(r#""budgets": {}"#).unwrap().global.is_none());
}

#[test]
fn global_errors_name_the_field() {
    let max_units = u64::from(u32::MAX);
    let cases = [
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 0}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 1000000001}"#
                .to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": 1.5}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "unit_nano_usd": "1"}"#.to_string(),
            "global.unit_nano_usd",
        ),
        (r#""global": {"domain": "d"}"#.to_string(), "global"),
        (
            r#""global": {"service": "rl", "domain": "d", "units": 1}"#.to_string(),
            "global.units",
        ),
        (
            r#""global": {"service": "a b", "domain": "d"}"#.to_string(),
            "global.service",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "timeout_ms": 0}"#.to_string(),
            "global.timeout_ms",
        ),
        (
            r#""global": {"service": "rl", "domain": "d", "on_error": "open"}"#.to_string(),
            "global.on_error",
        ),
        (r#""global": [1]"#.to_string(), "global"),
        // Budgets beyond u32::MAX units of the unit refuse, naming the budget.
        (
            format!(
                r#""budgets": {{"tenants": {{"alice": {{"day_nano_usd": {}}}}}}},
                   "global": {{"service": "rl", "domain": "d"}}"#,
                (max_units + 1) * DEFAULT_UNIT_NANO_USD
            ),
            "budgets.tenants.alice.day_nano_usd",
        ),
        (
            format!(
                r#""budgets": {{"default": {{"month_nano_usd": {}}}}},
                   "global": {{"service": "rl", "domain": "d", "unit_nano_usd": 1}}"#,
                max_units + 1
            ),
            "budgets.default.month_nano_usd",
        ),
    ];
    for (rest, field) in cases {
        let err = config(&rest).unwrap_err();
        assert_eq!(err.field, field, "{rest}: {err}");
    }
    // Exactly u32::MAX units fits; the same budget without `global` is fine whatever its size.
    config(&format!(
        r#""budgets": {{"default": {{"month_nano_usd": {}}}}},
           "global": {{"service": "rl", "domain": "d", "unit_nano_usd": 1}}"#,
        max_units
    ))
    .unwrap();
    config(r#""budgets": {"default": {"month_nano_usd": 18446744073709551615}}"#).unwrap();
}

#[test]
fn rounding_budgets_down_and_costs_up() {
    let g = global(100_000);
    assert_eq!(g.limit_units(1_000_000_000, "f").unwrap(), 10_000);
    assert_eq!(
        g.limit_units(199_999, "f").unwrap(),
        1,
        "refused sooner, never later"
    );
    assert_eq!(
        g.limit_units(99_999, "f").unwrap(),
        0,
        "below one unit: always spent"
    );
    assert_eq!(g.cost_units(0), 0);
    assert_eq!(g.cost_units(1), 1, "never under-counted");
    assert_eq!(g.cost_units(100_000), 1);
    assert_eq!(g.cost_units(100_001), 2);
    assert_eq!(
        g.cost_units(u64::MAX),
        u32::MAX,
        "bounded: never past the uint32 range"
    );
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(250_000),
            month: None,
        },
    );
    assert_eq!(
        limits,
        Limits {
            day: Some(2),
            month: None
        }
    );
    assert_eq!(limits.periods(), vec![Period::Day]);
    let now = Periods::at(JAN31_NOON);
    assert_eq!(
        Booking::new(&g, "t", &limits, &now, 0),
        None,
        "nothing to book"
    );
    assert_eq!(
        Booking::new(&g, "t", &Limits::default(), &now, 5),
        None,
        "no budgeted period"
    );
    let b = Booking::new(&g, "t", &limits, &now, 150_000).unwrap();
    assert_eq!((b.units, b.key.day, b.key.month), (2, 20250131, 0));
}

#[test]
fn the_check_is_one_call_of_pure_checks_month_first() {
    let g = global(100_000);
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(1_000_000_000),
            month: Some(20_000_000_000),
        },
    );
    let now = Periods::at(JAN31_NOON);
    let req = check_request("tollgate", "default", "alice", &limits, &now).unwrap();
    assert_eq!(req.domain, "tollgate");
    assert_eq!(req.hits_addend, 0);
    let d = &req.descriptors;
    assert_eq!(d.len(), 2);
    let entries = |d: &RateLimitDescriptor| {
        d.entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        entries(&d[0]),
        vec![
            ("cost".into(), "20:default/month/202501".into()),
            ("tenant".into(), "alice".into())
        ]
    );
    assert_eq!(
        entries(&d[1]),
        vec![
            ("cost".into(), "20:default/day/20250131".into()),
            ("tenant".into(), "alice".into())
        ]
    );
    let limit = |d: &RateLimitDescriptor| d.limit.clone().map(|l| (l.requests_per_unit, l.unit));
    assert_eq!(limit(&d[0]), Some((200_000, Unit::Year as i32)));
    assert_eq!(limit(&d[1]), Some((10_000, Unit::Day as i32)));
    assert!(d.iter().all(|d| d.hits_addend == Some(0)), "a pure check");
    // The wrapper makes 0 explicit on the wire (absent would be the request's hits_addend, and
    // 0 there counts 1).
    let bytes = rls::encode_request(&req);
    assert_eq!(RateLimitRequest::decode(&*bytes).unwrap(), req);
    assert!(check_request("tollgate", "default", "alice", &Limits::default(), &now).is_none());
}

/// The reference server's Redis key (src/limiter/cache_key.go, GenerateCacheKey), without the
/// window start: `<domain>_` then `<key>_<value>_` per entry.
fn engine_key(domain: &str, d: &RateLimitDescriptor) -> String {
    let mut k = format!("{domain}_");
    for e in &d.entries {
        k.push_str(&format!("{}_{}_", e.key, e.value));
    }
    k
}

#[test]
fn descriptors_of_distinct_tenants_and_ledgers_never_share_a_counter() {
    // Abuse: the server joins entries with `_` unescaped; tenants may contain `_` and `/`-free
    // punctuation. The framed cost entry and the tenant last keep keys distinct.
    let g = global(1);
    let limits = Limits::of(
        &g,
        &Budget {
            day: Some(10),
            month: Some(10),
        },
    );
    let now = Periods::at(JAN31_NOON);
    let cases = [
        ("a", "b_tenant_c"),
        ("a_tenant_b", "c"),
        ("a", "b"),
        ("a_b", "c"),
        ("a", "b_c"),
        ("x/day/20250131", "t"),
        ("x", "t"),
        ("a", "21:default_day_20250131"),
    ];
    let mut seen = HashMap::new();
    for (ledger, tenant) in cases {
        let req = check_request("tollgate", ledger, tenant, &limits, &now).unwrap();
        for d in &req.descriptors {
            let k = engine_key("tollgate", d);
            if let Some(prev) = seen.insert(k.clone(), (ledger, tenant)) {
                panic!("{prev:?} and {:?} share {k}", (ledger, tenant));
            }
        }
    }
    // Never a rate-limit descriptor's key: its first entry is `rule`.
    assert!(seen.keys().all(|k| k.starts_with("tollgate_cost_")));
    assert_eq!(cost_entry("l", Period::Day, 20250131), "14:l/day/20250131");
}

/// A reply as the reference server builds it (base_limiter.go GetResponseDescriptorStatus):
/// per descriptor (limit, counter after the hits): over when counter > limit, remaining
/// limit - counter when not.
fn reply(statuses: &[(u32, u64)]) -> Vec<u8> {
    let statuses: Vec<DescriptorStatus> = statuses
        .iter()
        .map(|&(limit, counter)| {
            let over = counter > u64::from(limit);
            DescriptorStatus {
                code: if over { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: None,
                limit_remaining: if over {
                    0
                } else {
                    u32::try_from(u64::from(limit) - counter).unwrap()
                },
                duration_until_reset: Some(prost_types::Duration {
                    seconds: 42,
                    nanos: 0,
                }),
            }
        })
        .collect();
    let overall = if statuses.iter().any(|s| s.code == Code::OverLimit as i32) {
        Code::OverLimit
    } else {
        Code::Ok
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
    }
    .encode_to_vec()
}

fn verdict_of(bytes: &[u8], n: usize) -> Result<rls::Verdict, CallFailure> {
    rls::reply_verdict(0, bytes.len(), Some(bytes), n)
}

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

fn key(tenant: &str, day: u32, month: u32) -> BookingKey {
    BookingKey {
        tenant: tenant.into(),
        day,
        month,
    }
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
    let send = |now: &Periods| batch_request("tollgate", "default", vec![b.clone()], now, |_| both);
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
    let next_day = batch_request("tollgate", "default", vec![b30], &t0, |_| both);
    let d = next_day.request.unwrap().descriptors;
    assert_eq!(d.len(), 1, "only the month is still current");
    assert_eq!(d[0].entries[0].value, "20:default/month/202501");
    // A tenant whose budget was removed since: nothing to send for it.
    let gone = batch_request("tollgate", "default", vec![b.clone()], &t0, |_| {
        Limits::default()
    });
    assert_eq!((gone.request, gone.stale), (None, 1));
    // Several tenants share one call, each with its own hits.
    let c = Booking::new(&g, "carol", &both, &t0, 3).unwrap();
    let two = batch_request("tollgate", "default", vec![b, c], &t0, |_| both);
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
    ];
    let bytes = encode_queue(&bookings);
    assert_eq!(decode_queue(&bytes), Some(bookings.clone()));
    let first_end = 1 + 1 + 5 + 12;
    for n in 0..bytes.len() {
        let d = decode_queue(&bytes[..n]);
        match n {
            1 => assert_eq!(d, Some(vec![])),
            n if n == first_end => assert_eq!(d, Some(bookings[..1].to_vec())),
            _ => assert_eq!(d, None, "prefix {n}"),
        }
    }
    assert_eq!(decode_queue(&[]), None);
    assert_eq!(decode_queue(&[2]), None, "another version");
    assert_eq!(
        decode_queue(&[1, 2, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        None,
        "not UTF-8"
    );
}

#[test]
fn the_month_that_straddles_a_year_window_is_known() {
    // Epoch + 56 * 365 days = 2025-12-18T00:00:00Z, + 57 * 365 = 2026-12-18, + 59 * 365 =
    // 2028-12-17 (2028 is a leap year).
    assert_eq!(year_boundary_in_month(202512), Some(56 * 365 * 86_400));
    assert_eq!(Periods::at(56 * 365 * 86_400).day, 20251218);
    assert_eq!(year_boundary_in_month(202612), Some(57 * 365 * 86_400));
    assert_eq!(Periods::at(59 * 365 * 86_400).day, 20281217);
    let straddling: Vec<u32> = (2025..=2028)
        .flat_map(|y| (1..=12).map(move |m| y * 100 + m))
        .filter(|&m| year_boundary_in_month(m).is_some())
        .collect();
    assert_eq!(straddling, vec![202512, 202612, 202712, 202812]);
    assert_eq!(year_boundary_in_month(202513), None);
    assert_eq!(year_boundary_in_month(196912), None);
}

/// The reference server's counting, as `test_global_engine.py` asserts it of the real one
/// (LOCAL_CACHE_SIZE_IN_BYTES=0, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false): one counter per
/// descriptor key, every hit added, over when counter > limit.
#[derive(Default)]
struct Engine {
    counters: HashMap<String, u64>,
}

impl Engine {
    fn call(&mut self, req: &RateLimitRequest) -> Vec<u8> {
        let mut statuses = Vec::new();
        for d in &req.descriptors {
            let k = engine_key(&req.domain, d);
            let c = self.counters.entry(k).or_default();
            *c += d.hits_addend.unwrap();
            statuses.push((d.limit.clone().unwrap().requests_per_unit, *c));
        }
        reply(&statuses)
    }
}

/// One gateway instance in the simulation.
struct Instance {
    /// Admitted requests whose response is not complete: (cost nano-USD, steps left).
    in_flight: Vec<(u64, u32)>,
    outbox: Outbox,
    /// What the outbox holds, in nano-USD (exact, for the bound).
    unsent_nano: u64,
}

#[test]
fn overspend_across_instances_is_within_the_stated_bound() {
    // 3 instances share one engine; each admits the tenant's requests after a check and books
    // each one 1-6 steps later (responses in flight) into its outbox, sent every other step.
    let g = global(100_000);
    let budget = Budget {
        day: Some(50_000_000),
        month: None,
    };
    let limits = Limits::of(&g, &budget);
    let now = Periods::at(JAN31_NOON);
    let mut engine = Engine::default();
    let mut seed = 7u64;
    let mut rand = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let mut instances: Vec<Instance> = (0..3)
        .map(|_| Instance {
            in_flight: Vec::new(),
            outbox: Outbox::new(64),
            unsent_nano: 0,
        })
        .collect();
    let (mut spent, mut admitted, mut refused) = (0u64, 0u32, 0u32);
    let mut bound_at_last_admission = 0u64;
    for step in 0..3_000u32 {
        let i = (step % 3) as usize;
        let req = check_request("tollgate", "default", "alice", &limits, &now).unwrap();
        let verdict = verdict_of(&engine.call(&req), 1).unwrap();
        let cost = 1 + rand(2_000_000);
        // The instance's own unsent bookings are taken off what the service says is left.
        let pending = instances[i].outbox.pending("alice", &now);
        if decide(&limits.periods(), &verdict, &now, 0, &pending) == Decision::Admit {
            admitted += 1;
            instances[i].in_flight.push((cost, 1 + rand(6) as u32));
            spent += cost;
            // What the service had not counted when this one was admitted (itself included).
            let in_flight: Vec<u64> = instances
                .iter()
                .flat_map(|x| x.in_flight.iter().map(|f| f.0))
                .collect();
            let unsent: Vec<u64> = instances.iter().map(|x| x.unsent_nano).collect();
            bound_at_last_admission = overspend_bound(&in_flight, &unsent);
        } else {
            refused += 1;
        }
        for x in &mut instances {
            let mut done = Vec::new();
            x.in_flight.retain_mut(|f| {
                f.1 -= 1;
                let finished = f.1 == 0;
                if finished {
                    done.push(f.0);
                }
                !finished
            });
            for c in done {
                let b = Booking::new(&g, "alice", &limits, &now, c).unwrap();
                assert!(x.outbox.push(b));
                x.unsent_nano += c;
            }
            if step % 2 == 0 {
                let batch = x.outbox.take(64);
                let built = batch_request("tollgate", "default", batch, &now, |_| limits);
                if let Some(r) = built.request {
                    engine.call(&r);
                }
                x.unsent_nano = 0;
            }
        }
    }
    let overspend = spent.saturating_sub(budget.day.unwrap());
    println!(
        "admitted {admitted}, refused {refused}, spent {spent} of {}, overspend {overspend}, \
         bound at the last admission {bound_at_last_admission}",
        budget.day.unwrap()
    );
    assert!(refused > 0 && admitted > 10);
    assert!(
        overspend > 0,
        "the simulation must cross the budget with requests in flight"
    );
    assert!(
        overspend <= bound_at_last_admission,
        "overspend {overspend} beyond the bound {bound_at_last_admission}"
    );
    // The engine's counter (units, rounded up) is at least the spend booked.
    let counted: u64 = engine.counters.values().sum();
    assert!(counted * 100_000 >= spent);
}
