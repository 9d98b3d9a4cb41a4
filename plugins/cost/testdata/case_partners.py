"""Writes Python's half of case_partners.txt: every code point outside ASCII whose full case
mappings or case folding (str.lower, upper, title, casefold; Unicode's SpecialCasing and
CaseFolding, Python 3.11's Unicode 14) are ASCII only, as `U+XXXX python:<how> <letters>` (the
letters in lower case). case_partners.go writes Go's half (the simple mappings); the file is both,
sorted: `(python3 case_partners.py; go run case_partners.go) | sort > case_partners.txt`."""
import sys

for cp in range(0x80, sys.maxunicode + 1):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    for how in ("lower", "upper", "title", "casefold"):
        m = getattr(c, how)()
        if m.isascii():
            print(f"U+{cp:04X} python:{how} {m.lower()}")
