//! Route matching (`tollgate_common::route`) on the normalised path: a rule's `match` object
//! (JSON from the input) against a request target. Properties: no panic; a configured prefix or
//! exact path that validates is itself a normal path; `prefix_matches` agrees with a reference
//! that compares segments (`/healthz` covers `/healthz` and `/healthz/...`, never `/healthzX`;
//! `/v1/` covers `/v1/...`, never `/v1`); an exact path matches only itself; and a match never
//! depends on how the client spelled the path (the request and its normal form match alike);
//! configured hosts are in canonical form (`tollgate_common::authority`); `ignore_case` matches
//! exactly when the lower-cased path matches the lower-cased rule.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_common::authority::canonical_host;
use tollgate_common::path::{is_normal, normalize, PathPolicy};
use tollgate_common::route::{prefix_matches, RouteMatch};

/// Segment-wise prefix test, the reference for `prefix_matches` on normal paths.
fn covers(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    let segments = |s: &str| s[1..].split('/').map(str::to_owned).collect::<Vec<_>>();
    let have = segments(path);
    match prefix.strip_suffix('/') {
        Some(dir) => {
            let want = segments(dir);
            have.len() > want.len() && have[..want.len()] == want[..]
        }
        None => {
            let want = segments(prefix);
            have.len() >= want.len() && have[..want.len()] == want[..]
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // `<match JSON> 0xff <request target>`
    let Some(split) = data.iter().position(|&b| b == 0xff) else {
        return;
    };
    let (json, target) = (&data[..split], &data[split + 1..]);
    let policy = PathPolicy::default();
    let Ok(mut route) = serde_json::from_slice::<RouteMatch>(json) else {
        return;
    };
    if route.validate("match", &policy).is_err() {
        return;
    }
    for p in route.prefix.iter().chain(route.path.iter()) {
        assert!(is_normal(p, &policy), "{p:?}");
    }
    let Ok(request) = normalize(target, &policy) else {
        return;
    };
    let path: &str = &request.path;
    let method = route.methods.first().cloned().unwrap_or_default();
    let host = route.hosts.first().cloned().unwrap_or_default();
    let matched = route.matches(path, &method, &host);
    for h in &route.hosts {
        assert_eq!(
            canonical_host(h.as_bytes()).as_deref(),
            Ok(h.as_str()),
            "{h:?}"
        );
    }
    let host_ok = route.hosts.is_empty() || route.hosts.contains(&host);
    // With ignore_case, the reference compares lower-cased paths.
    let (lower_path, lower_rule);
    let (path_ref, fold) = if route.ignore_case {
        lower_path = path.to_ascii_lowercase();
        (lower_path.as_str(), true)
    } else {
        (path, false)
    };
    let rule = |r: &String| -> String {
        if fold {
            r.to_ascii_lowercase()
        } else {
            r.clone()
        }
    };
    let path_ok = match (&route.path, &route.prefix) {
        (Some(exact), _) => path_ref == rule(exact),
        (None, Some(prefix)) => {
            lower_rule = rule(prefix);
            assert_eq!(
                prefix_matches(prefix, path, route.ignore_case),
                covers(&lower_rule, path_ref),
                "{prefix:?} {path:?}"
            );
            covers(&lower_rule, path_ref)
        }
        (None, None) => true,
    };
    assert_eq!(matched, path_ok && host_ok);
    // Any spelling of the same path matches alike: the normal form, re-normalised.
    let forwarded = request.target();
    let again = normalize(forwarded.as_bytes(), &policy).expect("normal targets are accepted");
    assert_eq!(route.matches(&again.path, &method, &host), matched);
});
