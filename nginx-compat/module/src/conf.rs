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
