//! Where jwt-auth finds a token (`tollgate_jwt_auth::token::extract`): an `Authorization:
//! Bearer` header, an `access_token` query parameter and a `session` cookie, in that order, from
//! arbitrary header values and query strings. Properties: no panic; a token is never empty; it
//! comes from the first location that has one, and is exactly what that location holds (the
//! header's value after its case-insensitive prefix, trimmed; the parameter's percent-decoded
//! value; the cookie's value, as the `cookie` crate parses it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::http::query_param;
use tollgate_jwt_auth::token::{cookie_value, extract, TokenLocation};

fuzz_target!(|data: &[u8]| {
    // `<authorization> 0xff <query> 0xff <cookie header>`; a part absent when missing.
    let text = String::from_utf8_lossy(data);
    let mut fields = text.split('\u{fffd}');
    let (auth, query, cookie) = (fields.next(), fields.next(), fields.next());
    let locations = [
        TokenLocation::Header {
            name: "authorization".into(),
            prefix: "Bearer ".into(),
        },
        TokenLocation::Param("access_token".into()),
        TokenLocation::Cookie("session".into()),
    ];
    let header = |name: &str| match name {
        "authorization" => auth.map(str::to_owned),
        "cookie" => cookie.map(str::to_owned),
        _ => None,
    };
    let from_header = auth.and_then(|v| {
        let head = v.get(..7)?;
        head.eq_ignore_ascii_case("Bearer ")
            .then(|| v[7..].trim().to_owned())
    });
    let from_query = query.and_then(|q| query_param(q, "access_token"));
    let from_cookie = cookie.and_then(|c| cookie_value(c, "session"));
    let want = [from_header, from_query, from_cookie]
        .into_iter()
        .enumerate()
        .find_map(|(i, t)| t.filter(|t| !t.is_empty()).map(|t| (i, t)));
    let found = extract(&locations, header, query);
    match (found, want) {
        (None, None) => {}
        (Some(f), Some((i, token))) => {
            assert!(!f.token.is_empty());
            assert_eq!(f.location, &locations[i]);
            assert_eq!(f.token, token);
        }
        (f, w) => panic!("extract gave {f:?}, expected {w:?}"),
    }
});
