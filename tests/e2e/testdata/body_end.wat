;; A proxy-wasm filter that shows where the response's end of stream comes: in
;; on_response_body, a callback with the end of stream and bytes overwrites those bytes with
;; `E` (the same length, so a Content-Length stays right); a callback without bytes or before
;; the end leaves them. tests/e2e/test_nginx_module.py.
(module
  (import "env" "proxy_set_buffer_bytes" (func $set (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 65536))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_response_body") (param $ctx i32) (param $size i32) (param $eos i32) (result i32)
    (if (i32.and (local.get $eos) (i32.and (i32.gt_u (local.get $size) (i32.const 0))
                                            (i32.le_u (local.get $size) (i32.const 4096))))
      (then
        (memory.fill (i32.const 1024) (i32.const 69) (local.get $size))
        ;; buffer 1: the response body
        (drop (call $set (i32.const 1) (i32.const 0) (local.get $size) (i32.const 1024) (local.get $size)))))
    (i32.const 0))
)
