-- wrk hook: one JSON line with the run's totals and latency percentiles (microseconds).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"socket_errors":%d,"non_2xx_3xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
