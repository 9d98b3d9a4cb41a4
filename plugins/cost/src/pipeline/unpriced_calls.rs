//! A call that starts billable work the filter cannot price (`crate::unpriced_calls`), for a
//! tenant whose requests must be read: refused before the upstream (`unpriced_calls: refuse`,
//! the default) or passed on and counted (`allow`), logged at most once per interval.

use proxy_wasm::types::Action;
use tollgate_common::host_calls::{count, now_unix_millis};

use crate::unpriced_calls::{Endpoint, UnpricedCalls};
use crate::worker::Shared;

use super::Request;

impl Request {
    /// The request is a call to `endpoint`: `Some` (the refusal: 403, code
    /// `unpriced_endpoint`, outcome `unpriced_endpoint`) under `unpriced_calls: refuse`; `None`
    /// under `allow` (counted `tollgate_cost_unpriced_calls_allowed_total`).
    pub(super) fn unpriced_call(&mut self, shared: &Shared, endpoint: Endpoint) -> Option<Action> {
        let refuse = shared.config.unpriced_calls == UnpricedCalls::Refuse;
        if let Some(unlogged) = shared.logs.unpriced_call.due(now_unix_millis()) {
            log::warn!(
                "tenant {}: {} cannot be priced; call {} (unpriced_calls) ({unlogged} more since \
                 the last line)",
                self.tenant,
                endpoint.describe(),
                if refuse { "refused" } else { "allowed" },
            );
        }
        if !refuse {
            count(shared.counters.unpriced_calls_allowed);
            return None;
        }
        self.hold_request = false;
        let message = format!(
            "{} start work this gateway cannot price, and this tenant's spend is limited",
            endpoint.describe()
        );
        // 403: the request is understood and well-formed, but not permitted to this tenant
        // (RFC 9110 section 15.5.4); the OpenAI and Anthropic SDKs raise PermissionDeniedError.
        Some(self.refuse(
            shared.counters.unpriced_endpoint,
            "unpriced_endpoint",
            (403, &[], "unpriced_endpoint", &message),
        ))
    }
}
