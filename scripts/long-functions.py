#!/usr/bin/env python3
"""Functions longer than a limit (default 150 lines, signature to closing brace) in Rust files.

Usage: scripts/long-functions.py [--limit N] [DIR...]   (default: nginx-compat)
A function whose line before its signature or attributes holds `// long:` (a reason) is listed
as allowed. Exits 1 if any other function is over the limit.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def blank_literals(text):
    """Comments, strings (raw too) and char literals blanked, newlines kept (line numbers hold)."""
    out, i, n = [], 0, len(text)
    keep = lambda chunk: "".join(c if c == "\n" else " " for c in chunk)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            # keep `// long:` markers visible
            out.append(text[i:j] if "// long:" in text[i:j] else keep(text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 12]) if (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + keep(text[i + 2:j]))
            i = j
            continue
        if text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + keep(text[i + 2:j + 1]))
            i = j + 1
            continue
        m = re.match(r"'(\\x..|\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
        if m:
            out.append(keep(m.group(0)))
            i += len(m.group(0))
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def functions(path):
    lines = blank_literals(path.read_text()).split("\n")
    sig = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")
    for i, line in enumerate(lines):
        m = sig.match(line)
        if not m:
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            code = re.sub(r"//.*", "", lines[j])
            if not started and ";" in code and "{" not in code:
                break  # a declaration
            for ch in code:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                break
            j += 1
        if not started:
            continue
        k = i - 1
        while k >= 0 and (lines[k].strip().startswith("#[") or lines[k].strip().startswith("///")):
            k -= 1
        reason = k >= 0 and "// long:" in lines[k] or any("// long:" in lines[x] for x in range(max(k, 0), i))
        yield m.group(7), i + 1, j - i + 1, reason


def main():
    args = sys.argv[1:]
    limit = 150
    if "--limit" in args:
        n = args.index("--limit")
        limit = int(args[n + 1])
        del args[n:n + 2]
    dirs = [Path(a) for a in args] or [ROOT / "nginx-compat"]
    found = []
    for d in dirs:
        for f in sorted(d.rglob("*.rs")):
            if "target" in f.parts:
                continue
            for name, line, n, reason in functions(f):
                rel = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
                found.append((n, f"{rel}:{line}", name, reason))
    found.sort(reverse=True)
    bad = 0
    for n, where, name, reason in found[:15]:
        flag = "over, reason given" if n > limit and reason else ("OVER" if n > limit else "")
        print(f"{n:5} {where} {name} {flag}")
    bad = sum(1 for n, _, _, reason in found if n > limit and not reason)
    print(f"{bad} function(s) over {limit} lines without a reason")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
