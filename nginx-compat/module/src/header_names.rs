//! The host's own property `tollgate.http.plain_header_names`: `1` when nginx passes the filters
//! no request header from a client whose name has a character other than letters, digits and
//! `-`, so a filter that removes a header need not list a request's names to find its other
//! spellings (`x_jwt_sub` for `x-jwt-sub`, which a CGI-style upstream reads as one header: RFC
//! 3875 section 4.1.18), else `0`. Answered in every context (root contexts' `on_configure`
//! included) from the configuration, once per cycle: no work per request. Envoy and Kong's
//! module have no such property (NotFound): a filter then lists the names itself.
//!
//! When `1`: every `server {}` of the `http {}` block keeps nginx's defaults
//! `underscores_in_headers off` and `ignore_invalid_headers on`. nginx then drops each request
//! header whose name has `_` or another character outside `[A-Za-z0-9-]`: HTTP/1
//! (`ngx_http_parse_header_line` marks it invalid, `ngx_http_process_request_headers` drops
//! it), HTTP/2 (`ngx_http_v2_validate_header`) and HTTP/3 alike. Every server has to agree
//! because nginx reads the headers sent before Host with the settings of the address's default
//! server (or the TLS SNI server) and the later ones with the server the Host selects
//! (`ngx_http_process_request_headers` takes the server's settings again after each header):
//! a default server with `underscores_in_headers on` lets an `x_jwt_sub` sent before Host
//! into any server of its address (tests/e2e/test_header_aliases.py).
//! Headers that nginx modules or filters add are the operator's, not the client's. The servers'
//! settings are read in `postconfiguration` (`lifecycle.rs`, `nginx_drops_other_names`); this
//! file is nginx-free.

/// The property's path as the SDKs pass it (segments joined by `\0`).
const PATH: &[u8] = b"tollgate\0http\0plain_header_names";
/// The same path written with dots.
const PATH_DOTTED: &[u8] = b"tollgate.http.plain_header_names";

/// The value of property `path` when it is this one: `1` when `plain`, else `0`.
pub fn property(path: &[u8], plain: bool) -> Option<&'static [u8]> {
    (path == PATH || path == PATH_DOTTED).then_some(if plain { b"1" } else { b"0" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_path_is_answered() {
        assert_eq!(property(PATH, true), Some(&b"1"[..]));
        assert_eq!(property(PATH_DOTTED, false), Some(&b"0"[..]));
        for other in [
            &b"tollgate\0http\0plain_header_names\0x"[..],
            b"tollgate\0request\0plain_header_names",
            b"tollgate\0http",
            b"",
        ] {
            assert_eq!(property(other, true), None, "{other:?}");
        }
    }
}
