//! The HTTP module's configuration: what the `proxy_wasm*` directives build (see
//! `directives.rs`), per http{} block ([`MainConf`]) and per server or location ([`LocConf`]).

/// A `proxy_wasm` directive: one root context per worker. Two are the same filter (not run
/// twice on a request, see `request.rs`) when their module, name and configuration are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterDef {
    /// The module's name (also the plugin name).
    pub name: String,
    /// Index of the module in the `wasm {}` block.
    pub module: usize,
    /// The plugin configuration (`on_configure`).
    pub config: Vec<u8>,
}

/// The isolation mode (`proxy_wasm_isolation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Isolation {
    /// One instance per module per worker.
    #[default]
    None,
    /// One instance per module per request.
    Stream,
    /// One instance per filter per request.
    Filter,
}

impl Isolation {
    /// The mode named by `proxy_wasm_isolation`'s argument; `None` for another word.
    pub fn parse(v: &[u8]) -> Option<Isolation> {
        match v {
            b"none" => Some(Isolation::None),
            b"stream" => Some(Isolation::Stream),
            b"filter" => Some(Isolation::Filter),
            _ => None,
        }
    }
}

#[derive(Default)]
pub struct MainConf {
    /// Filters by index (location chains refer to them).
    pub filters: Vec<FilterDef>,
    /// The file each filter's configuration was read from (`tollgate_proxy_wasm_file`), by
    /// filter index, for error messages.
    pub config_files: Vec<(usize, std::path::PathBuf)>,
}

/// A server or location configuration.
#[derive(Default, Clone)]
pub struct LocConf {
    /// The chain (`None`: not set at this level, inherited).
    pub chain: Option<Vec<usize>>,
    /// `proxy_wasm_isolation`.
    pub isolation: Option<Isolation>,
    /// `proxy_wasm_request_headers_in_access`.
    pub headers_in_access: Option<bool>,
    /// `tollgate_metrics` here.
    pub metrics: bool,
}

impl LocConf {
    /// nginx's merge: what this level did not set comes from the enclosing one (`prev`). A
    /// level with its own `proxy_wasm` directives keeps its chain whole (as ngx_wasm_module).
    pub fn merge(&mut self, prev: &LocConf) {
        if self.chain.is_none() {
            self.chain = prev.chain.clone();
        }
        if self.isolation.is_none() {
            self.isolation = prev.isolation;
        }
        if self.headers_in_access.is_none() {
            self.headers_in_access = prev.headers_in_access;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_are_ngx_wasm_modules() {
        assert_eq!(Isolation::parse(b"none"), Some(Isolation::None));
        assert_eq!(Isolation::parse(b"stream"), Some(Isolation::Stream));
        assert_eq!(Isolation::parse(b"filter"), Some(Isolation::Filter));
        assert_eq!(Isolation::parse(b"Stream"), None);
        assert_eq!(Isolation::parse(b""), None);
        assert_eq!(Isolation::default(), Isolation::None);
    }

    #[test]
    fn a_level_without_settings_inherits_them_all() {
        let outer = LocConf {
            chain: Some(vec![0, 1]),
            isolation: Some(Isolation::Filter),
            headers_in_access: Some(true),
            metrics: true,
        };
        let mut inner = LocConf::default();
        inner.merge(&outer);
        assert_eq!(inner.chain, Some(vec![0, 1]));
        assert_eq!(inner.isolation, Some(Isolation::Filter));
        assert_eq!(inner.headers_in_access, Some(true));
        // `tollgate_metrics` is a location's own handler, never inherited.
        assert!(!inner.metrics);
    }

    #[test]
    fn a_level_with_its_own_chain_keeps_it_whole() {
        let outer = LocConf {
            chain: Some(vec![0, 1]),
            isolation: Some(Isolation::Stream),
            ..LocConf::default()
        };
        let mut inner = LocConf {
            chain: Some(vec![2]),
            headers_in_access: Some(false),
            ..LocConf::default()
        };
        inner.merge(&outer);
        // As ngx_wasm_module: the outer chain is not appended to or merged into the inner one.
        assert_eq!(inner.chain, Some(vec![2]));
        assert_eq!(inner.isolation, Some(Isolation::Stream));
        assert_eq!(inner.headers_in_access, Some(false));
    }
}
