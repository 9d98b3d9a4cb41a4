// Tollgate gateway load test: one request pattern ("scenario") sent by VUS virtual users for
// DURATION, each VU on its own keep-alive connection. Used by bench/gateway.py (one run per
// measured cell) and usable on its own against any deployment:
//
//   k6 run -e BASE_URL=https://gw.example.com -e SCENARIO=jwt-valid-hs256 \
//          -e TOKEN_HS256="$TOKEN" -e VUS=8 -e DURATION=30s bench/k6/gateway.js
//
// Environment variables (`-e NAME=VALUE` or the process environment):
//   BASE_URL         the gateway, e.g. http://127.0.0.1:10000 (required)
//   SCENARIO         one of the names below, or several separated by commas (run one after the
//                    other); default proxy-only
//   VUS              virtual users = concurrent connections (default 1)
//   DURATION         per scenario, a k6 duration of at least 1s: 1s, 30s, 2m (default 10s)
//   REQUEST_PATH     overrides the scenario's path (e.g. /v1/chat/completions)
//   BODY             overrides the scenario's request body (POST scenarios)
//   EXPECT_STATUS    overrides the scenario's expected status (e.g. 403)
//   TOKEN_HS256      bearer token valid for the gateway, HS256 (jwt-valid-hs256, stack-*)
//   TOKEN_RS256      bearer token valid for the gateway, RS256 (jwt-valid-rs256)
//   TOKEN_WRONG      bearer token signed with a wrong secret (jwt-reject-wrong-secret: 401)
//   API_KEY          value of the rate-limit key header x-api-key (default bench-client)
//   TENANT           value of x-tenant for cost and metrics (default bench-tenant)
//   MODEL            the model in the chat completion bodies (default gpt-4o-mini)
//   STICKY_COOKIE    Cookie header pinning an upstream (sticky-read, stack-full)
//   STICKY_UPSTREAM  if set, the x-upstream-name response header the sticky scenarios expect
//   P99_MS           threshold on p99 latency in ms (default 1000)
//   SUMMARY_JSON     if set, handleSummary writes k6's summary (JSON) to this path
//   TAG_HOST, TAG_VARIANT, TAG_WORKERS   extra tags on every metric (set by bench/gateway.py)
//
// Scenarios (requests with x-mock-* headers drive the demo upstream's mock LLM endpoints; other
// upstreams ignore them):
//   proxy-only                  GET /bench, no credentials
//   jwt-valid-hs256             GET /bench, Authorization: Bearer TOKEN_HS256
//   jwt-valid-rs256             GET /bench, Authorization: Bearer TOKEN_RS256
//   jwt-reject-wrong-secret     GET /bench, Authorization: Bearer TOKEN_WRONG, expects 401
//   rate-limit-allow            GET /bench, x-api-key: API_KEY (a limit that never rejects)
//   cost-openai-nonstream-small POST /v1/chat/completions, small non-streaming chat completion
//   cost-openai-stream          the same streamed (SSE, stream_options.include_usage, 8 chunks)
//   metrics                     GET /bench, x-tenant: TENANT
//   sticky-read                 GET /bench, Cookie: STICKY_COOKIE (an upstream already chosen)
//   stack-likely                POST /v1/chat/completions with a token, an API key, a tenant
//   stack-full                  stack-likely plus Cookie: STICKY_COOKIE
//
// Checks: the status (and for SSE the content type, for sticky scenarios the upstream when
// STICKY_UPSTREAM is set). Thresholds, per scenario: every check passes, no unexpected status
// or network error, p99 below P99_MS. k6 exits with 99 when a threshold is crossed.
import http from 'k6/http';
import { check } from 'k6';

const env = (name, fallback) => (__ENV[name] !== undefined && __ENV[name] !== '' ? __ENV[name] : fallback);

const BASE_URL = env('BASE_URL', '');
const VUS = parseInt(env('VUS', '1'), 10);
const DURATION = env('DURATION', '10s');
const P99_MS = parseFloat(env('P99_MS', '1000'));
const API_KEY = env('API_KEY', 'bench-client');
const TENANT = env('TENANT', 'bench-tenant');
const MODEL = env('MODEL', 'gpt-4o-mini');

const bearer = (name) => ({ authorization: `Bearer ${env(name, '')}` });
const chat = (stream) => JSON.stringify(Object.assign(
  { model: MODEL, messages: [{ role: 'user', content: 'hi' }] },
  stream ? { stream: true, stream_options: { include_usage: true } } : {},
));
// The demo upstream's mock usage: 120 prompt tokens (20 cached), 40 completion tokens.
const LLM = {
  'content-type': 'application/json', 'x-tenant': TENANT,
  'x-mock-prompt-tokens': '120', 'x-mock-completion-tokens': '40', 'x-mock-cached-tokens': '20',
};
const STACK = Object.assign({}, LLM, bearer('TOKEN_HS256'), { 'x-api-key': API_KEY });
const cookie = () => (env('STICKY_COOKIE', '') ? { cookie: env('STICKY_COOKIE', '') } : {});

// name -> request; `sticky` scenarios check STICKY_UPSTREAM, `sse` ones the content type.
const SCENARIOS = {
  'proxy-only': { method: 'GET', path: '/bench', headers: {}, status: 200 },
  'jwt-valid-hs256': { method: 'GET', path: '/bench', headers: bearer('TOKEN_HS256'), status: 200 },
  'jwt-valid-rs256': { method: 'GET', path: '/bench', headers: bearer('TOKEN_RS256'), status: 200 },
  'jwt-reject-wrong-secret': { method: 'GET', path: '/bench', headers: bearer('TOKEN_WRONG'), status: 401 },
  'rate-limit-allow': { method: 'GET', path: '/bench', headers: { 'x-api-key': API_KEY }, status: 200 },
  'cost-openai-nonstream-small': { method: 'POST', path: '/v1/chat/completions', headers: LLM, body: chat(false), status: 200 },
  'cost-openai-stream': {
    method: 'POST', path: '/v1/chat/completions', headers: Object.assign({ 'x-mock-chunks': '8' }, LLM),
    body: chat(true), status: 200, sse: true,
  },
  'metrics': { method: 'GET', path: '/bench', headers: { 'x-tenant': TENANT }, status: 200 },
  'sticky-read': { method: 'GET', path: '/bench', headers: cookie(), status: 200, sticky: true },
  'stack-likely': { method: 'POST', path: '/v1/chat/completions', headers: STACK, body: chat(false), status: 200 },
  'stack-full': {
    method: 'POST', path: '/v1/chat/completions', headers: Object.assign({}, STACK, cookie()),
    body: chat(false), status: 200, sticky: true,
  },
};

const selected = env('SCENARIO', 'proxy-only').split(',').map((s) => s.trim()).filter((s) => s);
for (const name of selected) {
  if (!SCENARIOS[name]) {
    throw new Error(`unknown SCENARIO ${name}; one of: ${Object.keys(SCENARIOS).join(', ')}`);
  }
}
if (!BASE_URL) {
  throw new Error('BASE_URL is required, e.g. -e BASE_URL=http://127.0.0.1:10000');
}

const seconds = (d) => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(d);
  if (!m) throw new Error(`DURATION: ${d} is not like 1s, 30s, 2m or 1h`);
  return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
};
const extraTags = {};
for (const [k, v] of [['host', 'TAG_HOST'], ['variant', 'TAG_VARIANT'], ['workers', 'TAG_WORKERS']]) {
  if (env(v, '')) extraTags[k] = env(v, '');
}

const scenarios = {};
const thresholds = {};
selected.forEach((name, i) => {
  scenarios[name] = {
    executor: 'constant-vus',
    exec: 'request',
    vus: VUS,
    duration: DURATION,
    startTime: `${i * (seconds(DURATION) + 1)}s`, // one after the other
    gracefulStop: '5s',
    env: { SCENARIO_NAME: name },
    tags: Object.assign({ suite: 'tollgate-gateway', preset: name }, extraTags),
  };
  // k6 tags every sample with its scenario's name (`scenario`).
  thresholds[`checks{scenario:${name}}`] = ['rate==1'];
  thresholds[`http_req_failed{scenario:${name}}`] = ['rate==0'];
  thresholds[`http_req_duration{scenario:${name}}`] = [`p(99)<${P99_MS}`];
  thresholds[`http_reqs{scenario:${name}}`] = ['count>0'];
});

export const options = {
  scenarios,
  thresholds,
  discardResponseBodies: true, // the load generator's own cost; checks look at status and headers
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'max'],
  userAgent: 'tollgate-bench-k6',
};

const requests = {};
for (const name of selected) {
  const s = SCENARIOS[name];
  const status = parseInt(env('EXPECT_STATUS', String(s.status)), 10);
  requests[name] = {
    method: s.method,
    url: BASE_URL.replace(/\/$/, '') + env('REQUEST_PATH', s.path),
    body: s.method === 'GET' ? null : env('BODY', s.body),
    // Only the expected status counts as a success in http_req_failed (401 for the reject case).
    params: { headers: s.headers, responseCallback: http.expectedStatuses(status) },
    status,
    sse: !!s.sse,
    sticky: !!s.sticky,
  };
}
const STICKY_UPSTREAM = env('STICKY_UPSTREAM', '');

export function request() {
  const r = requests[__ENV.SCENARIO_NAME];
  const res = http.request(r.method, r.url, r.body, r.params);
  const checks = { [`status is ${r.status}`]: (x) => x.status === r.status };
  if (r.sse) {
    checks['content-type is text/event-stream'] = (x) => (x.headers['Content-Type'] || '').startsWith('text/event-stream');
  }
  if (r.sticky && STICKY_UPSTREAM) {
    checks[`upstream is ${STICKY_UPSTREAM}`] = (x) => x.headers['X-Upstream-Name'] === STICKY_UPSTREAM;
  }
  check(res, checks);
}

export function handleSummary(data) {
  const out = {};
  const path = env('SUMMARY_JSON', '');
  if (path) out[path] = JSON.stringify(data, null, 1);
  const m = data.metrics;
  const lines = selected.map((name) => {
    const reqs = m[`http_reqs{scenario:${name}}`];
    const dur = m[`http_req_duration{scenario:${name}}`];
    const failed = m[`http_req_failed{scenario:${name}}`];
    const checks = m[`checks{scenario:${name}}`];
    return `${name}: ${reqs ? reqs.values.count : 0} requests, ` +
      `p50 ${dur ? dur.values.med.toFixed(2) : '-'} ms, p99 ${dur ? dur.values['p(99)'].toFixed(2) : '-'} ms, ` +
      `unexpected ${failed ? failed.values.passes : 0}, checks failed ${checks ? checks.values.fails : 0}`;
  });
  out.stdout = lines.join('\n') + '\n';
  return out;
}
