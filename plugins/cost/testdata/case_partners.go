//go:build ignore

// Writes Go's half of case_partners.txt (see case_partners.py): every code point outside ASCII
// whose simple case mappings (unicode.ToLower, ToUpper, ToTitle) or simple case folding orbit
// (unicode.SimpleFold, what bytes.EqualFold and encoding/json's field matching use) reach an
// ASCII letter, as `U+XXXX go:<how> <letter>`.
package main

import (
	"fmt"
	"unicode"
)

func main() {
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		maps := []struct {
			how string
			to  rune
		}{{"lower", unicode.ToLower(r)}, {"upper", unicode.ToUpper(r)}, {"title", unicode.ToTitle(r)}}
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			maps = append(maps, struct {
				how string
				to  rune
			}{"fold", f})
		}
		for _, m := range maps {
			if m.to < 0x80 {
				fmt.Printf("U+%04X go:%s %c\n", r, m.how, unicode.ToLower(m.to))
			}
		}
	}
}
