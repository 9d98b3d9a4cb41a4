// A lenient LLM upstream for tests/e2e/test_unreadable_bodies.py: it reads a request as a Go
// server commonly does, with encoding/json's Decoder into a struct (member names matched to
// fields exactly, else case-insensitively with Unicode simple folding; invalid UTF-8 read as
// U+FFFD; the first JSON value read, whatever follows), whatever the method, and answers an
// OpenAI-shaped chat completion for the model it read, with usage (a stream when `stream` is
// true, its usage chunk only with stream_options.include_usage). Each request it answers is
// written to stdout as one JSON line: tenant (x-tenant), method, path, model, stream.
//
//	go build -o lenient-upstream lenient_upstream.go && ./lenient-upstream 127.0.0.1:PORT
package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
)

type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

var out sync.Mutex

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(200)
			return
		}
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":"bad json"}`, 400)
			return
		}
		line, _ := json.Marshal(map[string]any{"tenant": r.Header.Get("x-tenant"), "method": r.Method,
			"path": r.URL.Path, "model": req.Model, "stream": req.Stream})
		out.Lock()
		fmt.Println(string(line))
		out.Unlock()
		usage := map[string]int{"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
		if !req.Stream {
			w.Header().Set("content-type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"id": "c", "object": "chat.completion", "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]string{"role": "assistant", "content": "ok"}}},
				"usage":   usage})
			return
		}
		w.Header().Set("content-type", "text/event-stream")
		chunk, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": "ok"}}}})
		fmt.Fprintf(w, "data: %s\n\n", chunk)
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			last, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "model": req.Model,
				"choices": []any{}, "usage": usage})
			fmt.Fprintf(w, "data: %s\n\n", last)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	if err := http.ListenAndServe(os.Args[1], nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
