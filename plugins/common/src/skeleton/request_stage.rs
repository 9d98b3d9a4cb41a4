//! The request stage: what a filter reads of the request before its rules, the path's normal
//! form (`crate::path`) and the canonical host (`crate::authority`), each refused in one way
//! when it cannot be read as the proxy and the upstream read it: 400 with a JSON body
//! (`invalid_path`, `invalid_authority`), the filter's counter incremented, the outcome
//! published in the filter's line, and one log line (README, "What a filter reads").

use std::borrow::Cow;

use crate::authority::canonical_host;
use crate::host_calls::{count, refuse_authority, refuse_path};
use crate::path::{normalize, PathPolicy, RequestPath};
use crate::signals;

/// How one filter refuses a request its stage cannot read.
#[derive(Debug, Clone, Copy)]
pub struct Stage {
    /// The filter's name, for the log line.
    pub filter: &'static str,
    /// The property its line is published in (`crate::signals`).
    pub outcome_property: &'static str,
    /// The counter of refused paths (`None`: not defined by the host).
    pub invalid_path: Option<u32>,
    /// The counter of refused authorities.
    pub invalid_authority: Option<u32>,
}

impl Stage {
    /// The normal form of request target `target` under `policy`; `None` when it has none, the
    /// request then refused (400 `invalid_path`), `before_refusal` having run first (jwt-auth
    /// removes the headers it writes, so that no later filter reads a forged one).
    pub fn path<'a>(
        &self,
        target: &'a [u8],
        policy: &PathPolicy,
        before_refusal: impl FnOnce(),
    ) -> Option<RequestPath<'a>> {
        match normalize(target, policy) {
            Ok(path) => Some(path),
            Err(e) => {
                before_refusal();
                count(self.invalid_path);
                signals::publish_outcome(self.outcome_property, "invalid_path");
                refuse_path(self.filter, e);
                None
            }
        }
    }

    /// The canonical host of `authority` (the `:authority` pseudo-header); `None` when it has
    /// none, the request then refused (400 `invalid_authority`) as [`Stage::path`] does.
    pub fn host<'a>(
        &self,
        authority: &'a [u8],
        before_refusal: impl FnOnce(),
    ) -> Option<Cow<'a, str>> {
        match canonical_host(authority) {
            Ok(host) => Some(host),
            Err(e) => {
                before_refusal();
                count(self.invalid_authority);
                signals::publish_outcome(self.outcome_property, "invalid_authority");
                refuse_authority(self.filter, e);
                None
            }
        }
    }
}

/// The first of `rules` that `matches` the request, with its index: rules are tried in the
/// order of the configuration, as Envoy's route table is.
pub fn first_match<R>(rules: &[R], mut matches: impl FnMut(&R) -> bool) -> Option<(usize, &R)> {
    rules.iter().enumerate().find(|(_, r)| matches(r))
}
