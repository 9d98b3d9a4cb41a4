#!/usr/bin/env python3
"""Import cycles between the modules (files) of each crate of nginx-compat/ and plugins/.

A module is a source file (`src/a.rs` is `a`, `src/a/b.rs` is `a::b`, `src/a/mod.rs` is `a`,
`src/lib.rs` is the crate root). Module A depends on module B when A's code (comments and
string literals removed) names a path into B: `crate::b::...`, `super::...`, `self::...`, in a
`use` (braces expanded) or inline. `crate::X` where X is not a module is a dependency on the
crate root. `mod` declarations are not dependencies. Prints each crate's edges with
--verbose, and every strongly connected component of more than one module (or a module that
depends on itself through a path); exits 1 if any.

Usage: scripts/check-module-cycles.py [--verbose] [CRATE_DIR...]   (default: nginx-compat/*/ plugins/*/)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def strip(src):
    # Comments (line and block, incl. doc comments), char and string literals (raw too).
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i-1].isalnum() or src[i-1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:i + 4]) or (c == "'" and re.match(r"'\\(x..|u\{[0-9a-fA-F]+\})'", src[i:i + 12])):
            m = re.match(r"'(\\x..|\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules(src_dir):
    mods = {}
    for f in sorted(src_dir.rglob("*.rs")):
        rel = f.relative_to(src_dir).with_suffix("")
        parts = list(rel.parts)
        if parts == ["lib"] or parts == ["main"]:
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        mods[tuple(parts)] = f
    return mods


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    def rec(prefix, s):
        res, depth, cur = [], 0, ""
        items = []
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            items.append(cur)
        for it in items:
            if "{" in it:
                head, rest = it.split("{", 1)
                res += rec(prefix + head, rest[:-1])
            else:
                res.append(prefix + it)
        return res
    return rec("", tree)


def resolve(path, here, mods):
    """The module a path (list of segments) starting at module `here` lands in."""
    segs = [s for s in path if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("self", "super"):
        base = here
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        # A path relative to `here`: a child module or an item imported; only children count.
        base = here
        if (here + (segs[0],)) not in mods:
            return None
    best = base
    for s in segs:
        if best + (s,) in mods:
            best = best + (s,)
        else:
            break
    return best


def crate_graph(crate_dir):
    src_dir = crate_dir / "src"
    mods = modules(src_dir)
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        code = strip(f.read_text())
        # Inline test modules depend on their parent by design (`use super::*`): skip them.
        code = re.sub(r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*(pub\s+)?mod\s+\w+\s*\{", "mod __test {", code)
        code = cut_test_mods(code)
        paths = []
        for um in re.finditer(r"\buse\s+([^;]+);", code):
            paths += expand_use(um.group(1))
        for pm in re.finditer(r"(?<![\w:])([A-Za-z_]\w*(?:::\w+)+)", code):
            paths.append(pm.group(1))
        for p in paths:
            segs = [s for s in p.split("::") if s and s != "*"]
            segs = [s.split(" as ")[0] for s in segs]
            t = resolve(segs, m, mods)
            if t is not None and t != m:
                edges[m].add(t)
    return mods, edges


def cut_test_mods(code):
    out, i = [], 0
    while True:
        j = code.find("mod __test {", i)
        if j < 0:
            out.append(code[i:])
            return "".join(out)
        out.append(code[i:j])
        k, depth = j + len("mod __test {"), 1
        while k < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[k], 0)
            k += 1
        i = k


def sccs(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(comp)
    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "(crate root)"


def main():
    args = sys.argv[1:]
    verbose = "--verbose" in args
    dirs = [Path(a) for a in args if a != "--verbose"] or sorted(
        p for top in ("nginx-compat", "plugins") for p in (ROOT / top).iterdir()
        if (p / "Cargo.toml").exists() and (p / "src").is_dir())
    bad = 0
    for d in dirs:
        mods, edges = crate_graph(d)
        cycles = [c for c in sccs(edges) if len(c) > 1]
        print(f"{d.name}: {len(mods)} modules, {sum(len(e) for e in edges.values())} edges, "
              f"{len(cycles)} cycle(s)")
        if verbose:
            for m in sorted(edges):
                print(f"  {name(m)} -> {', '.join(sorted(name(t) for t in edges[m])) or '-'}")
        for c in cycles:
            bad += 1
            print("  cycle: " + " <-> ".join(sorted(name(m) for m in c)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
