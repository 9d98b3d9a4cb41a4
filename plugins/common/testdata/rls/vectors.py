#!/usr/bin/env python3
"""Test vectors for plugins/common/src/rls.rs, encoded by an independent implementation: Python's
protobuf runtime, with messages compiled by protoc (grpcio-tools) from the proto text below.

The proto text keeps, of Envoy's API, exactly the messages and field numbers rls.rs implements:
  envoy/service/ratelimit/v3/rls.proto (RateLimitRequest, RateLimitResponse and its nested types)
  envoy/extensions/common/ratelimit/v3/ratelimit.proto (RateLimitDescriptor; hits_addend = 3 as
    generated in go-control-plane envoy v1.32.4, the version envoyproxy/ratelimit builds with)
  envoy/type/v3/ratelimit_unit.proto (RateLimitUnit)
(field numbers checked against go-control-plane envoy v1.32.4's generated rls.pb.go and
ratelimit.pb.go: RateLimitResponse.RateLimit.Unit has WEEK = 7 there, RateLimitUnit does not)
without the validation and versioning annotations (which do not change the wire format).

Run (a scratch virtual environment outside the repository):
  python3 -m venv /tmp/pbvenv && /tmp/pbvenv/bin/pip install protobuf==5.29.3 grpcio-tools
  /tmp/pbvenv/bin/python plugins/common/testdata/rls/vectors.py
It prints one `name hex` line per vector; rls.rs's tests hold them verbatim.
"""
import importlib
import os
import sys
import tempfile

from grpc_tools import protoc

PROTO = r'''
syntax = "proto3";
package envoy.service.ratelimit.v3;
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

enum RateLimitUnit { UNKNOWN = 0; SECOND = 1; MINUTE = 2; HOUR = 3; DAY = 4; MONTH = 5; YEAR = 6; }

message RateLimitDescriptor {
  message Entry { string key = 1; string value = 2; }
  message RateLimitOverride { uint32 requests_per_unit = 1; RateLimitUnit unit = 2; }
  repeated Entry entries = 1;
  RateLimitOverride limit = 2;
  google.protobuf.UInt64Value hits_addend = 3;
}

message RateLimitRequest {
  string domain = 1;
  repeated RateLimitDescriptor descriptors = 2;
  uint32 hits_addend = 3;
}

message RateLimitResponse {
  enum Code { UNKNOWN = 0; OK = 1; OVER_LIMIT = 2; }
  message RateLimit {
    enum Unit { UNKNOWN = 0; SECOND = 1; MINUTE = 2; HOUR = 3; DAY = 4; MONTH = 5; YEAR = 6; WEEK = 7; }
    string name = 3;
    uint32 requests_per_unit = 1;
    Unit unit = 2;
  }
  message DescriptorStatus {
    Code code = 1;
    RateLimit current_limit = 2;
    uint32 limit_remaining = 3;
    google.protobuf.Duration duration_until_reset = 4;
  }
  Code overall_code = 1;
  repeated DescriptorStatus statuses = 2;
  bytes raw_body = 5;
}
'''


def main():
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "rls_vectors.proto"), "w") as f:
        f.write(PROTO)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{tmp}", f"-I{include}", f"--python_out={tmp}", "rls_vectors.proto"])
    if rc != 0:
        sys.exit(f"protoc failed: {rc}")
    sys.path.insert(0, tmp)
    pb = importlib.import_module("rls_vectors_pb2")
    R = pb.RateLimitResponse

    def out(name, msg):
        print(name, msg.SerializeToString(deterministic=True).hex())

    # Two descriptors: the first carries its own hits_addend, the second inherits the request's.
    req = pb.RateLimitRequest(domain="tollgate", hits_addend=3)
    d = req.descriptors.add()
    d.entries.add(key="rule", value="per-user")
    d.entries.add(key="key", value="alice")
    d.limit.requests_per_unit = 10
    d.limit.unit = pb.MINUTE
    d.hits_addend.value = 3
    d = req.descriptors.add()
    d.entries.add(key="rule", value="per-user")
    d.limit.requests_per_unit = 5
    d.limit.unit = pb.SECOND
    out("request_two_descriptors", req)

    # A pure check (the cost filter's budget check): hits_addend present and 0.
    req = pb.RateLimitRequest(domain="tollgate")
    d = req.descriptors.add()
    d.entries.add(key="tenant", value="acme")
    d.limit.requests_per_unit = 4000000000
    d.limit.unit = pb.DAY
    d.hits_addend.value = 0
    out("request_check_only", req)

    ok = R(overall_code=R.OK)
    s = ok.statuses.add(code=R.OK, limit_remaining=7)
    s.current_limit.requests_per_unit = 10
    s.current_limit.unit = R.RateLimit.MINUTE
    s.duration_until_reset.seconds = 42
    s = ok.statuses.add(code=R.OK, limit_remaining=4)
    s.current_limit.requests_per_unit = 5
    s.current_limit.unit = R.RateLimit.SECOND
    s.duration_until_reset.nanos = 500000000
    out("response_ok", ok)

    over = R(overall_code=R.OVER_LIMIT, raw_body=b"ignored")
    s = over.statuses.add(code=R.OVER_LIMIT, limit_remaining=0)
    s.current_limit.requests_per_unit = 10
    s.current_limit.unit = R.RateLimit.MINUTE
    s.duration_until_reset.seconds = 17
    s.duration_until_reset.nanos = 250000000
    s = over.statuses.add(code=R.OK, limit_remaining=4)
    s.current_limit.requests_per_unit = 5
    s.current_limit.unit = R.RateLimit.SECOND
    s.duration_until_reset.seconds = 1
    out("response_over_limit_with_raw_body", over)

    # overall_code 7: not a Code this protocol defines (proto3 keeps it as an open enum value).
    unknown = R(overall_code=7)
    unknown.statuses.add(code=R.OK, limit_remaining=1)
    out("response_unknown_overall_code", unknown)

    out("response_empty", R())


if __name__ == "__main__":
    main()
