//! What the metrics filter reads in `on_log` ([`list`]), in one host call where the host offers
//! it (`tollgate_common::prefetch`), and where each value is in that list.

use tollgate_common::prefetch::{Read, ReadList};
use tollgate_common::signals;

use crate::config::Config;
use crate::record::{REQUEST_SIZE, RESPONSE_CODE, RESPONSE_SIZE};

/// The list, in this order: `:method`, `:path`, the tenant's identity (or, without
/// a tenant, the jwt-auth line again), the lines of jwt-auth, rate-limit and cost, the response
/// code, the request and response sizes, the clock (the request's end).
pub fn list(config: &Config) -> ReadList<10> {
    let identity = config
        .tenant
        .as_ref()
        .map_or(Read::Property(signals::JWT_AUTH.as_bytes()), |t| {
            Read::of_identity(&t.source)
        });
    ReadList::new([
        Read::RequestHeader(":method"),
        Read::RequestHeader(":path"),
        identity,
        Read::Property(signals::JWT_AUTH.as_bytes()),
        Read::Property(signals::RATE_LIMIT.as_bytes()),
        Read::Property(signals::COST.as_bytes()),
        Read::Property(RESPONSE_CODE.as_bytes()),
        Read::Property(REQUEST_SIZE.as_bytes()),
        Read::Property(RESPONSE_SIZE.as_bytes()),
        Read::Clock,
    ])
}

/// Where each value of [`list`] is.
pub mod at {
    pub const METHOD: usize = 0;
    pub const PATH: usize = 1;
    pub const JWT_AUTH: usize = 3;
    pub const RATE_LIMIT: usize = 4;
    pub const COST: usize = 5;
    pub const RESPONSE_CODE: usize = 6;
    pub const REQUEST_SIZE: usize = 7;
    pub const RESPONSE_SIZE: usize = 8;
    pub const CLOCK: usize = 9;
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use tollgate_common::prefetch::Reader;

    use super::*;

    /// Answers each read with its own name or path, one plain call each.
    struct Echo;

    impl Reader for Echo {
        fn get_values(&self, _argument: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn read(&self, read: Read<'_>) -> Option<Vec<u8>> {
            Some(match read {
                Read::RequestHeader(name) | Read::ResponseHeader(name) => name.as_bytes().to_vec(),
                Read::Property(path) => path.to_vec(),
                Read::Clock => b"clock".to_vec(),
            })
        }
        fn header_values(&self, _name: &str) -> Option<Vec<Vec<u8>>> {
            None
        }
    }

    #[test]
    fn each_index_names_its_read() {
        let config = Config::parse(br#"{"routes": []}"#).unwrap();
        let list = list(&config);
        let values = list.fetch(Echo);
        let at = |i: usize| values.get(i).map(Cow::into_owned).unwrap();
        assert_eq!(at(at::METHOD), b":method");
        assert_eq!(at(at::PATH), b":path");
        assert_eq!(at(at::JWT_AUTH), signals::JWT_AUTH.as_bytes());
        assert_eq!(at(at::RATE_LIMIT), signals::RATE_LIMIT.as_bytes());
        assert_eq!(at(at::COST), signals::COST.as_bytes());
        assert_eq!(at(at::RESPONSE_CODE), RESPONSE_CODE.as_bytes());
        assert_eq!(at(at::REQUEST_SIZE), REQUEST_SIZE.as_bytes());
        assert_eq!(at(at::RESPONSE_SIZE), RESPONSE_SIZE.as_bytes());
        assert_eq!(at(at::CLOCK), b"clock");
    }
}
