// Command demo-upstream is a small, fast HTTP/1.1 upstream used by the
// Tollgate end-to-end tests and benchmarks.
//
// It answers health checks, arbitrary status codes, fixed-size bodies,
// mock OpenAI / Anthropic endpoints with deterministic, header-controlled
// token usage, and echoes every other request back as JSON. Every response
// carries "x-upstream-name: NAME". It serves with
// github.com/valyala/fasthttp, or with net/http given -stdlib.
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
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on (host:port)")
	name := flag.String("name", "demo-upstream", "identity reported in the x-upstream-name header and in bodies")
	stdlib := flag.Bool("stdlib", false, "serve with net/http's server instead of fasthttp (which uses about a third of the CPU per request)")
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

	s := newServer(*name)
	var (
		serve    func(net.Listener) error
		shutdown func(context.Context) error // within the context's time
	)
	if *stdlib {
		srv := &http.Server{
			Handler: stdHandler{s},
			// Only bounds the time to read headers once a request has
			// started; idle keep-alive connections are never closed.
			ReadHeaderTimeout: 30 * time.Second,
			MaxHeaderBytes:    1 << 20,
		}
		serve = srv.Serve
		shutdown = func(ctx context.Context) error {
			if err := srv.Shutdown(ctx); err != nil {
				return srv.Close()
			}
			return nil
		}
	} else {
		srv := newFastServer(s)
		serve = srv.Serve
		// Closes the listener and idle connections, lets active ones
		// finish their request; the process exits at the deadline anyway.
		shutdown = srv.ShutdownWithContext
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}()

	fmt.Fprintf(os.Stderr, "demo-upstream %s listening on %s\n", *name, ln.Addr())
	if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "demo-upstream: serve: %v\n", err)
		os.Exit(1)
	}
	<-done
}
