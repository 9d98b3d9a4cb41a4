;; A proxy-wasm filter exercising shared queues (tests/e2e/test_nginx_module.py):
;; - proxy_on_configure registers the queue "jobs" (a failure refuses the configuration);
;; - a request whose path starts with "/enq" resolves "jobs" under the vm_id "queue" and enqueues
;;   its path: local response 200, or 503 when the resolve or the enqueue fails (the status code
;;   is in the x-status response header);
;; - proxy_on_queue_ready dequeues one message and adds 1 to the shared data key "q/count"
;;   (a 4-byte little-endian counter, updated with CAS and retried on a mismatch), and adds the
;;   message's length to "q/bytes";
;; - a request to "/count" answers 200 with the 8 bytes of "q/count" then "q/bytes" as body.
(module
  (import "env" "proxy_get_header_map_value" (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_register_shared_queue" (func $register (param i32 i32 i32) (result i32)))
  (import "env" "proxy_resolve_shared_queue" (func $resolve (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_enqueue_shared_queue" (func $enqueue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_dequeue_shared_queue" (func $dequeue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response"
    (func $respond (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 8192))
  (global $jobs (mut i32) (i32.const 0))
  (data (i32.const 100) ":path")
  (data (i32.const 120) "jobs")
  (data (i32.const 140) "queue")
  (data (i32.const 160) "q/count")
  (data (i32.const 170) "q/bytes")
  ;; Serialized header map with one pair: count=1, key len 8, value len 1, "x-status\00" "0\00".
  (data (i32.const 600) "\01\00\00\00\08\00\00\00\01\00\00\00x-status\000\00")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (if (call $register (i32.const 120) (i32.const 4) (i32.const 200))
      (then (return (i32.const 0))))
    (global.set $jobs (i32.load (i32.const 200)))
    (i32.const 1))

  ;; Adds $delta to the 4-byte counter under the key at $key (7 bytes), with CAS retries.
  (func $add (param $key i32) (param $delta i32)
    (local $cas i32)
    (local $value i32)
    (loop $retry
      (if (i32.eqz (call $get_shared (local.get $key) (i32.const 7)
                         (i32.const 420) (i32.const 424) (i32.const 428)))
        (then
          (local.set $value (i32.load (i32.load (i32.const 420))))
          (local.set $cas (i32.load (i32.const 428))))
        (else
          (local.set $value (i32.const 0))
          (local.set $cas (i32.const 0))))
      (i32.store (i32.const 440) (i32.add (local.get $value) (local.get $delta)))
      ;; 8 = CasMismatch: another worker updated it first.
      (br_if $retry (i32.eq (i32.const 8)
        (call $set_shared (local.get $key) (i32.const 7) (i32.const 440) (i32.const 4)
                          (local.get $cas))))))

  (func (export "proxy_on_queue_ready") (param $root i32) (param $queue i32)
    (if (i32.eqz (call $dequeue (local.get $queue) (i32.const 400) (i32.const 404)))
      (then
        (call $add (i32.const 160) (i32.const 1))
        (call $add (i32.const 170) (i32.load (i32.const 404))))))

  ;; Local response with the status digit (0 ok, else the proxy-wasm status) in x-status.
  (func $reply (param $code i32) (param $status i32) (param $body i32) (param $len i32)
    (i32.store8 (i32.const 621) (i32.add (i32.const 48) (i32.rem_u (local.get $status) (i32.const 10))))
    (drop (call $respond (local.get $code) (i32.const 0) (i32.const 0)
                         (local.get $body) (local.get $len) (i32.const 600) (i32.const 23) (i32.const -1))))

  (func (export "proxy_on_request_headers") (param $ctx i32) (param i32 i32) (result i32)
    (local $path i32)
    (local $len i32)
    (local $s i32)
    (drop (call $get_header (i32.const 0) (i32.const 100) (i32.const 5) (i32.const 300) (i32.const 304)))
    (local.set $path (i32.load (i32.const 300)))
    (local.set $len (i32.load (i32.const 304)))
    ;; "/enq..." (little-endian "/enq" = 0x716e652f)
    (if (i32.and (i32.ge_u (local.get $len) (i32.const 4))
                 (i32.eq (i32.load (local.get $path)) (i32.const 0x716e652f)))
      (then
        (local.set $s (call $resolve (i32.const 140) (i32.const 5) (i32.const 120) (i32.const 4)
                                     (i32.const 208)))
        (if (i32.eqz (local.get $s))
          (then (local.set $s (call $enqueue (i32.load (i32.const 208)) (local.get $path)
                                             (local.get $len)))))
        (call $reply (select (i32.const 200) (i32.const 503) (i32.eqz (local.get $s)))
                     (local.get $s) (i32.const 0) (i32.const 0))
        (return (i32.const 1))))
    ;; "/cou..." (little-endian "/cou" = 0x756f632f)
    (if (i32.and (i32.ge_u (local.get $len) (i32.const 4))
                 (i32.eq (i32.load (local.get $path)) (i32.const 0x756f632f)))
      (then
        (i64.store (i32.const 500) (i64.const 0))
        (if (i32.eqz (call $get_shared (i32.const 160) (i32.const 7)
                           (i32.const 420) (i32.const 424) (i32.const 428)))
          (then (i32.store (i32.const 500) (i32.load (i32.load (i32.const 420))))))
        (if (i32.eqz (call $get_shared (i32.const 170) (i32.const 7)
                           (i32.const 420) (i32.const 424) (i32.const 428)))
          (then (i32.store (i32.const 504) (i32.load (i32.load (i32.const 420))))))
        (call $reply (i32.const 200) (i32.const 0) (i32.const 500) (i32.const 8))
        (return (i32.const 1))))
    (i32.const 0))
)
