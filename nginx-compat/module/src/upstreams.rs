//! Looking up nginx `upstream {}` blocks by name (for `dispatch_http_call`).

use ngx::ffi::{
    ngx_http_conf_ctx_t, ngx_http_upstream_main_conf_t, ngx_http_upstream_server_t,
    ngx_http_upstream_srv_conf_t,
};

use crate::util::{bytes, lossy};

/// The address (`ip:port`) of the first server of the `upstream {}` block `name`.
pub fn first_server(name: &str) -> Option<String> {
    // SAFETY: reading the current cycle's http configuration (main thread of a worker).
    unsafe {
        let cycle = nginx_sys::ngx_cycle;
        if cycle.is_null() || (*cycle).conf_ctx.is_null() {
            return None;
        }
        let http = (*(*cycle).conf_ctx.add(nginx_sys::ngx_http_module.index))
            .cast::<ngx_http_conf_ctx_t>();
        if http.is_null() {
            return None;
        }
        let umcf = (*(*http)
            .main_conf
            .add(nginx_sys::ngx_http_upstream_module.ctx_index))
        .cast::<ngx_http_upstream_main_conf_t>();
        if umcf.is_null() || (*umcf).upstreams.elts.is_null() {
            return None;
        }
        let ups = std::slice::from_raw_parts(
            (*umcf)
                .upstreams
                .elts
                .cast::<*mut ngx_http_upstream_srv_conf_t>(),
            (*umcf).upstreams.nelts,
        );
        for &u in ups {
            if u.is_null() || bytes(&(*u).host) != name.as_bytes() || (*u).servers.is_null() {
                continue;
            }
            let servers = (*u).servers;
            if (*servers).nelts == 0 || (*servers).elts.is_null() {
                continue;
            }
            let s = &*(*servers).elts.cast::<ngx_http_upstream_server_t>();
            if s.naddrs == 0 || s.addrs.is_null() {
                continue;
            }
            return Some(lossy(&(*s.addrs).name));
        }
        None
    }
}

/// Resolves an `upstream` argument: `host:port`, or the name of an nginx `upstream {}` block
/// (its first server). `None`: unknown.
pub fn resolve_upstream(name: &str) -> Option<String> {
    if let Some(addr) = first_server(name) {
        return Some(addr);
    }
    if name
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
    {
        return Some(name.to_owned());
    }
    None
}

/// `address` (`host:port`) with its host replaced by the address `resolver_add` gave it
/// (ngx_wasm_module's directive, docs/DIRECTIVES.md; the last one for a host wins, names
/// compared case-insensitively as DNS does); unchanged otherwise.
pub fn static_host(address: &str, hosts: &[(String, std::net::IpAddr)]) -> String {
    let Some((host, port)) = address.rsplit_once(':') else {
        return address.to_owned();
    };
    let Ok(port) = port.parse::<u16>() else {
        return address.to_owned();
    };
    match hosts
        .iter()
        .rev()
        .find(|(name, _)| name.eq_ignore_ascii_case(host))
    {
        Some((_, ip)) => std::net::SocketAddr::new(*ip, port).to_string(),
        None => address.to_owned(),
    }
}
