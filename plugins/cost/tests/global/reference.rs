//! The reference rate limit server as a model: its counter keys, its replies (built as it
//! builds them) and its counting, for the tests that check the protocol against it.

use std::collections::HashMap;

use prost::Message;
use tollgate_common::rls::{
    self, CallFailure, Code, DescriptorStatus, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse,
};

/// The reference server's Redis key (src/limiter/cache_key.go, GenerateCacheKey), without the
/// window start: `<domain>_` then `<key>_<value>_` per entry.
pub(crate) fn engine_key(domain: &str, d: &RateLimitDescriptor) -> String {
    let mut k = format!("{domain}_");
    for e in &d.entries {
        k.push_str(&format!("{}_{}_", e.key, e.value));
    }
    k
}

/// A reply as the reference server builds it (base_limiter.go GetResponseDescriptorStatus):
/// per descriptor (limit, counter after the hits): over when counter > limit, remaining
/// limit - counter when not.
pub(crate) fn reply(statuses: &[(u32, u64)]) -> Vec<u8> {
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

pub(crate) fn verdict_of(bytes: &[u8], n: usize) -> Result<rls::Verdict, CallFailure> {
    rls::reply_verdict(0, bytes.len(), Some(bytes), n)
}

/// The reference server's counting, as `test_global_engine.py` asserts it of the real one
/// (LOCAL_CACHE_SIZE_IN_BYTES=0, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false): one counter per
/// descriptor key and window, every hit added, over when counter > limit. A window is `[now -
/// now % length, + length)` of the limit's unit (src/utils/utilities.go, UnitToDivider; MONTH
/// 30 days, YEAR 365), its start the key's last part; `now` is the model's clock (Unix s).
#[derive(Default)]
pub(crate) struct Engine {
    pub(crate) counters: HashMap<String, u64>,
    pub(crate) now: u64,
}

/// The window length (s) of a limit's unit in the reference server.
fn divider(unit: i32) -> u64 {
    match unit {
        1 => 1,
        2 => 60,
        3 => 3_600,
        4 => 86_400,
        5 => 30 * 86_400,
        6 => 365 * 86_400,
        u => panic!("unit {u}"),
    }
}

impl Engine {
    /// The counter of `d` in the window holding `now`, as the server keys it.
    pub(crate) fn counter(&self, domain: &str, d: &RateLimitDescriptor) -> u64 {
        self.counters
            .get(&self.key(domain, d))
            .copied()
            .unwrap_or(0)
    }

    fn key(&self, domain: &str, d: &RateLimitDescriptor) -> String {
        let len = divider(d.limit.clone().unwrap().unit);
        format!("{}{}", engine_key(domain, d), self.now - self.now % len)
    }

    pub(crate) fn call(&mut self, req: &RateLimitRequest) -> Vec<u8> {
        let mut statuses = Vec::new();
        for d in &req.descriptors {
            let k = self.key(&req.domain, d);
            let c = self.counters.entry(k).or_default();
            *c += d.hits_addend.unwrap();
            statuses.push((d.limit.clone().unwrap().requests_per_unit, *c));
        }
        reply(&statuses)
    }
}
