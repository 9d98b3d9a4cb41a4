//! The request as rate-limit's keys and rule matches read it (wasm32): the path and the identity
//! the keys read first fetched in one host call where the host offers it
//! (`tollgate_common::prefetch`), else each on demand, the rest on demand; the path and host put
//! in normal form beforehand by the request stage when the configuration reads them.

use std::borrow::Cow;
use std::cell::OnceCell;

use proxy_wasm::types::MapType;
use tollgate_common::clock::UnixNanos;
use tollgate_common::identity::{HostIdentityView, IdentityView};
use tollgate_common::prefetch::{HostReader, Prefetched, Read, ReadList};

use crate::config::Config;
use crate::key::RequestView;

/// What a request's keys and rules read in every request, in this order: `:path`, the
/// identity `config`'s keys read first (or `:path` again when none does), and the clock the
/// local counters are read at. The authority and the method, which few configurations read, are
/// read by their own calls.
pub(crate) fn request_reads(config: &Config) -> ReadList<3> {
    let identity = config
        .first_identity
        .as_ref()
        .map_or(Read::RequestHeader(":path"), Read::of_identity);
    ReadList::new([Read::RequestHeader(":path"), identity, Read::Clock])
}

/// The request as the key and the rule match read it.
pub(crate) struct HostRequest<'a> {
    /// `:path`, the first identity read and the clock ([`request_reads`]).
    values: Prefetched<'a, HostReader, 3>,
    pub(crate) path: Option<Vec<u8>>,
    method: OnceCell<Option<Vec<u8>>>,
    /// The canonical host, read beforehand when the configuration reads it.
    pub(crate) host: Option<String>,
}

impl<'a> HostRequest<'a> {
    /// The request of this callback, its values read from `reads` ([`request_reads`]).
    pub(crate) fn new(reads: &'a ReadList<3>) -> HostRequest<'a> {
        HostRequest {
            values: reads.fetch(HostReader),
            path: None,
            method: OnceCell::new(),
            host: None,
        }
    }

    /// The request target as sent (`:path`, with its query).
    pub(crate) fn target(&self) -> Cow<'_, [u8]> {
        self.values.get(0).unwrap_or_default()
    }

    /// The host's clock in Unix milliseconds (0 when the host gives none, as
    /// `host_calls::now_unix_millis`).
    pub(crate) fn now_unix_millis(&self) -> u64 {
        self.values.clock(2).map_or(0, UnixNanos::millis)
    }

    /// The authority as sent (`:authority`).
    pub(crate) fn authority(&self) -> Cow<'_, [u8]> {
        self.values
            .value(Read::RequestHeader(":authority"))
            .unwrap_or_default()
    }
}

impl IdentityView for HostRequest<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.values
            .value(Read::RequestHeader(name))
            .map(Cow::into_owned)
    }

    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        HostIdentityView.header_values(name)
    }

    fn property(&self, name: &str) -> Option<Vec<u8>> {
        self.values
            .value(Read::Property(name.as_bytes()))
            .map(Cow::into_owned)
    }
}

impl RequestView for HostRequest<'_> {
    fn forwarded_for(&self) -> Vec<Vec<u8>> {
        tollgate_common::host_calls::headers(MapType::HttpRequestHeaders)
            .into_iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-for"))
            .map(|(_, value)| value)
            .collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        tollgate_common::host_calls::property(&["source", "address"])
    }

    fn path(&self) -> Option<&[u8]> {
        self.path.as_deref()
    }

    fn method(&self) -> Option<&[u8]> {
        self.method
            .get_or_init(|| {
                self.values
                    .value(Read::RequestHeader(":method"))
                    .map(Cow::into_owned)
            })
            .as_deref()
    }

    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
}
