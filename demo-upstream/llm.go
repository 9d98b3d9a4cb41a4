package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mock LLM endpoints: OpenAI Chat Completions, Responses, Embeddings and
// Anthropic Messages. Bodies are assembled by hand (no reflection) from
// the request's model/stream flags and the x-mock-* request headers.

type apiKind int

const (
	apiChat apiKind = iota
	apiResponses
	apiEmbeddings
	apiMessages
)

type bodyMode int

const (
	bodyNormal    bodyMode = iota
	bodyMalformed          // invalid JSON (and invalid SSE data payloads)
	bodyTruncated          // the normal body cut in half
	bodyNoUsage            // the normal body without usage
	bodyHuge               // valid body padded to ~2 MiB
)

const (
	defaultModel    = "demo-model"
	created         = "1700000000"
	maxRequestBody  = 64 << 20
	maxChunks       = 100000
	maxDelayMillis  = 10000
	hugePaddingSize = 2 << 20
)

// mock holds everything that shapes one mock response.
type mock struct {
	api                  apiKind
	model                string
	omitModel            bool
	prompt, completion   int64
	cached, reasoning    int64
	cacheCreation        int64
	chunks               int
	delay                time.Duration
	mode                 bodyMode
	gzip, crlf           bool
	stream, includeUsage bool
}

// llmRequest is what the mock reads from a request body (see
// parseLLMRequest; the json tags document the shape and serve the tests).
type llmRequest struct {
	Model         string         `json:"model"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

var errTooLarge = errors.New("request body too large")

func (s *server) llm(x exchange, api apiKind) {
	m := mock{api: api}
	if msg := m.parseHeaders(x); msg != "" {
		llmError(x, api, http.StatusBadRequest, msg)
		return
	}

	rbp := getBuf()
	defer putBuf(rbp)
	body, err := readAll(x.body(), (*rbp)[:0], maxRequestBody)
	*rbp = body
	if err != nil {
		code := http.StatusBadRequest
		if err == errTooLarge {
			code = http.StatusRequestEntityTooLarge
		}
		llmError(x, api, code, "reading request body: "+err.Error())
		return
	}
	var req llmRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if req, err = parseLLMRequest(body); err != nil {
			llmError(x, api, http.StatusBadRequest, "invalid JSON request body: "+err.Error())
			return
		}
	}
	if m.delay > 0 {
		// The answer is held, as an upstream thinking: requests overlap in the gateway.
		time.Sleep(m.delay)
	}
	m.stream = req.Stream
	m.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if v := x.header("X-Mock-Model"); v != "" {
		m.model = v
	} else if req.Model != "" {
		m.model = req.Model
	} else {
		m.model = defaultModel
	}

	bp := getBuf()
	b := (*bp)[:0]
	switch {
	case api == apiChat && m.stream:
		var ends []int
		b, ends = s.chatStream(b, &m)
		*bp = b
		streamOut(x, &m, bp, ends) // hands bp back to the pool when done
		return
	case api == apiMessages && m.stream:
		var ends []int
		b, ends = s.messagesStream(b, &m)
		*bp = b
		streamOut(x, &m, bp, ends)
		return
	case api == apiResponses && m.stream:
		putBuf(bp)
		llmError(x, api, http.StatusBadRequest, "demo-upstream: streaming is not supported for /v1/responses")
		return
	case api == apiChat:
		b = s.chatBody(b, &m)
	case api == apiResponses:
		b = s.responsesBody(b, &m)
	case api == apiEmbeddings:
		b = embeddingsBody(b, &m)
	case api == apiMessages:
		b = s.messagesBody(b, &m)
	}
	if m.mode == bodyMalformed {
		b = malform(b, 0)
	}
	*bp = b
	bodyOut(x, &m, b)
	putBuf(bp)
}

// parseHeaders reads the x-mock-* controls; it returns an error message
// for values it cannot use.
func (m *mock) parseHeaders(x exchange) string {
	// Names apart from destinations, so that m does not escape through
	// the interface call.
	names := [...]string{"X-Mock-Prompt-Tokens", "X-Mock-Completion-Tokens", "X-Mock-Cached-Tokens",
		"X-Mock-Reasoning-Tokens", "X-Mock-Cache-Creation-Tokens"}
	dsts := [...]*int64{&m.prompt, &m.completion, &m.cached, &m.reasoning, &m.cacheCreation}
	defs := [...]int64{12, 8, 0, 0, 0}
	for i, name := range names {
		*dsts[i] = defs[i]
		if v := x.header(name); v != "" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return "invalid " + strings.ToLower(name) + ": want an integer"
			}
			*dsts[i] = n
		}
	}
	m.chunks = 3
	if v := x.header("X-Mock-Chunks"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > maxChunks {
			return "invalid x-mock-chunks: want an integer between 0 and 100000"
		}
		m.chunks = n
	}
	m.delay = 0
	if v := x.header("X-Mock-Delay-Ms"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > maxDelayMillis {
			return "invalid x-mock-delay-ms: want an integer between 0 and 10000"
		}
		m.delay = time.Duration(n) * time.Millisecond
	}
	if v := x.header("X-Mock-Body"); v != "" {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "", "normal":
			m.mode = bodyNormal
		case "malformed":
			m.mode = bodyMalformed
		case "truncated":
			m.mode = bodyTruncated
		case "no-usage":
			m.mode = bodyNoUsage
		case "huge":
			m.mode = bodyHuge
		default:
			return "invalid x-mock-body: want malformed, truncated, no-usage or huge"
		}
	}
	m.omitModel = boolHeader(x, "X-Mock-Omit-Model")
	m.gzip = boolHeader(x, "X-Mock-Gzip")
	m.crlf = boolHeader(x, "X-Mock-Crlf")
	return ""
}

func boolHeader(x exchange, canonical string) bool {
	v := strings.TrimSpace(x.header(canonical))
	return v == "1" || strings.EqualFold(v, "true") || strings.EqualFold(v, "yes")
}

func readAll(r io.Reader, b []byte, max int) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > max {
			return b, errTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// llmError writes an error in the provider's shape (never mangled).
func llmError(x exchange, api apiKind, code int, msg string) {
	var b []byte
	if api == apiMessages {
		b = append(b, `{"type":"error","error":{"type":"invalid_request_error","message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `}}`...)
	} else {
		b = append(b, `{"error":{"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":"invalid_request_error","param":null,"code":null}}`...)
	}
	x.setHeader("Content-Type", "application/json")
	x.respond(code, b)
}

// ---- body pieces -------------------------------------------------------

func (m *mock) usage() bool { return m.mode != bodyNoUsage }

// appendModel appends `"model":M,` unless the model is to be omitted.
func appendModel(b []byte, m *mock) []byte {
	if m.omitModel {
		return b
	}
	b = append(b, `"model":`...)
	b = appendJSONString(b, m.model)
	return append(b, ',')
}

func appendPadding(b []byte) []byte {
	for n := hugePaddingSize; n > 0; {
		k := min(n, len(xChunk))
		b = append(b, xChunk[:k]...)
		n -= k
	}
	return b
}

// appendText appends the full reply text as a JSON string; in huge mode
// it is followed by a space and ~2 MiB of 'x'.
func (s *server) appendText(b []byte, m *mock) []byte {
	b = appendJSONString(b, s.hello)
	if m.mode == bodyHuge {
		b = b[:len(b)-1] // reopen the string
		b = append(b, ' ')
		b = appendPadding(b)
		b = append(b, '"')
	}
	return b
}

// helloWords are the start offsets of "Hello", " from" and " NAME" in
// server.hello.
var helloWords = [...]int{0, len("Hello"), len("Hello from")}

// appendPiece appends streamed content piece i of n as a JSON string.
// Pieces are "Hello", " from", " NAME" (the last piece takes whatever
// words remain when n < 3) and " 4", " 5", ... beyond the third, so for
// n <= 3 they concatenate to "Hello from NAME". In huge mode the last
// piece is followed by a space and ~2 MiB of 'x'.
func (s *server) appendPiece(b []byte, m *mock, i, n int) []byte {
	switch {
	case i >= 3:
		b = append(b, `" `...)
		b = strconv.AppendInt(b, int64(i+1), 10)
		b = append(b, '"')
	case i == n-1 || i == 2:
		b = appendJSONString(b, s.hello[helloWords[i]:])
	default:
		b = appendJSONString(b, s.hello[helloWords[i]:helloWords[i+1]])
	}
	if m.mode == bodyHuge && i == n-1 {
		b = b[:len(b)-1]
		b = append(b, ' ')
		b = appendPadding(b)
		b = append(b, '"')
	}
	return b
}

func appendChatUsage(b []byte, m *mock) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, m.prompt, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, m.completion, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, m.prompt+m.completion, 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, m.cached, 10)
	b = append(b, `},"completion_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, m.reasoning, 10)
	return append(b, `}}`...)
}

func appendAnthropicUsage(b []byte, m *mock, output int64) []byte {
	b = append(b, `"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, m.prompt, 10)
	b = append(b, `,"cache_creation_input_tokens":`...)
	b = strconv.AppendInt(b, m.cacheCreation, 10)
	b = append(b, `,"cache_read_input_tokens":`...)
	b = strconv.AppendInt(b, m.cached, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, output, 10)
	return append(b, '}')
}

// malform makes the JSON document starting at b[start:] invalid while
// keeping its text (usage numbers included) recognisable: it drops the
// comma after the first member, or, if there is none, the closing brace.
func malform(b []byte, start int) []byte {
	if i := bytes.IndexByte(b[start:], ','); i >= 0 {
		i += start
		copy(b[i:], b[i+1:])
		return b[:len(b)-1]
	}
	if n := len(b); n > start && b[n-1] == '}' {
		return b[:n-1]
	}
	return b
}

// ---- non-streaming bodies ---------------------------------------------

func (s *server) chatBody(b []byte, m *mock) []byte {
	b = append(b, `{"id":"chatcmpl-demo","object":"chat.completion","created":`+created+`,`...)
	b = appendModel(b, m)
	b = append(b, `"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	b = s.appendText(b, m)
	b = append(b, `},"finish_reason":"stop"}]`...)
	if m.usage() {
		b = append(b, ',')
		b = appendChatUsage(b, m)
	}
	return append(b, '}')
}

func (s *server) responsesBody(b []byte, m *mock) []byte {
	b = append(b, `{"id":"resp_demo","object":"response","created_at":`+created+`,"status":"completed",`...)
	b = appendModel(b, m)
	b = append(b, `"output":[{"type":"message","id":"msg_demo","status":"completed","role":"assistant","content":[{"type":"output_text","text":`...)
	b = s.appendText(b, m)
	b = append(b, `,"annotations":[]}]}]`...)
	if m.usage() {
		b = append(b, `,"usage":{"input_tokens":`...)
		b = strconv.AppendInt(b, m.prompt, 10)
		b = append(b, `,"output_tokens":`...)
		b = strconv.AppendInt(b, m.completion, 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, m.prompt+m.completion, 10)
		b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, m.cached, 10)
		b = append(b, `},"output_tokens_details":{"reasoning_tokens":`...)
		b = strconv.AppendInt(b, m.reasoning, 10)
		b = append(b, `}}`...)
	}
	return append(b, '}')
}

func embeddingsBody(b []byte, m *mock) []byte {
	b = append(b, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2,0.3`...)
	if m.mode == bodyHuge {
		for n := 0; n < hugePaddingSize; n += 4 {
			b = append(b, ",0.1"...)
		}
	}
	b = append(b, `]}]`...)
	if !m.omitModel {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, m.model)
	}
	if m.usage() {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, m.prompt, 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, m.prompt, 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

func (s *server) messagesBody(b []byte, m *mock) []byte {
	b = append(b, `{"id":"msg_demo","type":"message","role":"assistant",`...)
	b = appendModel(b, m)
	b = append(b, `"content":[{"type":"text","text":`...)
	b = s.appendText(b, m)
	b = append(b, `}],"stop_reason":"end_turn","stop_sequence":null`...)
	if m.usage() {
		b = append(b, ',')
		b = appendAnthropicUsage(b, m, m.completion)
	}
	return append(b, '}')
}

// ---- streaming bodies -------------------------------------------------

// sseBuilder assembles a whole event stream in one buffer and records
// where each event ends so it can be written (and flushed) event by event.
type sseBuilder struct {
	b    []byte
	ends []int
	nl   string
	m    *mock
}

func newSSE(b []byte, m *mock) *sseBuilder {
	nl := "\n"
	if m.crlf {
		nl = "\r\n"
	}
	return &sseBuilder{b: b, nl: nl, m: m, ends: make([]int, 0, m.chunks+8)}
}

// begin starts an event (optionally named) and returns where its data
// payload starts.
func (e *sseBuilder) begin(event string) int {
	if event != "" {
		e.b = append(e.b, "event: "...)
		e.b = append(e.b, event...)
		e.b = append(e.b, e.nl...)
	}
	e.b = append(e.b, "data: "...)
	return len(e.b)
}

// end finishes the event whose JSON payload started at start.
func (e *sseBuilder) end(start int, isJSON bool) {
	if isJSON && e.m.mode == bodyMalformed {
		e.b = malform(e.b, start)
	}
	e.b = append(e.b, e.nl...)
	e.b = append(e.b, e.nl...)
	e.ends = append(e.ends, len(e.b))
}

func (s *server) chatStream(b []byte, m *mock) ([]byte, []int) {
	e := newSSE(b, m)
	usage := m.includeUsage && m.usage()
	chunk := func(delta string) int {
		p := e.begin("")
		e.b = append(e.b, `{"id":"chatcmpl-demo","object":"chat.completion.chunk","created":`+created+`,`...)
		e.b = appendModel(e.b, m)
		e.b = append(e.b, `"choices":[`...)
		e.b = append(e.b, delta...)
		return p
	}
	finish := func(p int) {
		e.b = append(e.b, ']')
		if usage {
			e.b = append(e.b, `,"usage":null`...)
		}
		e.b = append(e.b, '}')
		e.end(p, true)
	}

	p := chunk(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`)
	finish(p)
	for i := 0; i < m.chunks; i++ {
		p = chunk(`{"index":0,"delta":{"content":`)
		e.b = s.appendPiece(e.b, m, i, m.chunks)
		e.b = append(e.b, `},"logprobs":null,"finish_reason":null}`...)
		finish(p)
	}
	p = chunk(`{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}`)
	finish(p)
	if usage {
		p = chunk("")
		e.b = append(e.b, `],`...)
		e.b = appendChatUsage(e.b, m)
		e.b = append(e.b, '}')
		e.end(p, true)
	}
	p = e.begin("")
	e.b = append(e.b, "[DONE]"...)
	e.end(p, false)
	return e.b, e.ends
}

func (s *server) messagesStream(b []byte, m *mock) ([]byte, []int) {
	e := newSSE(b, m)

	p := e.begin("message_start")
	e.b = append(e.b, `{"type":"message_start","message":{"id":"msg_demo","type":"message","role":"assistant",`...)
	e.b = appendModel(e.b, m)
	e.b = append(e.b, `"content":[],"stop_reason":null,"stop_sequence":null`...)
	if m.usage() {
		e.b = append(e.b, ',')
		e.b = appendAnthropicUsage(e.b, m, 1)
	}
	e.b = append(e.b, `}}`...)
	e.end(p, true)

	p = e.begin("content_block_start")
	e.b = append(e.b, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`...)
	e.end(p, true)

	p = e.begin("ping")
	e.b = append(e.b, `{"type":"ping"}`...)
	e.end(p, true)

	for i := 0; i < m.chunks; i++ {
		p = e.begin("content_block_delta")
		e.b = append(e.b, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`...)
		e.b = s.appendPiece(e.b, m, i, m.chunks)
		e.b = append(e.b, `}}`...)
		e.end(p, true)
	}

	p = e.begin("content_block_stop")
	e.b = append(e.b, `{"type":"content_block_stop","index":0}`...)
	e.end(p, true)

	p = e.begin("message_delta")
	e.b = append(e.b, `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null}`...)
	if m.usage() {
		e.b = append(e.b, `,"usage":{"output_tokens":`...)
		e.b = strconv.AppendInt(e.b, m.completion, 10)
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, '}')
	e.end(p, true)

	p = e.begin("message_stop")
	e.b = append(e.b, `{"type":"message_stop"}`...)
	e.end(p, true)
	return e.b, e.ends
}

// ---- output -------------------------------------------------------------

var gzPool = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return zw
}}

func bodyOut(x exchange, m *mock, b []byte) {
	if m.mode == bodyTruncated {
		b = b[:len(b)/2]
	}
	x.setHeader("Content-Type", "application/json")
	if m.gzip {
		var buf bytes.Buffer
		zw := gzPool.Get().(*gzip.Writer)
		zw.Reset(&buf)
		_, _ = zw.Write(b)
		_ = zw.Close()
		zw.Reset(nil)
		gzPool.Put(zw)
		b = buf.Bytes()
		x.setHeader("Content-Encoding", "gzip")
	}
	x.respond(http.StatusOK, b)
}

// streamOut sends the event stream in (*bp)[:ends[len(ends)-1]], one
// event at a time, and hands bp back to the pool when it is done.
func streamOut(x exchange, m *mock, bp *[]byte, ends []int) {
	x.setHeader("Content-Type", "text/event-stream")
	x.setHeader("Cache-Control", "no-cache")
	x.setHeader("X-Accel-Buffering", "no") // ask nginx not to buffer the stream
	ev := &sseStream{bp: bp, ends: ends, limit: len(*bp)}
	if m.mode == bodyTruncated {
		ev.limit /= 2
	}
	if m.gzip {
		x.setHeader("Content-Encoding", "gzip")
		ev.zw = gzPool.Get().(*gzip.Writer)
		ev.zw.Reset(&ev.zbuf)
	}
	x.stream(ev)
}

// sseStream reads an event stream one event per Read (a Read returns part
// of an event only when p is too small for the rest of it), so a server
// that sends each Read at once flushes per event. With gzip, each event is
// compressed and flushed on its own, and the gzip trailer comes last.
type sseStream struct {
	bp      *[]byte // the whole stream; back to the pool on Close
	ends    []int   // where each event ends
	limit   int     // bytes of the stream to send (less when truncated)
	next    int     // index in ends of the next event
	off     int     // bytes of the stream consumed
	pending []byte  // the rest of the current event, as sent
	zw      *gzip.Writer
	zbuf    bytes.Buffer
	done    bool
}

func (e *sseStream) Read(p []byte) (int, error) {
	for len(e.pending) == 0 {
		if e.done || e.bp == nil {
			return 0, io.EOF
		}
		e.pending = e.nextEvent()
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	return n, nil
}

// nextEvent returns the next event's bytes as they are to be sent (maybe
// empty), and sets done after the last.
func (e *sseStream) nextEvent() []byte {
	b := *e.bp
	var ev []byte
	if e.next < len(e.ends) && e.off < e.limit {
		end := min(e.ends[e.next], e.limit)
		ev = b[e.off:end]
		e.next++
		e.off = end
	} else {
		e.done = true
	}
	if e.zw == nil {
		return ev
	}
	e.zbuf.Reset()
	if e.done {
		_ = e.zw.Close()
	} else {
		_, _ = e.zw.Write(ev)
		_ = e.zw.Flush()
	}
	return e.zbuf.Bytes()
}

// Close releases the buffers; the stream reads as ended afterwards.
func (e *sseStream) Close() error {
	if e.zw != nil {
		e.zw.Reset(nil)
		gzPool.Put(e.zw)
		e.zw = nil
	}
	if e.bp != nil {
		putBuf(e.bp)
		e.bp = nil
	}
	e.pending = nil
	return nil
}
