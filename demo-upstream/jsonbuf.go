package main

import (
	"sync"
	"unicode/utf8"
)

// Pooled scratch buffers for building bodies without per-request garbage.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(bp *[]byte) {
	if cap(*bp) > 256<<10 { // don't keep "huge" bodies alive
		return
	}
	*bp = (*bp)[:0]
	bufPool.Put(bp)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a quoted JSON string. Like encoding/json
// (without HTML escaping): invalid UTF-8 becomes U+FFFD, U+2028/U+2029
// are escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendLowerJSONString appends an HTTP header name, lower-cased (ASCII),
// as a JSON string. Header names that reach a handler are tokens, so the
// fast path needs no escaping; anything else falls back to full escaping.
func appendLowerJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			lower := make([]byte, len(s))
			for j := 0; j < len(s); j++ {
				lower[j] = lowerASCII(s[j])
			}
			return appendJSONString(b, string(lower))
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		b = append(b, lowerASCII(s[i]))
	}
	return append(b, '"')
}
