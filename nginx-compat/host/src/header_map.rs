//! The header map every part of the host passes around.

/// Header map (spec: `proxy_map_type_t` values), names lower-case, in order; duplicates allowed.
pub type HeaderMap = Vec<(Vec<u8>, Vec<u8>)>;
