//! How a verdict answers the request (wasm32), in either mode: continued (with the RateLimit
//! headers on the response when configured) or refused (429 or the configured status, with
//! `Retry-After`, `RateLimit-Policy` and `RateLimit`: draft-ietf-httpapi-ratelimit-headers), and
//! the decision counted and published for the metrics filter and access logs.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{count, now_unix_millis, send_json_error};
use tollgate_common::signals;

use crate::config::{Rule, StoreFullAction};
use crate::headers::{
    push_service_limit, retry_after_seconds, RATELIMIT, RATELIMIT_POLICY, RETRY_AFTER,
};
use crate::limiter::Verdict;
use crate::worker::Shared;

/// Counts a decision and publishes it for the metrics filter and access logs (see
/// `tollgate_common::signals`).
pub(crate) fn decided(counter: Option<u32>, decision: &str, rule: &str) {
    count(counter);
    signals::publish_fields(
        signals::RATE_LIMIT,
        &[
            (signals::field::OUTCOME, decision),
            (signals::field::RULE, rule),
        ],
    );
}

/// Refuses the request: a JSON error body and `headers`; the stream ends here.
pub(crate) fn refuse(status: u32, headers: &[(&str, &str)], error: &str, message: &str) -> Action {
    send_json_error(status, headers, error, message);
    Action::Pause
}

/// Answers the request from a verdict (either mode): continue (with RateLimit headers on
/// the response when configured) or refuse.
///
/// `response_headers` gets the RateLimit value for an allowed request with
/// `headers_on_allowed`.
pub(crate) fn decide(
    shared: &Shared,
    index: usize,
    rule: &Rule,
    verdict: Verdict,
    response_headers: &mut Option<(usize, String)>,
) -> Action {
    let config = &shared.config;
    let Some(counters) = shared.counters.get(index) else {
        return Action::Continue;
    };
    match verdict {
        Verdict::Allowed(decisions) => {
            decided(counters.allowed, "allowed", &rule.name);
            if config.headers_on_allowed {
                let mut value = String::with_capacity(32);
                for (l, d) in rule.limits.iter().zip(&decisions) {
                    push_service_limit(&mut value, &l.name, d);
                }
                *response_headers = Some((index, value));
            }
            Action::Continue
        }
        Verdict::Limited {
            index: at,
            decision,
        } => {
            decided(counters.limited, "limited", &rule.name);
            let name = rule.limits.get(at).map_or(rule.name.as_str(), |l| &l.name);
            let mut value = String::with_capacity(32);
            push_service_limit(&mut value, name, &decision);
            let retry = retry_after_seconds(decision.retry_after_ms).to_string();
            log::debug!("rule {}: limit {name} refused", rule.name);
            let message = format!("rate limit {name} exceeded; retry in {retry} s");
            refuse(
                config.status,
                &[
                    (RETRY_AFTER, &retry),
                    (RATELIMIT_POLICY, &rule.policy_header),
                    (RATELIMIT, &value),
                ],
                "rate_limited",
                &message,
            )
        }
        Verdict::ContentionAllowed => {
            decided(
                counters.contention_allowed,
                "contention_allowed",
                &rule.name,
            );
            Action::Continue
        }
        Verdict::ContentionDenied => {
            decided(counters.contention_denied, "contention_denied", &rule.name);
            refuse(
                config.status,
                &[(RETRY_AFTER, "1")],
                "rate_limit_contention",
                "the rate limiter is contended; retry",
            )
        }
        Verdict::StoreFailed(status) => {
            let policy = config.store_full;
            let allow = policy.action == StoreFullAction::Allow;
            let log = shared.store_logs.get(index);
            if let Some(unlogged) = log.and_then(|l| l.due(now_unix_millis())) {
                log::warn!(
                    "rule {}: its state cannot be stored (host status {status}: \
                     a full shared-data zone?); requests {} (store_full), {unlogged} more \
                     since the last line",
                    rule.name,
                    if allow {
                        "admitted uncharged"
                    } else {
                        "refused"
                    },
                );
            }
            if allow {
                decided(
                    counters.store_failure_allowed,
                    "store_failure_allowed",
                    &rule.name,
                );
                return Action::Continue;
            }
            decided(
                counters.store_failure_denied,
                "store_failure_denied",
                &rule.name,
            );
            refuse(
                policy.status,
                &[(RETRY_AFTER, "1")],
                "rate_limit_unavailable",
                "the rate limiter cannot store this client's state; retry later",
            )
        }
    }
}
