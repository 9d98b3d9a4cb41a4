//! The kept-alive HTTP/1.1 connections of one [`crate::http_client`] background thread.
//!
//! A background thread runs one call at a time, so it never needs two connections to one
//! address: it keeps at most one idle connection per address (`host:port`), for at most
//! [`IDLE_TIMEOUT`], to at most [`MAX_ADDRESSES`] addresses (the oldest idle one is closed to make
//! room). An idle connection's hyper driver is a task of the thread's runtime, so it only sees
//! the server's close while a call runs; the caller checks the connection again before reusing it
//! (`SendRequest::ready`) and replays a request its server never read (see `http_client`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use tokio::task::JoinHandle;

/// Longest a connection waits idle for its next call: below the usual servers' keep-alive
/// timeouts (nginx 75 s, Envoy's HTTP connection manager 1 h, Go's net/http none) so that
/// the server rarely closes first; shorter ones (Apache httpd's 5 s) are covered by the replay.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Addresses one background thread keeps an idle connection to, at most (the file descriptors
/// and buffers a filter calling many hosts can hold in each worker: 4 threads x 32).
pub const MAX_ADDRESSES: usize = 32;

/// Stops a spawned connection task when its owner is dropped, whichever way the call ends.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open HTTP/1.1 connection: hyper's request handle and the task driving the socket.
pub(crate) struct Connection {
    pub(crate) sender: SendRequest<Full<Bytes>>,
    /// Held for its `Drop`: the socket closes with the connection.
    pub(crate) _driver: AbortOnDrop,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

/// The idle connections of one background thread, by address.
#[derive(Default)]
pub(crate) struct Pool {
    idle: HashMap<String, Idle>,
}

impl Pool {
    /// The idle connection to `address`, if there is one younger than [`IDLE_TIMEOUT`] whose
    /// driver has not seen it close; the caller owns it for one call.
    pub(crate) fn take(&mut self, address: &str, now: Instant) -> Option<Connection> {
        let idle = self.idle.remove(address)?;
        let fresh = now.saturating_duration_since(idle.since) < IDLE_TIMEOUT;
        (fresh && !idle.connection.sender.is_closed()).then_some(idle.connection)
    }

    /// Keeps `connection` for the next call to `address` (a connection hyper already closed,
    /// e.g. after `connection: close`, is dropped instead).
    pub(crate) fn put(&mut self, address: &str, connection: Connection, now: Instant) {
        if connection.sender.is_closed() {
            return;
        }
        if !self.idle.contains_key(address) && self.idle.len() >= MAX_ADDRESSES {
            // At most MAX_ADDRESSES entries: the scan is bounded, and off the worker's thread.
            let oldest = self
                .idle
                .iter()
                .min_by_key(|(_, idle)| idle.since)
                .map(|(a, _)| a.clone());
            if let Some(oldest) = oldest {
                self.idle.remove(&oldest);
            }
        }
        self.idle.insert(
            address.to_string(),
            Idle {
                connection,
                since: now,
            },
        );
    }

    /// Idle connections kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.idle.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    /// A connection to a fresh loopback listener (kept alive by the returned listener).
    async fn connection() -> (Connection, std::net::TcpListener) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let driver = AbortOnDrop(tokio::spawn(async move {
            let _ = conn.await;
        }));
        (
            Connection {
                sender,
                _driver: driver,
            },
            listener,
        )
    }

    #[test]
    fn one_idle_connection_per_address_for_a_bounded_time_and_number_of_addresses() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut pool = Pool::default();
            let t0 = Instant::now();
            let mut listeners = Vec::new();
            for i in 0..=MAX_ADDRESSES {
                let (c, l) = connection().await;
                listeners.push(l);
                let at = t0 + Duration::from_millis(u64::try_from(i).unwrap());
                pool.put(&format!("host-{i}:80"), c, at);
            }
            // The oldest address made room for the last one.
            assert_eq!(pool.len(), MAX_ADDRESSES);
            let later = t0 + Duration::from_secs(1);
            assert!(pool.take("host-0:80", later).is_none());
            assert!(pool.take("host-1:80", later).is_some());
            // Taken means owned by the call: not in the pool until put back.
            assert!(pool.take("host-1:80", later).is_none());
            // Past the idle timeout a connection is closed, not reused.
            assert!(pool
                .take("host-2:80", t0 + IDLE_TIMEOUT + Duration::from_millis(10))
                .is_none());
            assert!(pool
                .take("host-3:80", t0 + IDLE_TIMEOUT - Duration::from_secs(1))
                .is_some());
            // A second connection to an address replaces the first, the count stays.
            let (c, _l) = connection().await;
            pool.put("host-4:80", c, later);
            assert_eq!(pool.len(), MAX_ADDRESSES - 3);
        });
    }
}
