;; A proxy-wasm filter that traps (`unreachable`) in on_request_headers when the path starts
;; with "/t", and lets every other request continue (tests/e2e/test_nginx_module.py).
(module
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 100) ":path")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  ;; traps when the path is "/trap..." (5 bytes at 200.. checked by loading ptr)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $get (i32.const 0) (i32.const 100) (i32.const 5) (i32.const 300) (i32.const 304)))
    ;; value ptr at 300; if value[1] == 't' trap
    (if (i32.eq (i32.load8_u offset=1 (i32.load (i32.const 300))) (i32.const 116))
      (then unreachable))
    (i32.const 0))
)
