//! The overspend bound across instances: 3 gateways simulated on the reference server's model,
//! each deciding with its own pending bookings, the spend checked against `overspend_bound`.

use tollgate_cost::global::{
    batch_request, check_request, decide, overspend_bound, Booking, Decision, Limits, Outbox,
};
use tollgate_cost::ledger::Budget;
use tollgate_cost::period::Periods;

use crate::reference::{verdict_of, Engine};
use crate::support::{budget_only, global, JAN31_NOON};

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
        if decide(&limits.periods(now.month), &verdict, &now, 0, &pending) == Decision::Admit {
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
                let built = batch_request("tollgate", "default", batch, &now, &budget_only(limits));
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
