package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

const testName = "test-up"

// backend is one way of serving the handlers: net/http (via httptest,
// the -stdlib mode) or fasthttp (the default). Endpoint tests run against
// both.
type backend struct {
	name   string
	url    string
	client *http.Client
}

func startFast(t testing.TB, s *server) (*fasthttp.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := newFastServer(s)
	go func() { _ = fs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = fs.ShutdownWithContext(ctx)
	})
	return fs, ln.Addr().String()
}

func backends(t *testing.T) []backend {
	t.Helper()
	s := newServer(testName)
	ts := httptest.NewServer(stdHandler{s})
	t.Cleanup(ts.Close)
	_, addr := startFast(t, s)
	client := func() *http.Client {
		tr := &http.Transport{DisableCompression: true} // see raw gzip bodies
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 20 * time.Second}
	}
	return []backend{
		{"nethttp", ts.URL, client()},
		{"fasthttp", "http://" + addr, client()},
	}
}

func each(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

type result struct {
	code int
	hdr  http.Header
	body []byte
}

func (b backend) do(t *testing.T, method, path string, body io.Reader, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("x-upstream-name"); got != testName {
		t.Errorf("%s %s: x-upstream-name = %q, want %q", method, path, got, testName)
	}
	return result{resp.StatusCode, resp.Header, data}
}

func (b backend) post(t *testing.T, path, body string, hdr ...string) result {
	t.Helper()
	return b.do(t, http.MethodPost, path, strings.NewReader(body), append([]string{"Content-Type", "application/json"}, hdr...)...)
}

func decode(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("invalid JSON %q: %v", truncate(data), err)
	}
	return m
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// get walks a decoded JSON document: get(m, "usage", "prompt_tokens"),
// get(m, "choices", 0, "message").
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func wantEq(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, w := fmt.Sprintf("%#v", got), fmt.Sprintf("%#v", want)
		t.Errorf("%s = %s, want %s", what, truncate([]byte(g)), truncate([]byte(w)))
	}
}

func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ---- simple endpoints -----------------------------------------------------

func TestHealthz(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		r := b.do(t, "GET", "/healthz", nil)
		wantEq(t, "status", r.code, 200)
		wantEq(t, "body", string(r.body), "ok")
		r = b.do(t, "HEAD", "/healthz", nil)
		wantEq(t, "HEAD status", r.code, 200)
		wantEq(t, "HEAD body", len(r.body), 0)
	})
}

func TestStatus(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		for _, tc := range []struct {
			method, path string
			code         int
			body         string
		}{
			{"GET", "/status/200", 200, `{"status":200}`},
			{"GET", "/status/404", 404, `{"status":404}`},
			{"POST", "/status/201", 201, `{"status":201}`},
			{"DELETE", "/status/503", 503, `{"status":503}`},
			{"GET", "/status/599", 599, `{"status":599}`},
			{"GET", "/status/204", 204, ``},
			{"GET", "/status/304", 304, ``},
			{"GET", "/status/103", 200, `{"status":103}`}, // interim 103, then 200
			{"GET", "/status/600", 400, ``},
			{"GET", "/status/099", 400, ``},
			{"GET", "/status/abc", 400, ``},
			{"GET", "/status/2000", 400, ``},
			{"GET", "/status/", 400, ``},
		} {
			var body io.Reader
			if tc.method == "POST" {
				body = strings.NewReader("ignored")
			}
			r := b.do(t, tc.method, tc.path, body)
			if r.code != tc.code {
				t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, r.code, tc.code)
			}
			if tc.code == 400 {
				wantEq(t, tc.path+" status field", get(decode(t, r.body), "status"), 400.0)
			} else if string(r.body) != tc.body {
				t.Errorf("%s %s: body %q, want %q", tc.method, tc.path, r.body, tc.body)
			}
		}
	})
}

func TestStatus101ClosesConnection(t *testing.T) {
	_, addr := startFast(t, newServer(testName))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /status/101 HTTP/1.1\r\nHost: x\r\n\r\n")
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(all, []byte("HTTP/1.1 101 ")) || !bytes.Contains(all, []byte("Connection: close\r\n")) {
		t.Errorf("unexpected response %q", all)
	}
}

func TestBytes(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		for _, n := range []int{0, 1, 1000, 65536, 100000, maxBytesEndpoint} {
			r := b.do(t, "GET", "/bytes/"+strconv.Itoa(n), nil)
			wantEq(t, "status", r.code, 200)
			wantEq(t, "content-type", r.hdr.Get("Content-Type"), "application/octet-stream")
			wantEq(t, "content-length", r.hdr.Get("Content-Length"), strconv.Itoa(n))
			if len(r.body) != n || strings.Trim(string(r.body), "x") != "" {
				t.Errorf("/bytes/%d: got %d bytes", n, len(r.body))
			}
		}
		r := b.do(t, "HEAD", "/bytes/123", nil)
		wantEq(t, "HEAD content-length", r.hdr.Get("Content-Length"), "123")
		for _, p := range []string{"/bytes/10485761", "/bytes/-1", "/bytes/abc", "/bytes/"} {
			wantEq(t, p+" status", b.do(t, "GET", p, nil).code, 400)
		}
	})
}

// ---- echo ------------------------------------------------------------------

func TestEcho(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		r := b.do(t, "PUT", "/some/path%2Fenc?b=2&a=%20x", strings.NewReader("hello world"),
			"X-Multi", "one", "x-multi", "two", "X-Quote", `a"b\c`, "Authorization", "Bearer k")
		wantEq(t, "status", r.code, 200)
		wantEq(t, "content-type", r.hdr.Get("Content-Type"), "application/json")
		m := decode(t, r.body)
		wantEq(t, "upstream", m["upstream"], testName)
		wantEq(t, "method", m["method"], "PUT")
		wantEq(t, "path", m["path"], "/some/path%2Fenc")
		wantEq(t, "query", m["query"], "b=2&a=%20x")
		wantEq(t, "body_bytes", m["body_bytes"], 11.0)
		h := m["headers"].(map[string]any)
		wantEq(t, "x-multi", h["x-multi"], []any{"one", "two"})
		wantEq(t, "x-quote", h["x-quote"], []any{`a"b\c`})
		wantEq(t, "authorization", h["authorization"], []any{"Bearer k"})
		wantEq(t, "content-length", h["content-length"], []any{"11"})
		wantEq(t, "host", h["host"], []any{strings.TrimPrefix(b.url, "http://")})
		for k := range h {
			if k != strings.ToLower(k) {
				t.Errorf("header name %q not lower-case", k)
			}
		}
		// The raw JSON lists header names sorted.
		if i, j := bytes.Index(r.body, []byte(`"authorization"`)), bytes.Index(r.body, []byte(`"x-multi"`)); i < 0 || j < i {
			t.Errorf("headers not sorted: %s", r.body)
		}

		// A chunked request body (unknown length).
		r = b.do(t, "POST", "/v1/other", struct{ io.Reader }{strings.NewReader(strings.Repeat("z", 100000))})
		m = decode(t, r.body)
		wantEq(t, "chunked body_bytes", m["body_bytes"], 100000.0)
		wantEq(t, "transfer-encoding", get(m, "headers", "transfer-encoding"), []any{"chunked"})

		// Every method and a GET on the LLM paths fall through to echo.
		for _, method := range []string{"GET", "DELETE", "PATCH", "OPTIONS"} {
			r = b.do(t, method, "/v1/chat/completions", nil)
			m = decode(t, r.body)
			wantEq(t, method+" method", m["method"], method)
			wantEq(t, method+" body_bytes", m["body_bytes"], 0.0)
		}
		r = b.do(t, "POST", "/healthz", strings.NewReader("x"))
		wantEq(t, "POST /healthz echoes", decode(t, r.body)["path"], "/healthz")
	})
}

// ---- OpenAI Chat Completions ------------------------------------------------

func TestDelayHoldsTheAnswer(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		start := time.Now()
		r := b.post(t, "/v1/chat/completions", `{"model":"m"}`, "x-mock-delay-ms", "200")
		wantEq(t, "status", r.code, 200)
		if elapsed := time.Since(start); elapsed < 200*time.Millisecond {
			t.Errorf("answered after %v, want at least 200ms", elapsed)
		}
	})
}

func TestChatCompletions(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		r := b.post(t, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
		wantEq(t, "status", r.code, 200)
		wantEq(t, "content-type", r.hdr.Get("Content-Type"), "application/json")
		m := decode(t, r.body)
		want := map[string]any{
			"id": "chatcmpl-demo", "object": "chat.completion", "created": 1700000000.0, "model": "gpt-4o",
			"choices": []any{map[string]any{
				"index":         0.0,
				"message":       map[string]any{"role": "assistant", "content": "Hello from " + testName},
				"finish_reason": "stop",
			}},
			"usage": map[string]any{
				"prompt_tokens": 12.0, "completion_tokens": 8.0, "total_tokens": 20.0,
				"prompt_tokens_details":     map[string]any{"cached_tokens": 0.0},
				"completion_tokens_details": map[string]any{"reasoning_tokens": 0.0},
			},
		}
		wantEq(t, "body", m, want)

		r = b.post(t, "/v1/chat/completions", `{"model":"gpt-4o"}`,
			"x-mock-prompt-tokens", "100", "x-mock-completion-tokens", "250",
			"x-mock-cached-tokens", "40", "x-mock-reasoning-tokens", "30", "x-mock-model", "gpt-4o-2024-08-06")
		m = decode(t, r.body)
		wantEq(t, "model override", m["model"], "gpt-4o-2024-08-06")
		wantEq(t, "usage", m["usage"], map[string]any{
			"prompt_tokens": 100.0, "completion_tokens": 250.0, "total_tokens": 350.0,
			"prompt_tokens_details":     map[string]any{"cached_tokens": 40.0},
			"completion_tokens_details": map[string]any{"reasoning_tokens": 30.0},
		})

		r = b.post(t, "/v1/chat/completions", `{"model":"gpt-4o"}`, "x-mock-omit-model", "1")
		if _, ok := decode(t, r.body)["model"]; ok {
			t.Errorf("model present despite x-mock-omit-model: %s", r.body)
		}
		r = b.post(t, "/v1/chat/completions", `{"messages":[]}`)
		wantEq(t, "default model", decode(t, r.body)["model"], defaultModel)
		r = b.post(t, "/v1/chat/completions", ``)
		wantEq(t, "empty body", r.code, 200)
		r = b.post(t, "/v1/chat/completions", `{"model":"a\"b\u00e9"}`)
		wantEq(t, "escaped model", decode(t, r.body)["model"], "a\"bé")
	})
}

func TestBodyModes(t *testing.T) {
	paths := []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/messages"}
	each(t, func(t *testing.T, b backend) {
		for _, p := range paths {
			normal := b.post(t, p, `{"model":"m"}`).body
			if !json.Valid(normal) {
				t.Fatalf("%s: normal body invalid: %s", p, normal)
			}

			r := b.post(t, p, `{"model":"m"}`, "x-mock-body", "malformed")
			wantEq(t, p+" malformed status", r.code, 200)
			if json.Valid(r.body) || len(r.body) != len(normal)-1 {
				t.Errorf("%s malformed: %s", p, r.body)
			}

			r = b.post(t, p, `{"model":"m"}`, "x-mock-body", "truncated")
			if !bytes.Equal(r.body, normal[:len(normal)/2]) {
				t.Errorf("%s truncated: got %q", p, r.body)
			}
			wantEq(t, p+" truncated content-length", r.hdr.Get("Content-Length"), strconv.Itoa(len(normal)/2))

			r = b.post(t, p, `{"model":"m"}`, "x-mock-body", "no-usage")
			m := decode(t, r.body)
			if _, ok := m["usage"]; ok || bytes.Contains(r.body, []byte("usage")) {
				t.Errorf("%s no-usage still has usage: %s", p, r.body)
			}
			wantEq(t, p+" no-usage model", m["model"], "m")

			r = b.post(t, p, `{"model":"m"}`, "x-mock-body", "huge")
			if n := len(r.body); n < 2<<20 || n > 3<<20 {
				t.Errorf("%s huge: %d bytes", p, n)
			}
			m = decode(t, r.body)
			if m["usage"] == nil {
				t.Errorf("%s huge: no usage", p)
			}
			wantEq(t, p+" huge content-length", r.hdr.Get("Content-Length"), strconv.Itoa(len(r.body)))

			r = b.post(t, p, `{"model":"m"}`, "x-mock-gzip", "1")
			wantEq(t, p+" content-encoding", r.hdr.Get("Content-Encoding"), "gzip")
			wantEq(t, p+" gzip content-length", r.hdr.Get("Content-Length"), strconv.Itoa(len(r.body)))
			if got := gunzip(t, r.body); !bytes.Equal(got, normal) {
				t.Errorf("%s gzip: got %q", p, got)
			}

			r = b.post(t, p, `{"model":"m"}`, "x-mock-gzip", "1", "x-mock-body", "truncated")
			if got := gunzip(t, r.body); !bytes.Equal(got, normal[:len(normal)/2]) {
				t.Errorf("%s gzip+truncated: got %q", p, got)
			}
		}
	})
}

type sseEvent struct {
	event string
	data  string
}

func parseSSE(t *testing.T, body []byte, nl string) []sseEvent {
	t.Helper()
	s := string(body)
	if !strings.HasSuffix(s, nl+nl) {
		t.Fatalf("stream does not end with a blank line: %q", truncate(body))
	}
	var evs []sseEvent
	for _, block := range strings.Split(strings.TrimSuffix(s, nl+nl), nl+nl) {
		var ev sseEvent
		for _, line := range strings.Split(block, nl) {
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[len("data: "):]
			default:
				t.Fatalf("unexpected SSE line %q", line)
			}
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestChatStream(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		huge := false
		check := func(r result, nl string, chunks int, usage bool) []sseEvent {
			t.Helper()
			wantEq(t, "status", r.code, 200)
			wantEq(t, "content-type", r.hdr.Get("Content-Type"), "text/event-stream")
			evs := parseSSE(t, r.body, nl)
			n := 1 + chunks + 1 + 1 // role, content..., finish, [DONE]
			if usage {
				n++
			}
			if len(evs) != n {
				t.Fatalf("%d events, want %d: %s", len(evs), n, r.body)
			}
			wantEq(t, "last", evs[len(evs)-1].data, "[DONE]")
			var content strings.Builder
			for i, ev := range evs[:len(evs)-1] {
				m := decode(t, []byte(ev.data))
				wantEq(t, "object", m["object"], "chat.completion.chunk")
				wantEq(t, "model", m["model"], "gpt-4o")
				if u, ok := m["usage"]; usage != ok || (ok && i < len(evs)-2 && u != nil) {
					t.Errorf("event %d usage = %v (present %v)", i, u, ok)
				}
				if s, ok := get(m, "choices", 0, "delta", "content").(string); ok {
					content.WriteString(s)
				}
			}
			wantEq(t, "role", get(decode(t, []byte(evs[0].data)), "choices", 0, "delta", "role"), "assistant")
			fin := decode(t, []byte(evs[chunks+1].data))
			wantEq(t, "finish_reason", get(fin, "choices", 0, "finish_reason"), "stop")
			if usage {
				u := decode(t, []byte(evs[len(evs)-2].data))
				wantEq(t, "usage chunk choices", u["choices"], []any{})
				wantEq(t, "usage chunk usage", u["usage"], map[string]any{
					"prompt_tokens": 7.0, "completion_tokens": 9.0, "total_tokens": 16.0,
					"prompt_tokens_details":     map[string]any{"cached_tokens": 3.0},
					"completion_tokens_details": map[string]any{"reasoning_tokens": 2.0},
				})
			}
			switch {
			case huge:
				if !strings.HasPrefix(content.String(), "Hello from "+testName+" xxxx") || content.Len() < 2<<20 {
					t.Errorf("huge content: %s", truncate([]byte(content.String())))
				}
			case chunks >= 1 && chunks <= 3:
				wantEq(t, "content", content.String(), "Hello from "+testName)
			}
			return evs
		}
		tokens := []string{"x-mock-prompt-tokens", "7", "x-mock-completion-tokens", "9", "x-mock-cached-tokens", "3", "x-mock-reasoning-tokens", "2"}
		withUsage := `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`

		check(b.post(t, "/v1/chat/completions", `{"model":"gpt-4o","stream":true}`), "\n", 3, false)
		check(b.post(t, "/v1/chat/completions", withUsage, tokens...), "\n", 3, true)
		evs := check(b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-chunks", "5")...), "\n", 5, true)
		wantEq(t, "chunk 5", get(decode(t, []byte(evs[5].data)), "choices", 0, "delta", "content"), " 5")
		check(b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-chunks", "1")...), "\n", 1, true)
		check(b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-chunks", "0")...), "\n", 0, true)
		check(b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-crlf", "1")...), "\r\n", 3, true)

		r := b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-gzip", "1")...)
		wantEq(t, "content-encoding", r.hdr.Get("Content-Encoding"), "gzip")
		r.body = gunzip(t, r.body)
		check(r, "\n", 3, true)

		r = b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-body", "no-usage")...)
		check(r, "\n", 3, false)

		r = b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-body", "malformed")...)
		evs = parseSSE(t, r.body, "\n")
		for _, ev := range evs[:len(evs)-1] {
			if json.Valid([]byte(ev.data)) {
				t.Errorf("malformed stream has a valid payload: %s", ev.data)
			}
		}
		wantEq(t, "malformed last", evs[len(evs)-1].data, "[DONE]")

		full := b.post(t, "/v1/chat/completions", withUsage, tokens...).body
		r = b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-body", "truncated")...)
		if !bytes.Equal(r.body, full[:len(full)/2]) {
			t.Errorf("truncated stream = %q", r.body)
		}

		r = b.post(t, "/v1/chat/completions", withUsage, append(tokens, "x-mock-body", "huge")...)
		if len(r.body) < 2<<20 {
			t.Errorf("huge stream is %d bytes", len(r.body))
		}
		huge = true
		check(r, "\n", 3, true)
	})
}

// TestStreamIsFlushedPerEvent reads the first event before the stream has
// ended, through both servers.
func TestStreamIsFlushedPerEvent(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		req, _ := http.NewRequest("POST", b.url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
		req.Header.Set("x-mock-chunks", "3")
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: {") {
			t.Fatalf("first line %q, %v", line, err)
		}
		_, _ = io.Copy(io.Discard, br)
	})
}

// ---- Responses and Embeddings ----------------------------------------------

func TestResponses(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		r := b.post(t, "/v1/responses", `{"model":"o3","input":"hi"}`,
			"x-mock-prompt-tokens", "50", "x-mock-completion-tokens", "20", "x-mock-cached-tokens", "10", "x-mock-reasoning-tokens", "5")
		wantEq(t, "status", r.code, 200)
		m := decode(t, r.body)
		wantEq(t, "object", m["object"], "response")
		wantEq(t, "model", m["model"], "o3")
		wantEq(t, "status field", m["status"], "completed")
		wantEq(t, "output type", get(m, "output", 0, "type"), "message")
		wantEq(t, "output role", get(m, "output", 0, "role"), "assistant")
		wantEq(t, "output text", get(m, "output", 0, "content", 0, "text"), "Hello from "+testName)
		wantEq(t, "output text type", get(m, "output", 0, "content", 0, "type"), "output_text")
		wantEq(t, "usage", m["usage"], map[string]any{
			"input_tokens": 50.0, "output_tokens": 20.0, "total_tokens": 70.0,
			"input_tokens_details":  map[string]any{"cached_tokens": 10.0},
			"output_tokens_details": map[string]any{"reasoning_tokens": 5.0},
		})
		r = b.post(t, "/v1/responses", `{"model":"o3","stream":true}`)
		wantEq(t, "stream rejected", r.code, 400)
		r = b.post(t, "/v1/responses", `{"model":"o3"}`, "x-mock-omit-model", "1")
		if _, ok := decode(t, r.body)["model"]; ok {
			t.Errorf("model not omitted: %s", r.body)
		}
	})
}

func TestEmbeddings(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		r := b.post(t, "/v1/embeddings", `{"model":"text-embedding-3-small","input":"hi"}`, "x-mock-prompt-tokens", "5")
		wantEq(t, "status", r.code, 200)
		wantEq(t, "body", decode(t, r.body), map[string]any{
			"object": "list",
			"data":   []any{map[string]any{"object": "embedding", "index": 0.0, "embedding": []any{0.1, 0.2, 0.3}}},
			"model":  "text-embedding-3-small",
			"usage":  map[string]any{"prompt_tokens": 5.0, "total_tokens": 5.0},
		})
		r = b.post(t, "/v1/embeddings", `{"model":"e"}`, "x-mock-omit-model", "1", "x-mock-body", "no-usage")
		wantEq(t, "bare body", decode(t, r.body), map[string]any{
			"object": "list",
			"data":   []any{map[string]any{"object": "embedding", "index": 0.0, "embedding": []any{0.1, 0.2, 0.3}}},
		})
	})
}

// ---- Anthropic Messages -------------------------------------------------------

func TestMessages(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		hdr := []string{"x-mock-prompt-tokens", "30", "x-mock-completion-tokens", "15", "x-mock-cached-tokens", "6", "x-mock-cache-creation-tokens", "4"}
		r := b.post(t, "/v1/messages", `{"model":"claude-x","max_tokens":10,"messages":[]}`, hdr...)
		wantEq(t, "status", r.code, 200)
		wantEq(t, "body", decode(t, r.body), map[string]any{
			"id": "msg_demo", "type": "message", "role": "assistant", "model": "claude-x",
			"content":     []any{map[string]any{"type": "text", "text": "Hello from " + testName}},
			"stop_reason": "end_turn", "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": 30.0, "output_tokens": 15.0,
				"cache_read_input_tokens": 6.0, "cache_creation_input_tokens": 4.0},
		})

		for _, nl := range []string{"\n", "\r\n"} {
			h := append([]string{}, hdr...)
			if nl == "\r\n" {
				h = append(h, "x-mock-crlf", "1")
			}
			r = b.post(t, "/v1/messages", `{"model":"claude-x","stream":true}`, append(h, "x-mock-chunks", "4")...)
			wantEq(t, "content-type", r.hdr.Get("Content-Type"), "text/event-stream")
			evs := parseSSE(t, r.body, nl)
			var names []string
			var text strings.Builder
			for _, ev := range evs {
				names = append(names, ev.event)
				m := decode(t, []byte(ev.data))
				wantEq(t, "type matches event", m["type"], ev.event)
				if s, ok := get(m, "delta", "text").(string); ok {
					text.WriteString(s)
				}
			}
			wantEq(t, "events", names, []string{"message_start", "content_block_start", "ping",
				"content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta",
				"content_block_stop", "message_delta", "message_stop"})
			wantEq(t, "text", text.String(), "Hello from "+testName+" 4")
			start := decode(t, []byte(evs[0].data))
			wantEq(t, "message_start usage", get(start, "message", "usage"), map[string]any{
				"input_tokens": 30.0, "output_tokens": 1.0, "cache_read_input_tokens": 6.0, "cache_creation_input_tokens": 4.0})
			wantEq(t, "message_start model", get(start, "message", "model"), "claude-x")
			wantEq(t, "message_start content", get(start, "message", "content"), []any{})
			delta := decode(t, []byte(evs[8].data))
			wantEq(t, "message_delta usage", delta["usage"], map[string]any{"output_tokens": 15.0})
			wantEq(t, "stop_reason", get(delta, "delta", "stop_reason"), "end_turn")
		}

		r = b.post(t, "/v1/messages", `{"model":"c","stream":true}`, "x-mock-body", "no-usage", "x-mock-omit-model", "1")
		if bytes.Contains(r.body, []byte("usage")) || bytes.Contains(r.body, []byte(`"model"`)) {
			t.Errorf("no-usage/omit-model stream: %s", r.body)
		}
		r = b.post(t, "/v1/messages", `{"model":"c","stream":true}`, "x-mock-body", "malformed")
		for _, ev := range parseSSE(t, r.body, "\n") {
			if json.Valid([]byte(ev.data)) {
				t.Errorf("malformed stream has valid payload %s", ev.data)
			}
		}
		r = b.post(t, "/v1/messages", `{"model":"c","stream":true}`, "x-mock-gzip", "1")
		if evs := parseSSE(t, gunzip(t, r.body), "\n"); len(evs) != 9 {
			t.Errorf("gzip stream: %d events", len(evs))
		}
		r = b.post(t, "/v1/messages", `{"stream":1}`)
		wantEq(t, "bad stream type", r.code, 400)
		wantEq(t, "anthropic error shape", get(decode(t, r.body), "type"), "error")
	})
}

func TestLLMBadRequests(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		for _, tc := range []struct {
			body string
			hdr  []string
		}{
			{`{"model":`, nil},
			{`not json`, nil},
			{`{"model":"a"} x`, nil},
			{`[1,2]`, nil},
			{`{"model":1}`, nil},
			{`{"stream":"yes"}`, nil},
			{`{"stream_options":{"include_usage":1}}`, nil},
			{`{}`, []string{"x-mock-prompt-tokens", "many"}},
			{`{}`, []string{"x-mock-chunks", "-1"}},
			{`{}`, []string{"x-mock-chunks", "1000001"}},
			{`{}`, []string{"x-mock-delay-ms", "-1"}},
			{`{}`, []string{"x-mock-delay-ms", "10001"}},
			{`{}`, []string{"x-mock-body", "weird"}},
		} {
			r := b.post(t, "/v1/chat/completions", tc.body, tc.hdr...)
			if r.code != 400 || get(decode(t, r.body), "error", "message") == nil {
				t.Errorf("body %q hdr %v: %d %s", tc.body, tc.hdr, r.code, r.body)
			}
		}
	})
}

// ---- request JSON scanner ------------------------------------------------------

var jsonCorpus = []string{
	`{}`, `null`, ` {"model":"gpt"} `, `{"model":null}`, `{"model":"a\"b\\c\u00e9\ud83d\ude00"}`,
	`{"Model":"x"}`, `{"MODEL":"x","model":"y"}`, `{"mod\u0065l":"z"}`, `{"stream":true}`, `{"stream":false}`,
	`{"stream":null}`, `{"stream":"true"}`, `{"stream":1}`, `{"stream_options":null}`,
	`{"stream_options":{"include_usage":true}}`, `{"stream_options":{"include_usage":null}}`,
	`{"stream_options":{"include_usage":true},"stream_options":{"x":1}}`,
	`{"stream_options":{"include_usage":true},"stream_options":null}`, `{"stream_options":[]}`,
	`{"stream_options":{"include_usage":"yes"}}`, `{"messages":[{"role":"user","content":"hi"},1,-2.5e+10,0.0,true,false,null,[],{}]}`,
	`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":+1}`, `{"a":tru}`, `{"a":nul}`, `{"a":"\x"}`,
	`{"a":"\u12g4"}`, "{\"a\":\"\t\"}", `{"a":1,}`, `{"a" 1}`, `{a:1}`, `{"a":1`, `{"a":[1,2}`, `{"a":[1,]}`,
	`[]`, `"str"`, `12`, `true`, `{} {}`, `{"model":"x"}garbage`, `{"model":1}`, `{"model":{"a":"b"}}`,
	`{"model":"a","model":"b"}`, "{\"model\":\"\xff\xfe\"}", `{"x":"\/"}`, `{"x":[[[[[]]]]]}`, `{"":1}`,
}

func TestParseLLMRequestMatchesEncodingJSON(t *testing.T) {
	for _, in := range jsonCorpus {
		compareWithEncodingJSON(t, []byte(in))
	}
	deep := strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)
	compareWithEncodingJSON(t, []byte(`{"x":`+deep+`}`))
}

func compareWithEncodingJSON(t *testing.T, in []byte) {
	t.Helper()
	var want llmRequest
	wantErr := json.Unmarshal(in, &want)
	got, gotErr := parseLLMRequest(in)
	if (wantErr != nil) != (gotErr != nil) {
		t.Fatalf("%q: encoding/json err=%v, parseLLMRequest err=%v", in, wantErr, gotErr)
	}
	if wantErr == nil {
		// encoding/json replaces invalid UTF-8 with U+FFFD; so does the
		// server when it writes the model back out.
		want.Model, got.Model = asWritten(t, want.Model), asWritten(t, got.Model)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %+v, want %+v", in, got, want)
		}
	}
}

func asWritten(t *testing.T, s string) string {
	var out string
	if err := json.Unmarshal(appendJSONString(nil, s), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func FuzzParseLLMRequest(f *testing.F) {
	for _, in := range jsonCorpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(bytes.TrimSpace(in)) == 0 {
			return // the handler treats an empty body as {}
		}
		compareWithEncodingJSON(t, in)
	})
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s`, "\n\r\t\x00\x1f\x7f", "é😀", "\xff\xfe bad", "\u2028\u2029"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, b, err)
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("%q: round trip %q, want %q", s, back, wantBack)
		}
	}
}

// ---- protocol behaviour through a real socket (fasthttp) -----------------------

func rawExchange(t *testing.T, addr, in string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, in); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil && len(out) == 0 {
		t.Fatalf("reading: %v", err)
	}
	return string(out)
}

func TestFastProtocol(t *testing.T) {
	_, addr := startFast(t, newServer(testName))

	t.Run("pipelining and close", func(t *testing.T) {
		out := rawExchange(t, addr, "GET /a HTTP/1.1\r\nHost: h\r\n\r\nPOST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /healthz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if strings.Count(out, "HTTP/1.1 200 OK") != 3 || !strings.Contains(out, `"path":"/a"`) ||
			!strings.Contains(out, `"path":"/b"`) || !strings.Contains(out, `"body_bytes":3`) || !strings.HasSuffix(out, "\r\n\r\nok") {
			t.Errorf("got %q", out)
		}
		if !strings.Contains(out, "Connection: close\r\n") {
			t.Errorf("no Connection: close in %q", out)
		}
	})
	t.Run("HTTP/1.0", func(t *testing.T) {
		out := rawExchange(t, addr, "GET /x HTTP/1.0\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 200 OK\r\n") || !strings.Contains(out, "Connection: close\r\n") ||
			strings.Contains(out, `"host"`) || !strings.Contains(out, `"headers":{}`) {
			t.Errorf("got %q", out)
		}
		out = rawExchange(t, addr, "GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n")
		if strings.Count(out, "HTTP/1.1 200 OK") != 2 || !strings.Contains(out, "Connection: keep-alive\r\n") || !strings.HasSuffix(out, "ok") {
			t.Errorf("got %q", out)
		}
		// Streaming to HTTP/1.0: no chunked encoding, the body ends with the
		// connection, and it is still SSE flushed per event.
		for _, conn := range []string{"", "Connection: keep-alive\r\n"} {
			out = rawExchange(t, addr, "POST /v1/chat/completions HTTP/1.0\r\n"+conn+"Content-Length: 15\r\n\r\n{\"stream\":true}")
			head, body, _ := strings.Cut(out, "\r\n\r\n")
			if !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || strings.Contains(head, "chunked") || strings.Contains(head, "Content-Length") ||
				!strings.Contains(head, "Connection: close") || !strings.Contains(head, "X-Upstream-Name: "+testName) ||
				!strings.Contains(head, "Content-Type: text/event-stream") || !strings.HasPrefix(body, "data: {") || !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("got %q", out)
			}
		}
		out = rawExchange(t, addr, "POST /v1/messages HTTP/1.0\r\nContent-Length: 15\r\nX-Mock-Gzip: 1\r\n\r\n{\"stream\":true}")
		if _, body, _ := strings.Cut(out, "\r\n\r\n"); !strings.Contains(out, "Content-Encoding: gzip") ||
			!strings.HasSuffix(string(gunzip(t, []byte(body))), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("gzip stream to HTTP/1.0: %q", out)
		}
	})
	t.Run("HTTP/1.1 stream is chunked per event", func(t *testing.T) {
		out := rawExchange(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 15\r\n\r\n{\"stream\":true}")
		head, body, _ := strings.Cut(out, "\r\n\r\n")
		if !strings.Contains(head, "Transfer-Encoding: chunked") {
			t.Fatalf("got %q", out)
		}
		// One chunk per event: every chunk's data ends an event.
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(out)), nil)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		if n := strings.Count(string(data), "\n\n"); n != 6 || strings.Count(body, "\n\n\r\n") != n {
			t.Errorf("%d events, chunks %q", n, body)
		}
	})
	t.Run("chunked request with extensions and trailers", func(t *testing.T) {
		out := rawExchange(t, addr, "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"+
			"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
		if !strings.Contains(out, `"body_bytes":11`) || !strings.Contains(out, `"transfer-encoding":["chunked"]`) {
			t.Errorf("got %q", out)
		}
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		blank, _ := br.ReadString('\n')
		if line != "HTTP/1.1 100 Continue\r\n" || blank != "\r\n" {
			t.Fatalf("got %q %q", line, blank)
		}
		_, _ = io.WriteString(c, "body")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(data), `"body_bytes":4`) {
			t.Errorf("got %s", data)
		}
	})
	t.Run("HEAD", func(t *testing.T) {
		out := rawExchange(t, addr, "HEAD /anything HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if !strings.Contains(out, "Content-Length: ") || !strings.HasSuffix(out, "\r\n\r\n") {
			t.Errorf("got %q", out)
		}
		out = rawExchange(t, addr, "HEAD /bytes/1234 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if !strings.Contains(out, "Content-Length: 1234\r\n") || !strings.HasSuffix(out, "\r\n\r\n") {
			t.Errorf("got %q", out)
		}
	})
	t.Run("absolute-form target", func(t *testing.T) {
		out := rawExchange(t, addr, "GET http://example.com/p%20q?x=1 HTTP/1.1\r\nHost: ignored\r\nConnection: close\r\n\r\n")
		if !strings.Contains(out, `"path":"/p%20q"`) || !strings.Contains(out, `"host":["example.com"]`) || !strings.Contains(out, `"query":"x=1"`) {
			t.Errorf("got %q", out)
		}
	})
	t.Run("1xx status", func(t *testing.T) {
		// fasthttp cannot send an interim response: a plain 200.
		out := rawExchange(t, addr, "GET /status/103 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 200 OK\r\n") || !strings.HasSuffix(out, `{"status":103}`) {
			t.Errorf("got %q", out)
		}
	})
	// Requests fasthttp rejects get an answer from our ErrorHandler.
	for _, tc := range []struct{ name, in, status string }{
		{"garbage", "GARBAGE\r\n\r\n", "400"},
		{"missing host", "GET / HTTP/1.1\r\n\r\n", "400"},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400"},
		{"huge head", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("v", 64<<10) + "\r\n\r\n", "431"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := rawExchange(t, addr, tc.in)
			if !strings.HasPrefix(out, "HTTP/1.1 "+tc.status+" ") || !strings.Contains(out, "X-Upstream-Name: "+testName+"\r\n") ||
				!strings.Contains(out, "Connection: close") {
				t.Errorf("got %q", out)
			}
		})
	}
	t.Run("big head within the limit", func(t *testing.T) {
		out := rawExchange(t, addr, "GET /h HTTP/1.1\r\nHost: a\r\nConnection: close\r\nX-Big: "+strings.Repeat("v", 60<<10)+"\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 200 OK\r\n") || !strings.Contains(out, `"x-big":["vvvv`) {
			t.Errorf("got %.300q", out)
		}
	})
	t.Run("bad chunk", func(t *testing.T) {
		out := rawExchange(t, addr, "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 400 ") || !strings.Contains(out, "X-Upstream-Name: "+testName+"\r\n") {
			t.Errorf("got %q", out)
		}
	})
}

// TestLargeBodies: request bodies are streamed to the handlers, so echo
// counts any size and the LLM endpoints answer 413 in the provider's shape.
func TestLargeBodies(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		const n = 6 << 20 // above fasthttp's default 4 MiB body limit
		r := b.do(t, "POST", "/big", strings.NewReader(strings.Repeat("z", n)))
		wantEq(t, "body_bytes", decode(t, r.body)["body_bytes"], float64(n))
		r = b.do(t, "POST", "/big", struct{ io.Reader }{strings.NewReader(strings.Repeat("z", n))}) // chunked
		wantEq(t, "chunked body_bytes", decode(t, r.body)["body_bytes"], float64(n))
		r = b.post(t, "/v1/messages", `{"x":"`+strings.Repeat("z", maxRequestBody)+`"}`)
		wantEq(t, "too large", r.code, 413)
		wantEq(t, "anthropic error shape", get(decode(t, r.body), "type"), "error")
	})
}

// ---- the command: startup line, serving, prompt exit on SIGTERM -----------------

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("DEMO_UPSTREAM_MAIN_ARGS"); ok {
		os.Args = append([]string{"demo-upstream"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestCommand(t *testing.T) {
	for _, mode := range []string{"", "-stdlib"} {
		t.Run("mode="+mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "DEMO_UPSTREAM_MAIN_ARGS=-listen 127.0.0.1:0 -name cmd-up "+mode)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill() }()
			lines := make(chan string, 1)
			go func() {
				line, _ := bufio.NewReader(stderr).ReadString('\n')
				lines <- line
				_, _ = io.Copy(io.Discard, stderr)
			}()
			var line string
			select {
			case line = <-lines:
			case <-time.After(10 * time.Second):
				t.Fatal("no startup line")
			}
			addr, ok := strings.CutPrefix(strings.TrimSpace(line), "demo-upstream cmd-up listening on ")
			if !ok {
				t.Fatalf("startup line %q", line)
			}

			// A request, leaving an idle keep-alive connection behind.
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "ok" || resp.Header.Get("X-Upstream-Name") != "cmd-up" {
				t.Fatalf("got %q %v", body, resp.Header)
			}

			start := time.Now()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("exit: %v", err)
				}
				if d := time.Since(start); d > 1500*time.Millisecond {
					t.Errorf("exit took %v", d)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("still running 5s after SIGTERM")
			}
		})
	}
}

// ---- handler benchmarks (no network) ------------------------------------------------

type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// benchFast runs the handlers on a parsed raw request, as fasthttp would.
func benchFast(b *testing.B, raw string) {
	s := newServer(testName)
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, nil, nil)
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		s.serve((*fastExchange)(&ctx))
	}
	if ctx.Response.StatusCode() != 200 || len(ctx.Response.Body()) == 0 {
		b.Fatalf("response %d %q", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}

func benchStd(b *testing.B, req *http.Request, body string) {
	s := stdHandler{newServer(testName)}
	w := &discardWriter{h: http.Header{}}
	rd := strings.NewReader(body)
	req.Body = io.NopCloser(rd)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		clear(w.h)
		s.ServeHTTP(w, req)
	}
}

func BenchmarkEchoHandler(b *testing.B) {
	b.Run("fasthttp", func(b *testing.B) {
		benchFast(b, "GET /anything?x=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")
	})
	b.Run("nethttp", func(b *testing.B) {
		req := httptest.NewRequest("GET", "/anything?x=1", nil)
		req.Header.Set("User-Agent", "bench")
		req.Header.Set("Accept", "*/*")
		benchStd(b, req, "")
	})
}

func BenchmarkChatHandler(b *testing.B) {
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}`
	b.Run("fasthttp", func(b *testing.B) {
		benchFast(b, "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\n\r\n"+body)
	})
	b.Run("nethttp", func(b *testing.B) {
		benchStd(b, httptest.NewRequest("POST", "/v1/chat/completions", nil), body)
	})
}
