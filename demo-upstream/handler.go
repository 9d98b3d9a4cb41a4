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

// Shared, never-mutated header values: assigning them directly into the
// header map avoids per-request allocations and key canonicalisation.
var (
	hdrJSON        = []string{"application/json"}
	hdrText        = []string{"text/plain; charset=utf-8"}
	hdrOctet       = []string{"application/octet-stream"}
	hdrEventStream = []string{"text/event-stream"}
	hdrNoCache     = []string{"no-cache"}
	hdrNo          = []string{"no"}
	hdrGzip        = []string{"gzip"}
	hdrClose       = []string{"close"}
)

var xChunk = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = 'x'
	}
	return b
}()

// server is the http.Handler. It holds only immutable, precomputed data.
type server struct {
	name     string
	nameHdr  []string
	nameJSON []byte // name as a quoted JSON string
	hello    string // "Hello from NAME"
}

func newServer(name string) *server {
	return &server{
		name:     name,
		nameHdr:  []string{name},
		nameJSON: appendJSONString(nil, name),
		hello:    "Hello from " + name,
	}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header()["X-Upstream-Name"] = s.nameHdr
	p := r.URL.Path
	getOrHead := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch {
	case p == "/healthz" && getOrHead:
		s.healthz(w)
		return
	case strings.HasPrefix(p, "/status/"):
		s.status(w, p[len("/status/"):])
		return
	case strings.HasPrefix(p, "/bytes/") && getOrHead:
		s.bytes(w, r, p[len("/bytes/"):])
		return
	case r.Method == http.MethodPost:
		switch p {
		case "/v1/chat/completions":
			s.llm(w, r, apiChat)
			return
		case "/v1/responses":
			s.llm(w, r, apiResponses)
			return
		case "/v1/embeddings":
			s.llm(w, r, apiEmbeddings)
			return
		case "/v1/messages":
			s.llm(w, r, apiMessages)
			return
		}
	}
	s.echo(w, r)
}

var okBody = []byte("ok")

func (s *server) healthz(w http.ResponseWriter) {
	w.Header()["Content-Type"] = hdrText
	_, _ = w.Write(okBody)
}

// status answers /status/NNN with status NNN and {"status":NNN}.
// NNN outside 100-599 (or not a number) gives 400.
//
// HTTP/1.1 cannot end a response with a 1xx status: Go sends 1xx (other
// than 101) as an interim response followed by a final 200 carrying the
// body. 101 is sent as a bodiless final response and the connection is
// closed (nothing was upgraded). 204 and 304 have no body.
func (s *server) status(w http.ResponseWriter, code string) {
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
	h := w.Header()
	switch n {
	case http.StatusNoContent, http.StatusNotModified:
		w.WriteHeader(n)
	case http.StatusSwitchingProtocols:
		// Nothing was actually upgraded: end the connection after it.
		h["Connection"] = hdrClose
		w.WriteHeader(n)
	default:
		h["Content-Type"] = hdrJSON
		w.WriteHeader(n)
		_, _ = w.Write(b) // after an interim 1xx this goes out with an implicit 200
	}
	*bp = b
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

func (s *server) bytes(w http.ResponseWriter, r *http.Request, arg string) {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 0 || n > maxBytesEndpoint {
		h := w.Header()
		h["Content-Type"] = hdrJSON
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"N must be an integer between 0 and 10485760"}`)
		return
	}
	h := w.Header()
	h["Content-Type"] = hdrOctet
	h["Content-Length"] = []string{strconv.Itoa(n)}
	if r.Method == http.MethodHead {
		return
	}
	for n > 0 {
		k := min(n, len(xChunk))
		if _, err := w.Write(xChunk[:k]); err != nil {
			return
		}
		n -= k
	}
}

var keysPool = sync.Pool{New: func() any { k := make([]string, 0, 32); return &k }}

// echo answers everything else with a JSON description of the request.
func (s *server) echo(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}

	kp := keysPool.Get().(*[]string)
	keys := (*kp)[:0]
	for k := range r.Header {
		keys = append(keys, k)
	}
	// net/http moves these out of r.Header; report them as headers too.
	hasHost := r.Host != "" && r.Header["Host"] == nil
	if hasHost {
		keys = append(keys, "Host")
	}
	hasTE := len(r.TransferEncoding) > 0 && r.Header["Transfer-Encoding"] == nil
	if hasTE {
		keys = append(keys, "Transfer-Encoding")
	}
	slices.SortFunc(keys, compareFold)

	bp := getBuf()
	b := (*bp)[:0]
	b = append(b, `{"upstream":`...)
	b = append(b, s.nameJSON...)
	b = append(b, `,"method":`...)
	b = appendJSONString(b, r.Method)
	b = append(b, `,"path":`...)
	b = appendJSONString(b, rawPath(r))
	b = append(b, `,"query":`...)
	b = appendJSONString(b, r.URL.RawQuery)
	b = append(b, `,"headers":{`...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLowerJSONString(b, k)
		b = append(b, ":["...)
		switch {
		case hasHost && k == "Host":
			b = appendJSONString(b, r.Host)
		case hasTE && k == "Transfer-Encoding":
			b = appendStrings(b, r.TransferEncoding)
		default:
			b = appendStrings(b, r.Header[k])
		}
		b = append(b, ']')
	}
	b = append(b, `},"body_bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, '}')

	clear(keys)
	*kp = keys[:0]
	keysPool.Put(kp)

	h := w.Header()
	h["Content-Type"] = hdrJSON
	if len(b) > 2000 { // small bodies get an automatic Content-Length
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	_, _ = w.Write(b)
	*bp = b
	putBuf(bp)
}

// rawPath is the path exactly as it appeared in the request line
// (still percent-encoded), without the query.
func rawPath(r *http.Request) string {
	u := r.RequestURI
	if strings.HasPrefix(u, "/") {
		if i := strings.IndexByte(u, '?'); i >= 0 {
			u = u[:i]
		}
		return u
	}
	return r.URL.EscapedPath() // absolute-form or "*"
}

func appendStrings(b []byte, vs []string) []byte {
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, v)
	}
	return b
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

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	b := appendJSONString([]byte(`{"error":{"message":`), msg)
	b = append(b, `,"type":"invalid_request_error"}}`...)
	h := w.Header()
	h["Content-Type"] = hdrJSON
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
