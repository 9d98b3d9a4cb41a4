package main

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

const maxBytesEndpoint = 10 << 20 // largest N accepted by /bytes/N

// exchange is one request and its response as the endpoint handlers see
// them. Both servers implement it (fastExchange: fasthttp, the default;
// stdExchange: net/http, -stdlib), so every endpoint is written once.
//
// Strings returned by the request methods are only valid until the handler
// returns (fasthttp reuses its buffers): handlers copy what they keep.
type exchange interface {
	method() string
	path() string    // decoded, for routing
	rawPath() string // as in the request line (still percent-encoded), without the query
	rawQuery() string
	header(canonical string) string                // first value; "" when absent (or empty)
	appendHeaders(dst []headerField) []headerField // every request header field, host included
	body() io.Reader

	setHeader(canonical, value string)
	// respond sends status code and the whole body, with a Content-Length
	// (no body for HEAD, 1xx, 204 and 304).
	respond(code int, body []byte)
	// respondSized sends status code and size bytes read from body.
	respondSized(code, size int, body io.Reader)
	// interim sends a 1xx informational response before the final one, if
	// the server can (fasthttp cannot: it does nothing).
	interim(code int)
	// closeConnection ends the connection after this response.
	closeConnection()
	// stream sends 200 with a body of unknown length read from events,
	// sending what each Read returns to the client at once, and then closes
	// events. Reading may happen after the handler has returned.
	stream(events io.ReadCloser)
}

// headerField is one request header line (name as the server normalised it).
type headerField struct{ name, value string }

var xChunk = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = 'x'
	}
	return b
}()

// xReader yields n bytes of 'x'.
type xReader struct{ n int }

func (r *xReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], xChunk)
	r.n -= k
	return k, nil
}

// server holds the endpoints' immutable, precomputed data.
type server struct {
	name     string
	nameJSON []byte // name as a quoted JSON string
	hello    string // "Hello from NAME"
}

func newServer(name string) *server {
	return &server{
		name:     name,
		nameJSON: appendJSONString(nil, name),
		hello:    "Hello from " + name,
	}
}

// serve routes one request; every response carries x-upstream-name.
func (s *server) serve(x exchange) {
	x.setHeader("X-Upstream-Name", s.name)
	p := x.path()
	m := x.method()
	getOrHead := m == http.MethodGet || m == http.MethodHead
	switch {
	case p == "/healthz" && getOrHead:
		x.setHeader("Content-Type", "text/plain; charset=utf-8")
		x.respond(http.StatusOK, okBody)
		return
	case strings.HasPrefix(p, "/status/"):
		s.status(x, p[len("/status/"):])
		return
	case strings.HasPrefix(p, "/bytes/") && getOrHead:
		s.bytes(x, p[len("/bytes/"):])
		return
	case m == http.MethodPost:
		switch p {
		case "/v1/chat/completions":
			s.llm(x, apiChat)
			return
		case "/v1/responses":
			s.llm(x, apiResponses)
			return
		case "/v1/embeddings":
			s.llm(x, apiEmbeddings)
			return
		case "/v1/messages":
			s.llm(x, apiMessages)
			return
		}
	}
	s.echo(x)
}

var okBody = []byte("ok")

// status answers /status/NNN with status NNN and {"status":NNN}.
// NNN outside 100-599 (or not a number) gives 400.
//
// HTTP/1.1 cannot end a response with a 1xx status: 1xx (other than 101)
// is sent as an interim response where the server can (net/http; fasthttp
// has no API for it), followed by a final 200 carrying the body. 101 is
// sent as a bodiless final response and the connection is closed (nothing
// was upgraded). 204 and 304 have no body.
func (s *server) status(x exchange, code string) {
	n, ok := parseStatus(code)
	bp := getBuf()
	defer putBuf(bp)
	b := (*bp)[:0]
	b = append(b, `{"status":`...)
	if ok {
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, '}')
	} else {
		n = http.StatusBadRequest
		b = append(b, `400,"error":"status code must be a number between 100 and 599"}`...)
	}
	*bp = b
	switch {
	case n == http.StatusNoContent || n == http.StatusNotModified:
		x.respond(n, nil)
	case n == http.StatusSwitchingProtocols:
		x.closeConnection() // nothing was actually upgraded
		x.respond(n, nil)
	case n < 200:
		x.interim(n)
		x.setHeader("Content-Type", "application/json")
		x.respond(http.StatusOK, b)
	default:
		x.setHeader("Content-Type", "application/json")
		x.respond(n, b)
	}
}

func parseStatus(s string) (int, bool) {
	if len(s) != 3 {
		return 0, false
	}
	n := 0
	for i := 0; i < 3; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n >= 100 && n <= 599
}

var errBytesN = []byte(`{"error":"N must be an integer between 0 and 10485760"}`)

func (s *server) bytes(x exchange, arg string) {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 0 || n > maxBytesEndpoint {
		x.setHeader("Content-Type", "application/json")
		x.respond(http.StatusBadRequest, errBytesN)
		return
	}
	x.setHeader("Content-Type", "application/octet-stream")
	x.respondSized(http.StatusOK, n, &xReader{n})
}

var fieldsPool = sync.Pool{New: func() any { f := make([]headerField, 0, 32); return &f }}

// echo answers everything else with a JSON description of the request.
func (s *server) echo(x exchange) {
	n, err := io.Copy(io.Discard, x.body())
	if err != nil {
		writeJSONError(x, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}

	fp := fieldsPool.Get().(*[]headerField)
	fields := x.appendHeaders((*fp)[:0])
	// Sorted by lower-cased name; values of one name keep their order.
	slices.SortStableFunc(fields, func(a, b headerField) int { return compareFold(a.name, b.name) })

	bp := getBuf()
	b := (*bp)[:0]
	b = append(b, `{"upstream":`...)
	b = append(b, s.nameJSON...)
	b = append(b, `,"method":`...)
	b = appendJSONString(b, x.method())
	b = append(b, `,"path":`...)
	b = appendJSONString(b, x.rawPath())
	b = append(b, `,"query":`...)
	b = appendJSONString(b, x.rawQuery())
	b = append(b, `,"headers":{`...)
	for i, f := range fields {
		switch {
		case i == 0:
			b = appendLowerJSONString(b, f.name)
			b = append(b, ":["...)
		case compareFold(fields[i-1].name, f.name) != 0:
			b = append(b, "],"...)
			b = appendLowerJSONString(b, f.name)
			b = append(b, ":["...)
		default:
			b = append(b, ',')
		}
		b = appendJSONString(b, f.value)
	}
	if len(fields) > 0 {
		b = append(b, ']')
	}
	b = append(b, `},"body_bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, '}')

	clear(fields)
	*fp = fields[:0]
	fieldsPool.Put(fp)

	x.setHeader("Content-Type", "application/json")
	x.respond(http.StatusOK, b)
	*bp = b
	putBuf(bp)
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// compareFold orders strings by their ASCII-lower-cased bytes.
func compareFold(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := lowerASCII(a[i]), lowerASCII(b[i])
		if ca != cb {
			return int(ca) - int(cb)
		}
	}
	return len(a) - len(b)
}

func writeJSONError(x exchange, code int, msg string) {
	b := appendJSONString([]byte(`{"error":{"message":`), msg)
	b = append(b, `,"type":"invalid_request_error"}}`...)
	x.setHeader("Content-Type", "application/json")
	x.respond(code, b)
}
