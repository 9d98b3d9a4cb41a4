package main

// A small HTTP/1.1 server for http.Handlers, used instead of net/http's
// server because on small VMs net/http's per-request machinery (background
// reads, deadlines, goroutine hand-offs) costs 2-3x the throughput of a
// plain read-handle-write loop. It implements what a test upstream behind
// Envoy/nginx needs: keep-alive, HTTP/1.0, Content-Length and chunked
// request bodies, Expect: 100-continue, interim 1xx responses, HEAD,
// buffered responses with automatic Content-Length, and chunked streaming
// with http.Flusher. It does not do TLS, HTTP/2, Upgrade/Hijack, timeouts
// or request contexts. The -stdlib flag switches back to net/http.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	maxHeadBytes    = 1 << 20   // request line + headers
	maxHeaderFields = 10000     // header lines per request
	maxDrainBytes   = 256 << 10 // unread request body discarded to keep a connection
	maxBufferedBody = 64 << 10  // response bytes held back to compute Content-Length
	readBufSize     = 16 << 10
	writeBufSize    = 16 << 10
)

// httpError is a request the server rejects before calling the handler.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func reqError(code int, msg string) error { return &httpError{code, msg} }

type fastServer struct {
	handler   http.Handler
	errHeader string // extra header line(s) for server-generated errors

	closing atomic.Bool
	mu      sync.Mutex
	ln      net.Listener
	conns   map[*fconn]struct{}
}

func newFastServer(h http.Handler, errHeader string) *fastServer {
	return &fastServer{handler: h, errHeader: errHeader, conns: make(map[*fconn]struct{})}
}

// Serve accepts connections until the listener is closed. After Shutdown
// it returns http.ErrServerClosed.
func (s *fastServer) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	var delay time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// e.g. EMFILE: back off like net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		c := newConn(s, rwc)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go c.serve()
	}
}

// Shutdown stops accepting, closes idle connections and waits for the
// others to finish their current request; at ctx's end it closes the rest.
func (s *fastServer) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	if s.ln != nil {
		_ = s.ln.Close()
	}
	s.mu.Unlock()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		for c := range s.conns {
			if c.idle.Load() {
				_ = c.rwc.Close()
			}
		}
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for c := range s.conns {
				_ = c.rwc.Close()
			}
			s.mu.Unlock()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// field locates one header line's name and value inside fconn.head.
type field struct{ ns, ne, vs, ve int }

type fconn struct {
	srv    *fastServer
	rwc    net.Conn
	remote string
	br     *bufio.Reader
	bw     *bufio.Writer
	idle   atomic.Bool

	// Per-request state, reused across the connection's requests.
	head    []byte
	fields  []field
	scratch []byte
	keys    []string
	hdr     http.Header
	url     url.URL
	req     http.Request
	body    bodyReader
	w       respWriter
}

func newConn(s *fastServer, rwc net.Conn) *fconn {
	c := &fconn{
		srv:    s,
		rwc:    rwc,
		remote: rwc.RemoteAddr().String(),
		br:     bufio.NewReaderSize(rwc, readBufSize),
		bw:     bufio.NewWriterSize(rwc, writeBufSize),
		hdr:    make(http.Header, 16),
	}
	c.body.c = c
	c.w.c = c
	c.w.hdr = make(http.Header, 8)
	return c
}

func (c *fconn) serve() {
	linger := false
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				fmt.Fprintf(os.Stderr, "demo-upstream: panic serving %s: %v\n%s", c.remote, p, debug.Stack())
			}
			linger = false
		}
		c.close(linger)
	}()
	for {
		c.idle.Store(true)
		if c.srv.closing.Load() {
			return
		}
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		c.idle.Store(false)
		req, err := c.readRequest()
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				c.writeError(he)
				linger = true
			}
			return
		}
		c.w.reset(req)
		c.srv.handler.ServeHTTP(&c.w, req)
		c.w.finish()
		if err := c.bw.Flush(); err != nil || c.w.err != nil {
			return
		}
		if c.w.closeAfter || !c.body.done() {
			linger = true
			return
		}
	}
}

// close ends the connection. When the server chose to close (linger), it
// half-closes first and briefly drains input so that unread request bytes
// do not turn into a TCP reset that could destroy the response in flight.
func (c *fconn) close(linger bool) {
	_ = c.bw.Flush()
	if tc, ok := c.rwc.(*net.TCPConn); ok && linger && !c.srv.closing.Load() {
		if tc.CloseWrite() == nil {
			_ = tc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			_, _ = io.CopyN(io.Discard, tc, 1<<20)
		}
	}
	_ = c.rwc.Close()
	c.srv.mu.Lock()
	delete(c.srv.conns, c)
	c.srv.mu.Unlock()
}

func (c *fconn) writeError(e *httpError) {
	msg := e.msg + "\n"
	b := c.scratch[:0]
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(e.code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(e.code)...)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"...)
	b = append(b, c.srv.errHeader...)
	b = append(b, dateHeader()...)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(msg)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, msg...)
	_, _ = c.bw.Write(b)
	c.scratch = b
}

// ---- request parsing ---------------------------------------------------

var tokenTable = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return
}()

func isToken(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	for _, c := range s {
		if !tokenTable[c] {
			return false
		}
	}
	return true
}

// appendLine appends the next line (with its "\n") to dst, charging its
// length to *budget.
func (c *fconn) appendLine(dst []byte, budget *int) ([]byte, error) {
	for {
		frag, err := c.br.ReadSlice('\n')
		*budget -= len(frag)
		if *budget < 0 {
			return dst, reqError(http.StatusRequestHeaderFieldsTooLarge, "request header too large")
		}
		dst = append(dst, frag...)
		if err == nil {
			return dst, nil
		}
		if err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return dst, err
		}
	}
}

func trimEOL(b []byte) []byte {
	b = b[:len(b)-1] // '\n'
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}

// readHead reads the request line and header lines into c.head and
// records where the request line and each header field are.
func (c *fconn) readHead() (rl [2]int, err error) {
	c.head = c.head[:0]
	c.fields = c.fields[:0]
	budget := maxHeadBytes
	for empty := 0; ; empty++ { // RFC 9112 §2.2: ignore leading empty lines
		if empty > 8 {
			return rl, reqError(http.StatusBadRequest, "malformed request line")
		}
		if c.head, err = c.appendLine(c.head[:0], &budget); err != nil {
			return rl, err
		}
		if line := trimEOL(c.head); len(line) > 0 {
			rl = [2]int{0, len(line)}
			break
		}
	}
	for {
		start := len(c.head)
		if c.head, err = c.appendLine(c.head, &budget); err != nil {
			return rl, err
		}
		line := trimEOL(c.head[start:])
		if len(line) == 0 {
			c.head = c.head[:start]
			return rl, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return rl, reqError(http.StatusBadRequest, "obsolete header line folding is not accepted")
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 || !isToken(line[:colon]) {
			return rl, reqError(http.StatusBadRequest, "malformed header line")
		}
		canonicalize(line[:colon])
		vs, ve := colon+1, len(line)
		for vs < ve && (line[vs] == ' ' || line[vs] == '\t') {
			vs++
		}
		for ve > vs && (line[ve-1] == ' ' || line[ve-1] == '\t') {
			ve--
		}
		for _, ch := range line[vs:ve] {
			if (ch < 0x20 && ch != '\t') || ch == 0x7f {
				return rl, reqError(http.StatusBadRequest, "invalid header value")
			}
		}
		if len(c.fields) == maxHeaderFields {
			return rl, reqError(http.StatusRequestHeaderFieldsTooLarge, "too many header fields")
		}
		c.fields = append(c.fields, field{start, start + colon, start + vs, start + ve})
	}
}

// canonicalize rewrites a header name (a valid token) in place the way
// textproto.CanonicalMIMEHeaderKey does.
func canonicalize(k []byte) {
	upper := true
	for i, ch := range k {
		if upper && 'a' <= ch && ch <= 'z' {
			k[i] = ch - ('a' - 'A')
		} else if !upper && 'A' <= ch && ch <= 'Z' {
			k[i] = ch + ('a' - 'A')
		}
		upper = ch == '-'
	}
}

var chunkedTE = []string{"chunked"}

func (c *fconn) readRequest() (*http.Request, error) {
	rl, err := c.readHead()
	if err != nil {
		return nil, err
	}
	hs := string(c.head) // one allocation backs every string of the request

	line := hs[rl[0]:rl[1]]
	sp1 := strings.IndexByte(line, ' ')
	sp2 := strings.LastIndexByte(line, ' ')
	if sp1 <= 0 || sp2 <= sp1+1 {
		return nil, reqError(http.StatusBadRequest, "malformed request line")
	}
	method, target, proto := line[:sp1], line[sp1+1:sp2], line[sp2+1:]
	if !isToken([]byte(method)) || strings.IndexByte(target, ' ') >= 0 {
		return nil, reqError(http.StatusBadRequest, "malformed request line")
	}
	minor := 1
	switch proto {
	case "HTTP/1.1":
	case "HTTP/1.0":
		minor = 0
	default:
		if strings.HasPrefix(proto, "HTTP/") {
			return nil, reqError(http.StatusHTTPVersionNotSupported, "only HTTP/1.0 and HTTP/1.1 are supported")
		}
		return nil, reqError(http.StatusBadRequest, "malformed HTTP version")
	}

	h := c.hdr
	clear(h)
	vals := make([]string, len(c.fields))
	for i, f := range c.fields {
		k, v := hs[f.ns:f.ne], hs[f.vs:f.ve]
		if old, ok := h[k]; ok {
			h[k] = append(old, v)
		} else {
			vals[i] = v
			h[k] = vals[i : i+1 : i+1]
		}
	}

	hosts := h["Host"]
	delete(h, "Host")
	if len(hosts) > 1 {
		return nil, reqError(http.StatusBadRequest, "too many Host headers")
	}
	if len(hosts) == 0 && minor == 1 {
		return nil, reqError(http.StatusBadRequest, "missing required Host header")
	}

	// Message framing (RFC 9112 §6).
	chunked := false
	if te, ok := h["Transfer-Encoding"]; ok {
		delete(h, "Transfer-Encoding")
		if len(te) != 1 || !strings.EqualFold(te[0], "chunked") {
			return nil, reqError(http.StatusNotImplemented, "unsupported transfer encoding")
		}
		if _, ok := h["Content-Length"]; ok {
			return nil, reqError(http.StatusBadRequest, "both Transfer-Encoding and Content-Length")
		}
		chunked = true
	}
	var length int64
	if cl := h["Content-Length"]; len(cl) > 0 {
		for _, v := range cl[1:] {
			if v != cl[0] {
				return nil, reqError(http.StatusBadRequest, "conflicting Content-Length headers")
			}
		}
		n, ok := parseDecimal(cl[0])
		if !ok {
			return nil, reqError(http.StatusBadRequest, "invalid Content-Length")
		}
		length = n
	}

	conn := h["Connection"]
	keepAlive := !hasToken(conn, "close") && (minor == 1 || hasToken(conn, "keep-alive"))

	needContinue := false
	if ex := h["Expect"]; len(ex) > 0 {
		if len(ex) > 1 || !strings.EqualFold(ex[0], "100-continue") {
			return nil, reqError(http.StatusExpectationFailed, "unsupported expectation")
		}
		needContinue = minor == 1 && (chunked || length > 0)
	}

	// Request target (RFC 9112 §3.2).
	u := &c.url
	path, query, _ := strings.Cut(target, "?")
	if len(path) > 0 && path[0] == '/' && strings.IndexByte(path, '%') < 0 && !hasCTL(target) {
		*u = url.URL{Path: path, RawQuery: query}
	} else {
		raw := target
		if method == http.MethodConnect && !strings.HasPrefix(target, "/") {
			raw = "http://" + target
		}
		pu, err := url.ParseRequestURI(raw)
		if err != nil {
			return nil, reqError(http.StatusBadRequest, "invalid request target")
		}
		if raw != target {
			pu.Scheme = ""
		}
		*u = *pu
	}
	host := ""
	if u.Host != "" {
		host = u.Host
	} else if len(hosts) == 1 {
		host = hosts[0]
	}

	c.req = http.Request{
		Method:        method,
		URL:           u,
		Proto:         proto,
		ProtoMajor:    1,
		ProtoMinor:    minor,
		Header:        h,
		ContentLength: length,
		Host:          host,
		RemoteAddr:    c.remote,
		RequestURI:    target,
		Close:         !keepAlive,
	}
	c.body = bodyReader{c: c, remaining: length, chunked: chunked, needContinue: needContinue}
	switch {
	case chunked:
		c.req.TransferEncoding = chunkedTE
		c.req.ContentLength = -1
		c.req.Body = &c.body
	case length > 0:
		c.req.Body = &c.body
	default:
		c.body.err = io.EOF
		c.req.Body = http.NoBody
	}
	return &c.req, nil
}

func parseDecimal(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// hasToken reports whether a comma-separated header contains tok.
func hasToken(vs []string, tok string) bool {
	for _, v := range vs {
		for v != "" {
			var part string
			part, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(part), tok) {
				return true
			}
		}
	}
	return false
}

// ---- request body -------------------------------------------------------

type bodyReader struct {
	c            *fconn
	remaining    int64 // Content-Length mode
	chunked      bool
	chunkLeft    int64
	needContinue bool
	err          error // sticky; io.EOF once the body is complete
}

func (b *bodyReader) done() bool { return b.err == io.EOF }

func (b *bodyReader) Close() error { return nil }

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.needContinue {
		b.needContinue = false
		if !b.c.w.headerSent {
			_, _ = b.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			if err := b.c.bw.Flush(); err != nil {
				b.err = err
				return 0, err
			}
		}
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !b.chunked {
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err := b.c.br.Read(p)
		b.remaining -= int64(n)
		switch {
		case b.remaining == 0:
			b.err = io.EOF
		case err == io.EOF:
			b.err = io.ErrUnexpectedEOF
		case err != nil:
			b.err = err
		}
		if b.err == io.EOF && n > 0 {
			return n, nil
		}
		return n, b.err
	}
	if b.chunkLeft == 0 {
		size, err := b.readChunkSize()
		if err != nil {
			b.err = err
			return 0, err
		}
		if size == 0 {
			b.err = b.readTrailers()
			return 0, b.err
		}
		b.chunkLeft = size
	}
	if int64(len(p)) > b.chunkLeft {
		p = p[:b.chunkLeft]
	}
	n, err := b.c.br.Read(p)
	b.chunkLeft -= int64(n)
	if err == nil && b.chunkLeft == 0 {
		err = b.readCRLF()
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		b.err = err
	}
	return n, err
}

var errBadChunk = reqError(http.StatusBadRequest, "malformed chunked request body")

func (b *bodyReader) readChunkSize() (int64, error) {
	budget := 4096
	line, err := b.c.appendLine(b.c.scratch[:0], &budget)
	b.c.scratch = line
	if err != nil {
		return 0, err
	}
	line = trimEOL(line)
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i] // chunk extensions are ignored
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, errBadChunk
	}
	var n int64
	for _, ch := range line {
		switch {
		case '0' <= ch && ch <= '9':
			n = n<<4 | int64(ch-'0')
		case 'a' <= ch && ch <= 'f':
			n = n<<4 | int64(ch-'a'+10)
		case 'A' <= ch && ch <= 'F':
			n = n<<4 | int64(ch-'A'+10)
		default:
			return 0, errBadChunk
		}
	}
	return n, nil
}

func (b *bodyReader) readCRLF() error {
	ch, err := b.c.br.ReadByte()
	if err == nil && ch == '\r' {
		ch, err = b.c.br.ReadByte()
	}
	if err != nil {
		return err
	}
	if ch != '\n' {
		return errBadChunk
	}
	return nil
}

// readTrailers consumes (and drops) the trailer section; it returns
// io.EOF when the body is complete.
func (b *bodyReader) readTrailers() error {
	budget := 64 << 10
	for {
		line, err := b.c.appendLine(b.c.scratch[:0], &budget)
		b.c.scratch = line
		if err != nil {
			return err
		}
		if len(trimEOL(line)) == 0 {
			return io.EOF
		}
	}
}

// drain discards up to maxDrainBytes of unread body; it reports whether
// the body is then complete, so the connection can be kept.
func (b *bodyReader) drain() bool {
	if b.err != nil {
		return b.done()
	}
	if b.needContinue {
		return false // the client waits for 100 Continue: it may never send the body
	}
	_, _ = io.CopyN(io.Discard, b, maxDrainBytes+1)
	return b.done()
}

// ---- response -------------------------------------------------------------

type respWriter struct {
	c           *fconn
	req         *http.Request
	hdr         http.Header
	status      int
	wroteHeader bool // final status chosen
	headerSent  bool // status line and headers are in c.bw
	bodyAllowed bool
	isHead      bool
	chunked     bool
	closeAfter  bool
	declaredLen int64 // handler-set Content-Length, or -1
	written     int64
	buf         []byte // body held back until the handler returns or flushes
	err         error
}

func (w *respWriter) reset(req *http.Request) {
	clear(w.hdr)
	buf := w.buf[:0]
	if cap(buf) > maxBufferedBody*2 {
		buf = nil
	}
	*w = respWriter{c: w.c, req: req, hdr: w.hdr, buf: buf, declaredLen: -1,
		isHead: req.Method == http.MethodHead, closeAfter: req.Close}
}

func (w *respWriter) Header() http.Header { return w.hdr }

func bodyAllowedForStatus(code int) bool {
	return !(code >= 100 && code <= 199) && code != http.StatusNoContent && code != http.StatusNotModified
}

func (w *respWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Interim response: status line and current headers, now.
		b := appendStatusLine(w.c.scratch[:0], code)
		b = w.appendHeaders(b, true)
		b = append(b, "\r\n"...)
		w.c.scratch = b
		w.writeRaw(b)
		if w.err == nil {
			w.err = w.c.bw.Flush()
		}
		return
	}
	w.wroteHeader = true
	w.status = code
	w.bodyAllowed = !w.isHead && bodyAllowedForStatus(code)
	if cl := w.hdr["Content-Length"]; len(cl) > 0 {
		if n, ok := parseDecimal(strings.TrimSpace(cl[0])); ok {
			w.declaredLen = n
		} else {
			delete(w.hdr, "Content-Length")
		}
	}
}

func (w *respWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.bodyAllowed {
		if w.isHead {
			w.written += int64(len(p))
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.declaredLen >= 0 && w.written+int64(len(p)) > w.declaredLen {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	switch {
	case w.headerSent:
		w.writeBody(p)
	case w.declaredLen >= 0:
		w.sendHeaders(false)
		w.writeBody(p)
	case len(w.buf)+len(p) <= maxBufferedBody:
		w.buf = append(w.buf, p...)
	default:
		w.sendHeaders(false)
		w.writeBody(w.buf)
		w.buf = w.buf[:0]
		w.writeBody(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

func (w *respWriter) WriteString(s string) (int, error) {
	// Only used for small strings; the conversion is fine.
	return w.Write([]byte(s))
}

// Flush implements http.Flusher.
func (w *respWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headerSent {
		w.sendHeaders(false)
		w.writeBody(w.buf)
		w.buf = w.buf[:0]
	}
	if w.err == nil {
		w.err = w.c.bw.Flush()
	}
}

// finish completes the response after the handler returned.
func (w *respWriter) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headerSent {
		// Decide about the connection before the headers go out.
		if !w.c.body.drain() {
			w.closeAfter = true
		}
		w.sendHeaders(true)
		w.writeBody(w.buf)
		w.buf = w.buf[:0]
	}
	switch {
	case w.chunked:
		w.writeRaw([]byte("0\r\n\r\n"))
	case w.declaredLen >= 0 && w.bodyAllowed && w.written != w.declaredLen:
		w.closeAfter = true // short body: closing is the only honest signal
	}
	if !w.c.body.drain() { // headers went out early (streaming, Content-Length)
		w.closeAfter = true
	}
}

func (w *respWriter) writeRaw(b []byte) {
	if w.err == nil {
		_, w.err = w.c.bw.Write(b)
	}
}

func (w *respWriter) writeBody(p []byte) {
	if len(p) == 0 || !w.bodyAllowed {
		return
	}
	if w.chunked {
		var hx [20]byte
		b := strconv.AppendInt(hx[:0], int64(len(p)), 16)
		b = append(b, '\r', '\n')
		w.writeRaw(b)
		w.writeRaw(p)
		w.writeRaw([]byte("\r\n"))
		return
	}
	w.writeRaw(p)
}

func appendStatusLine(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if t := http.StatusText(code); t != "" {
		b = append(b, t...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// appendHeaders writes the handler's headers in sorted order, leaving out
// the ones the server manages. interim leaves out framing headers.
func (w *respWriter) appendHeaders(b []byte, interim bool) []byte {
	keys := w.c.keys[:0]
	for k := range w.hdr {
		switch k {
		case "Transfer-Encoding", "Connection":
			continue
		case "Content-Length":
			if interim || (!bodyAllowedForStatus(w.status) && w.status != http.StatusNotModified) {
				continue
			}
		}
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ { // insertion sort: a handful of keys
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	for _, k := range keys {
		for _, v := range w.hdr[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	clear(keys)
	w.c.keys = keys[:0]
	return b
}

// sendHeaders writes the status line and headers. final means the
// handler has returned, so the whole body is in w.buf.
func (w *respWriter) sendHeaders(final bool) {
	w.headerSent = true
	if hasToken(w.hdr["Connection"], "close") || w.c.srv.closing.Load() {
		w.closeAfter = true
	}
	length := int64(-1) // Content-Length the server adds
	switch {
	case !bodyAllowedForStatus(w.status):
	case w.declaredLen >= 0:
	case final && w.isHead:
		if w.written > 0 {
			length = w.written
		}
	case final:
		length = int64(len(w.buf))
	case w.isHead:
	case w.req.ProtoMinor >= 1:
		w.chunked = true
	default:
		w.closeAfter = true // HTTP/1.0: the body ends when the connection does
	}

	b := appendStatusLine(w.c.scratch[:0], w.status)
	b = w.appendHeaders(b, false)
	if _, ok := w.hdr["Date"]; !ok {
		b = append(b, dateHeader()...)
	}
	if length >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, length, 10)
		b = append(b, "\r\n"...)
	}
	if w.chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if w.closeAfter {
		b = append(b, "Connection: close\r\n"...)
	} else if w.req.ProtoMinor == 0 {
		b = append(b, "Connection: keep-alive\r\n"...)
	}
	b = append(b, "\r\n"...)
	w.c.scratch = b
	w.writeRaw(b)
}

type dateValue struct {
	sec  int64
	line []byte // "Date: ...\r\n"
}

var dateCache atomic.Pointer[dateValue]

// dateHeader returns the Date header line, formatted once per second.
func dateHeader() []byte {
	now := time.Now()
	sec := now.Unix()
	if d := dateCache.Load(); d != nil && d.sec == sec {
		return d.line
	}
	b := append([]byte("Date: "), now.UTC().Format(http.TimeFormat)...)
	b = append(b, "\r\n"...)
	dateCache.Store(&dateValue{sec: sec, line: b})
	return b
}

// Close closes the listener and every connection at once.
func (s *fastServer) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Shutdown(ctx)
	return nil
}
