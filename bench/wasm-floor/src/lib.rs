//! The Wasm floor: a proxy-wasm HTTP filter with a root context and an HTTP context that do
//! nothing (every callback keeps the SDK's default, `Continue`). What a gateway pays for it per
//! request is the fixed cost of any proxy-wasm filter in that host (context creation and the
//! callbacks across the VM boundary), which no filter logic can go below. Used by bench/ only.

#[cfg(target_arch = "wasm32")]
mod floor {
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::ContextType;

    proxy_wasm::main! {{
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Floor) });
    }}

    struct Floor;

    impl Context for Floor {}

    impl RootContext for Floor {
        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }

        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Floor))
        }
    }

    impl HttpContext for Floor {}
}
