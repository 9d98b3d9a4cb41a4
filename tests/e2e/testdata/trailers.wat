;; A proxy-wasm filter that sets the response trailer `x-trailer: yes`: in on_response_body at the
;; end of the stream by default, in on_response_headers when its configuration starts with "h".
;; It tries to add a request trailer in on_request_headers and reports that call's status as the
;; response header `x-request-trailer-write` (a digit), and on_response_trailers adds
;; `x-trailers-seen: N` (N: the trailers it was called with). tests/e2e/test_nginx_module.py.
(module
  (import "env" "proxy_get_buffer_bytes" (func $buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  ;; The first byte of each context's plugin configuration ("h": trailers with the headers), at
  ;; 1000 + context id (roots share the instance: a global would not do; ids stay small here).
  (data (i32.const 100) "x-trailer")
  (data (i32.const 112) "yes")
  (data (i32.const 120) "x-request-trailer-write")
  (data (i32.const 150) "x-trailers-seen")
  (data (i32.const 170) "x-req")
  (data (i32.const 180) "1")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func $mode (param $ctx i32) (result i32)
    (i32.load8_u offset=1000 (local.get $ctx)))
  (func (export "proxy_on_context_create") (param $ctx i32) (param $root i32)
    (i32.store8 offset=1000 (local.get $ctx) (call $mode (local.get $root))))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param i32) (result i32)
    (i32.store (i32.const 304) (i32.const 0))
    ;; plugin configuration: buffer type 7
    (if (i32.eqz (call $buffer (i32.const 7) (i32.const 0) (i32.const 1) (i32.const 300) (i32.const 304)))
      (then
        (if (i32.load (i32.const 304))
          (then (i32.store8 offset=1000 (local.get $root) (i32.load8_u (i32.load (i32.const 300))))))))
    (i32.const 1))
  (func $add_trailer
    (drop (call $add (i32.const 3) (i32.const 100) (i32.const 9) (i32.const 112) (i32.const 3))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    ;; map 1: request trailers
    (i32.store8 (i32.const 200)
      (i32.add (i32.const 48)
        (call $add (i32.const 1) (i32.const 170) (i32.const 5) (i32.const 180) (i32.const 1))))
    (i32.const 0))
  (func (export "proxy_on_response_headers") (param $ctx i32) (param i32 i32) (result i32)
    (drop (call $add (i32.const 2) (i32.const 120) (i32.const 23) (i32.const 200) (i32.const 1)))
    (if (i32.eq (call $mode (local.get $ctx)) (i32.const 104))
      (then (call $add_trailer)))
    (i32.const 0))
  (func (export "proxy_on_response_body") (param $ctx i32) (param i32) (param $eos i32) (result i32)
    (if (i32.and (local.get $eos) (i32.ne (call $mode (local.get $ctx)) (i32.const 104)))
      (then (call $add_trailer)))
    (i32.const 0))
  (func (export "proxy_on_response_trailers") (param i32) (param $n i32) (result i32)
    (i32.store8 (i32.const 201) (i32.add (i32.const 48) (local.get $n)))
    (drop (call $add (i32.const 3) (i32.const 150) (i32.const 15) (i32.const 201) (i32.const 1)))
    (i32.const 0))
)
