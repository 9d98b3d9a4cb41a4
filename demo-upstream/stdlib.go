package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
)

// stdHandler serves the endpoints with net/http (the -stdlib flag).
type stdHandler struct{ s *server }

func (h stdHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.s.serve(&stdExchange{w: w, r: r})
}

// stdExchange implements exchange for net/http.
type stdExchange struct {
	w http.ResponseWriter
	r *http.Request
}

func (x *stdExchange) method() string   { return x.r.Method }
func (x *stdExchange) path() string     { return x.r.URL.Path }
func (x *stdExchange) rawQuery() string { return x.r.URL.RawQuery }
func (x *stdExchange) body() io.Reader  { return x.r.Body }

func (x *stdExchange) rawPath() string {
	u := x.r.RequestURI
	if strings.HasPrefix(u, "/") {
		if i := strings.IndexByte(u, '?'); i >= 0 {
			u = u[:i]
		}
		return u
	}
	return x.r.URL.EscapedPath() // absolute-form or "*"
}

func (x *stdExchange) header(canonical string) string {
	if vs := x.r.Header[canonical]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func (x *stdExchange) appendHeaders(dst []headerField) []headerField {
	r := x.r
	for k, vs := range r.Header {
		for _, v := range vs {
			dst = append(dst, headerField{k, v})
		}
	}
	// net/http moves these out of r.Header; report them as headers too.
	if r.Host != "" && r.Header["Host"] == nil {
		dst = append(dst, headerField{"Host", r.Host})
	}
	if r.Header["Transfer-Encoding"] == nil {
		for _, v := range r.TransferEncoding {
			dst = append(dst, headerField{"Transfer-Encoding", v})
		}
	}
	return dst
}

func (x *stdExchange) setHeader(canonical, value string) {
	x.w.Header()[canonical] = []string{value}
}

func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

func (x *stdExchange) respond(code int, body []byte) {
	if bodyAllowed(code) && len(body) > 2000 { // smaller bodies get an automatic Content-Length
		x.w.Header()["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	x.w.WriteHeader(code)
	if len(body) > 0 && bodyAllowed(code) {
		_, _ = x.w.Write(body)
	}
}

func (x *stdExchange) respondSized(code, size int, body io.Reader) {
	x.w.Header()["Content-Length"] = []string{strconv.Itoa(size)}
	x.w.WriteHeader(code)
	if x.r.Method != http.MethodHead {
		_, _ = io.CopyN(x.w, body, int64(size))
	}
}

func (x *stdExchange) interim(code int) { x.w.WriteHeader(code) }

func (x *stdExchange) closeConnection() { x.w.Header()["Connection"] = []string{"close"} }

func (x *stdExchange) stream(events io.ReadCloser) {
	defer events.Close()
	x.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(x.w)
	bp := getBuf()
	defer putBuf(bp)
	_ = copyFlushing(x.w, events, (*bp)[:cap(*bp)], rc.Flush)
}

// copyFlushing copies r to w, calling flush after each Read's bytes.
func copyFlushing(w io.Writer, r io.Reader, buf []byte, flush func() error) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := flush(); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
