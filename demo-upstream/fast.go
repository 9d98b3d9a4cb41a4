package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// newFastServer serves the endpoints with github.com/valyala/fasthttp
// (about a third of net/http's CPU per request).
func newFastServer(s *server) *fasthttp.Server {
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			defer func() {
				if p := recover(); p != nil { // net/http recovers too; fasthttp would crash
					fmt.Fprintf(os.Stderr, "demo-upstream: panic serving %s: %v\n%s", ctx.RemoteAddr(), p, debug.Stack())
					ctx.Response.Reset()
					ctx.SetStatusCode(http.StatusInternalServerError)
					ctx.SetConnectionClose()
				}
			}()
			s.serve((*fastExchange)(ctx))
		},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			// Requests fasthttp cannot read (it closes the connection after).
			code, msg := http.StatusBadRequest, "Error when parsing request"
			var small *fasthttp.ErrSmallBuffer
			var ne net.Error
			switch {
			case errors.As(err, &small):
				code, msg = http.StatusRequestHeaderFieldsTooLarge, "Too big request header"
			case errors.Is(err, fasthttp.ErrBodyTooLarge):
				code, msg = http.StatusRequestEntityTooLarge, "Request body too large"
			case errors.As(err, &ne) && ne.Timeout():
				code, msg = http.StatusRequestTimeout, "Request timeout"
			}
			ctx.Error(msg, code) // resets the response: the header comes after
			ctx.Response.Header.Set("X-Upstream-Name", s.name)
		},
		Logger: quietLogger{}, // like the handlers: no per-request logging

		// Request heads (line + headers) up to 64 KiB: above Envoy's
		// default limit (60 KiB) and nginx's (4 x 8 KiB).
		ReadBufferSize: 64 << 10,
		// The handlers read request bodies of any size as streams
		// (echo counts them, the LLM endpoints stop at 64 MiB with 413).
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		// Keep-alive connections are never closed for being idle
		// (no ReadTimeout/IdleTimeout), as with net/http here.
	}
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// fastExchange implements exchange for fasthttp. It is the RequestCtx
// itself, so wrapping one allocates nothing.
type fastExchange fasthttp.RequestCtx

func (x *fastExchange) ctx() *fasthttp.RequestCtx { return (*fasthttp.RequestCtx)(x) }

// b2s views b as a string without copying. fasthttp's request buffers are
// stable until the handler returns, which bounds every use here (see
// exchange).
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (x *fastExchange) method() string   { return b2s(x.ctx().Method()) }
func (x *fastExchange) path() string     { return b2s(x.ctx().Path()) }
func (x *fastExchange) rawPath() string  { return b2s(x.ctx().URI().PathOriginal()) }
func (x *fastExchange) rawQuery() string { return b2s(x.ctx().URI().QueryString()) }

// s2b views s as bytes without copying; they must only be read.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// The *Canonical methods skip normalising the name, which otherwise costs
// about as much as the operation; fasthttp only reads key and value.

func (x *fastExchange) header(canonical string) string {
	return b2s(x.ctx().Request.Header.PeekCanonical(s2b(canonical)))
}

// appendHeaders reports the header lines as received (names normalised
// by fasthttp). For an absolute-form request target, the host is the
// target's, as net/http reports it (RFC 9112 section 3.2.2).
func (x *fastExchange) appendHeaders(dst []headerField) []headerField {
	ctx := x.ctx()
	absolute := !bytes.HasPrefix(ctx.RequestURI(), []byte("/"))
	for k, v := range ctx.Request.Header.AllInOrder() {
		if absolute && string(k) == fasthttp.HeaderHost {
			continue
		}
		dst = append(dst, headerField{b2s(k), b2s(v)})
	}
	if absolute {
		if h := ctx.Host(); len(h) > 0 {
			dst = append(dst, headerField{fasthttp.HeaderHost, b2s(h)})
		}
	}
	return dst
}

func (x *fastExchange) body() io.Reader {
	ctx := x.ctx()
	if r := ctx.RequestBodyStream(); r != nil {
		return r
	}
	if b := ctx.PostBody(); len(b) > 0 { // a RequestCtx not from Server.Serve
		return bytes.NewReader(b)
	}
	return http.NoBody
}

func (x *fastExchange) setHeader(canonical, value string) {
	x.ctx().Response.Header.SetCanonical(s2b(canonical), s2b(value))
}

func (x *fastExchange) respond(code int, body []byte) {
	x.ctx().SetStatusCode(code)
	x.ctx().SetBody(body)
}

func (x *fastExchange) respondSized(code, size int, body io.Reader) {
	x.ctx().SetStatusCode(code)
	x.ctx().SetBodyStream(body, size)
}

func (x *fastExchange) interim(int) {}

func (x *fastExchange) closeConnection() { x.ctx().SetConnectionClose() }

func (x *fastExchange) stream(events io.ReadCloser) {
	ctx := x.ctx()
	ctx.SetStatusCode(http.StatusOK)
	if ctx.Request.Header.IsHTTP11() {
		// Chunked: fasthttp sends each Read as one chunk and flushes it,
		// then closes events.
		ctx.SetBodyStream(events, -1)
		return
	}
	// fasthttp would stream chunked to an HTTP/1.0 client (nginx's default
	// for upstreams), which cannot read it. Send fasthttp's own serialised
	// header and then the body on the bare connection, one write per Read,
	// ended by closing the connection (the HTTP/1.0 way).
	ctx.SetConnectionClose()
	head := bytes.Clone(ctx.Response.Header.Header())
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer events.Close()
		if _, err := c.Write(head); err != nil {
			return
		}
		bp := getBuf()
		defer putBuf(bp)
		_ = copyFlushing(c, events, (*bp)[:cap(*bp)], func() error { return nil })
	})
}
