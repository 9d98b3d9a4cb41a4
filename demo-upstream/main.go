// Command demo-upstream is a small, fast HTTP/1.1 upstream used by the
// Tollgate end-to-end tests and benchmarks.
//
// It answers health checks, arbitrary status codes, fixed-size bodies,
// mock OpenAI / Anthropic endpoints with deterministic, header-controlled
// token usage, and echoes every other request back as JSON. Every response
// carries "x-upstream-name: NAME".
//
// Usage:
//
//	demo-upstream -listen 127.0.0.1:8080 -name upstream-a
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on (host:port)")
	name := flag.String("name", "demo-upstream", "identity reported in the x-upstream-name header and in bodies")
	stdlib := flag.Bool("stdlib", false, "serve with net/http's server instead of the built-in fast HTTP/1.1 server")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file until shutdown (for performance work)")
	flag.Parse()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo-upstream: %v\n", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "demo-upstream: %v\n", err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo-upstream: listen %s: %v\n", *listen, err)
		os.Exit(1)
	}

	var srv interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
		Close() error
	}
	if *stdlib {
		srv = &http.Server{
			Handler: newServer(*name),
			// Only bounds the time to read headers once a request has
			// started; idle keep-alive connections are never closed.
			ReadHeaderTimeout: 30 * time.Second,
			MaxHeaderBytes:    1 << 20,
		}
	} else {
		srv = newFastServer(newServer(*name), errorHeader(*name))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()

	fmt.Fprintf(os.Stderr, "demo-upstream %s listening on %s\n", *name, ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "demo-upstream: serve: %v\n", err)
		os.Exit(1)
	}
	<-done
}

// errorHeader is the x-upstream-name header line the fast server adds to
// the errors it generates itself (requests it cannot parse).
func errorHeader(name string) string {
	return "X-Upstream-Name: " + strings.NewReplacer("\r", " ", "\n", " ").Replace(name) + "\r\n"
}
