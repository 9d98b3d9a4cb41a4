//! Metrics: `proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`, answered by the embedding's [`Host`](crate::embedder::Host).

use crate::abi::store::{code, guest_str, return_u32, return_u64, status_of, Def, BAD_ARGUMENT, C};
use crate::embedder::MetricKind;
use crate::error::Error;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_define_metric",
        |mut c: C<'_>, kind: u32, np: u32, nl: u32, ret_id: u32| -> u32 {
            let kind = match kind {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return BAD_ARGUMENT,
            };
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            match c.data().host.define_metric(kind, &name) {
                Ok(id) => return_u32(&mut c, ret_id, id),
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_increment_metric",
        |c: C<'_>, id: u32, delta: i64| -> u32 {
            status_of(c.data().host.increment_metric(id, delta))
        },
    )?;
    d.env(
        "proxy_record_metric",
        |c: C<'_>, id: u32, value: u64| -> u32 {
            status_of(c.data().host.record_metric(id, value))
        },
    )?;
    d.env(
        "proxy_get_metric",
        |mut c: C<'_>, id: u32, ret: u32| -> u32 {
            match c.data().host.get_metric(id) {
                Ok(v) => return_u64(&mut c, ret, v),
                Err(s) => code(s),
            }
        },
    )?;
    Ok(())
}
