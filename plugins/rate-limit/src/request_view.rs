//! The request as rate-limit's keys and rule matches read it (wasm32): pseudo-headers fetched
//! once, on demand, from the host; the path and host read beforehand by the request stage when
//! the configuration reads them.

use std::cell::OnceCell;

use proxy_wasm::types::MapType;
use tollgate_common::host_calls::request_header_bytes;
use tollgate_common::identity::{HostIdentityView, IdentityView};

use crate::key::RequestView;

/// The request as the key and the rule match read it; pseudo-headers fetched once, on demand,
/// the path normalised beforehand when the configuration reads it.
#[derive(Default)]
pub(crate) struct HostRequest {
    pub(crate) path: Option<Vec<u8>>,
    method: OnceCell<Option<Vec<u8>>>,
    /// The canonical host, read beforehand when the configuration reads it.
    pub(crate) host: Option<String>,
}

impl IdentityView for HostRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        request_header_bytes(name)
    }

    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        HostIdentityView.header_values(name)
    }

    fn property(&self, name: &str) -> Option<Vec<u8>> {
        HostIdentityView.property(name)
    }
}

impl RequestView for HostRequest {
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
            .get_or_init(|| request_header_bytes(":method"))
            .as_deref()
    }

    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
}
