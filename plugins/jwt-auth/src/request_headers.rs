//! The request's headers as jwt-auth reads them (wasm32): from one read of the whole list when
//! it must look at every name (the CGI spellings of the headers it writes, README "On
//! success"), else one host call per header asked; and the removal of every client copy of
//! the headers it writes.

use tollgate_common::abi_codec::{text, HeaderList};
use tollgate_common::host_calls::{
    count, request_header, request_header_list, send_json_error, set_request_header,
};
use tollgate_common::signals;

use crate::config::Config;
use crate::counters::Counters;

/// Removes every client copy of the headers this filter writes, so that no later filter (e.g. the
/// metrics filter's `on_log` on a refused request) reads a forged one.
pub(crate) fn strip_output_headers(config: &Config) {
    for h in &config.output_headers {
        set_request_header(h, None);
    }
}

/// The request's headers as this filter reads them: from one read of the whole list when the
/// filter must look at every name (`Config::cgi_folds`), else one host call per header asked.
/// The names need no look when the host vouches that no client's has an `_` or `.`
/// (`Shared::plain_header_names`: Tollgate's nginx module with nginx's defaults does; Envoy and
/// Kong's module do not).
pub(crate) enum Headers {
    List(HeaderList),
    Each,
}

impl Headers {
    /// `None` when the host cannot list the headers: then the filter cannot tell that no forged
    /// copy is left, and the request is refused (500, `headers_unavailable`).
    pub(crate) fn read(config: &Config, counters: &Counters, plain_names: bool) -> Option<Headers> {
        if config.cgi_folds.is_empty() || plain_names {
            return Some(Headers::Each);
        }
        match request_header_list() {
            Ok(list) => Some(Headers::List(list)),
            Err(status) => {
                log::error!(
                    "cannot read the request's headers (host status {status}); \
                     refusing the request"
                );
                count(counters.headers_unavailable);
                strip_output_headers(config);
                signals::publish_outcome(signals::JWT_AUTH, "headers_unavailable");
                send_json_error(
                    500,
                    &[],
                    "internal_error",
                    "jwt-auth cannot read the request's headers",
                );
                None
            }
        }
    }

    /// A header's value as text (`tollgate_common::host_calls::request_header`).
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        match self {
            Headers::List(list) => list.first(name).map(|v| text(v.to_vec())),
            Headers::Each => request_header(name),
        }
    }

    /// Removes the client's copies of the headers this filter writes or removes under the other
    /// spellings a CGI-style upstream reads as them (`x_jwt_sub` for `x-jwt-sub`: README, "On
    /// success"), found in the list read when the request came in.
    pub(crate) fn strip_cgi_aliases(&self, config: &Config) {
        if let Headers::List(list) = self {
            for name in list.cgi_aliases(&config.cgi_folds) {
                // An alias folds to ASCII, so it is ASCII itself.
                if let Ok(name) = tollgate_common::bytes::utf8(name) {
                    set_request_header(name, None);
                }
            }
        }
    }
}
