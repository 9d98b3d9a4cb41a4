//! `remote_prices` (wasm32): the root context fetches the price table on ticks through
//! `tollgate_common::remote_fetch` (one fetch per `cache_duration_seconds` for the whole
//! gateway) and reads it over several callbacks; a table replaces the one in use only once it
//! parsed whole and priced at least one model.

use tollgate_common::clock::UnixNanos;
use tollgate_common::host_calls::{self as host_calls, now_unix_secs};
use tollgate_common::remote_fetch::RemoteDocument;

use crate::price_table::{IncrementalParse, Loaded, Step};
use crate::worker::Shared;

/// The root context's remote price table: the document fetched, and the table being read.
#[derive(Default)]
pub(crate) struct PriceRefresh {
    pub(crate) remote: Option<RemoteDocument>,
    /// A remote table being read, a slice per callback.
    pending: Option<Pending>,
}

/// A remote price table being read over several callbacks (`price_table::IncrementalParse`):
/// nginx bounds each callback (`tollgate_guest_deadline`, 100 ms by default), and LiteLLM's
/// 3.2 MB file takes longer than that in one go there.
pub(crate) struct Pending {
    parse: IncrementalParse,
    /// For the log line.
    source: String,
    /// Fetched by this VM: stored in shared data for the others once it reads well.
    fetched_here: bool,
    started: Option<UnixNanos>,
}

/// Bytes of a remote table read per step, and the time after which a callback stops stepping
/// (ms): a callback reads the table for about this long, far under nginx's 100 ms deadline.
const STEP_BYTES: usize = 128 << 10;
const STEP_MILLIS: f64 = 15.0;

/// Milliseconds of the host's clock since `start` (for the load log lines).
pub(crate) fn millis_since(start: Option<UnixNanos>) -> f64 {
    let now = host_calls::now();
    match (start, now) {
        (Some(a), Some(b)) => b.0.saturating_sub(a.0) as f64 / 1e6,
        _ => 0.0,
    }
}

impl PriceRefresh {
    /// Reads the pending remote table for about STEP_MILLIS; puts it in use when it is read
    /// whole and prices at least one model (stored for every VM first if fetched here).
    fn advance(&mut self, shared: &Shared) {
        let began = host_calls::now();
        let result = loop {
            let Some(pending) = self.pending.as_mut() else {
                return;
            };
            match pending.parse.step(STEP_BYTES) {
                Step::More if millis_since(began) < STEP_MILLIS => {}
                Step::More => return,
                Step::Done(result) => break result,
            }
        };
        let (Some(pending), Some(remote)) = (self.pending.take(), self.remote.as_mut()) else {
            return;
        };
        let now = now_unix_secs();
        let refused = match result {
            Ok(loaded) if loaded.table.is_empty() => Some("no model priced per token".to_string()),
            Ok(loaded) => {
                if pending.fetched_here && !remote.accept(now, pending.parse.document()) {
                    return;
                }
                let millis = millis_since(pending.started);
                install(shared, loaded, &pending.source, millis);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = refused {
            if pending.fetched_here {
                remote.reject(now, &why);
            } else {
                log::warn!("prices from {} unusable here: {why}", pending.source);
            }
        }
    }

    /// The reply of the fetch this VM made: read (a slice now, the rest on ticks).
    pub(crate) fn on_reply(&mut self, shared: &Shared, token_id: u32, body_size: usize) {
        let Some(remote) = self.remote.as_mut().filter(|r| r.owns(token_id)) else {
            return;
        };
        let Some(body) = remote.on_response(now_unix_secs(), body_size) else {
            return;
        };
        let source = format!("{}{}", remote.source.cluster, remote.source.path);
        self.pending = Some(Pending {
            parse: IncrementalParse::new(body, "remote_prices"),
            source,
            fetched_here: true,
            started: host_calls::now(),
        });
        self.advance(shared);
    }

    /// A tick: a table another VM fetched is read when it is newer, and a pending one read on.
    pub(crate) fn tick(&mut self, shared: &Shared) {
        let Some(remote) = self.remote.as_mut() else {
            return;
        };
        if let Some((fetched_at, body)) = remote.tick(now_unix_secs()) {
            let source = format!(
                "{}{} (fetched at {fetched_at})",
                remote.source.cluster, remote.source.path
            );
            self.pending = Some(Pending {
                parse: IncrementalParse::new(body, "remote_prices"),
                source,
                fetched_here: false,
                started: host_calls::now(),
            });
        }
        self.advance(shared);
    }
}

/// Puts a checked table in use (`millis`: what reading it took, for the log line).
fn install(shared: &Shared, loaded: Loaded, source: &str, millis: f64) {
    log::info!("{} (read in {millis:.1} ms)", loaded.summary(source));
    *shared.prices.borrow_mut() = std::rc::Rc::new(loaded.table);
}
