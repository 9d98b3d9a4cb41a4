//go:build ignore

// Writes go_reads.json, Go's reading of each vector of vectors.json (see python_reads.py), by
// name: what a server reading its request with encoding/json's Decoder into a struct reads
// (field names matched exactly, else case-insensitively with Unicode simple folding; invalid
// UTF-8 as U+FFFD; the first JSON value only), or null where Decode fails.
package main

import (
	"bytes"
	"encoding/json"
	"os"
)

type request struct {
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
}

func main() {
	raw, err := os.ReadFile("vectors.json")
	if err != nil {
		panic(err)
	}
	var vectors []map[string]any
	if err := json.Unmarshal(raw, &vectors); err != nil {
		panic(err)
	}
	reads := map[string]any{}
	for _, v := range vectors {
		name := v["name"].(string)
		var body []byte
		if err := json.Unmarshal([]byte(`"`+v["body"].(string)+`"`), &body); err != nil {
			panic(err)
		}
		var r request
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&r); err != nil {
			reads[name] = nil
			continue
		}
		got := map[string]any{"model": r.Model, "stream": r.Stream, "include_usage": nil}
		if r.StreamOptions != nil {
			got["include_usage"] = r.StreamOptions.IncludeUsage
		}
		reads[name] = got
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetIndent("", " ")
	if err := enc.Encode(reads); err != nil {
		panic(err)
	}
	if err := os.WriteFile("go_reads.json", out.Bytes(), 0o644); err != nil {
		panic(err)
	}
}
