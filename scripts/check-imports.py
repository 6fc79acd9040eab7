#!/usr/bin/env python3
"""Checks that imports between the crate's modules run one way.

Each file of src/ is a module (`a/b.rs` and `a/b/mod.rs` are `a::b`). A module depends on
another when its code names it: a `use` of `crate::...`, `super::...` or `self::...`, or such
a path written inline (`crate::wait::block(...)`). Test modules (`#[cfg(test)] mod ... {`
to the end of the file, as this crate writes them) are left out: a test may look at its
module from above. A module's `use` of its own children counts as any other, so a child
that imports its parent back makes a cycle. A path through the crate root
(`crate::Decision`) counts as a path to the module the root re-exports the item from.

The check fails when the dependencies form a cycle (a module that imports a module that
imports it back, directly or through others), and prints each cycle.

    python3 scripts/check-imports.py            # the check (CI runs it)
    python3 scripts/check-imports.py --graph    # also prints every module's dependencies
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def modules():
    found = {}
    for dirpath, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                found[module_of(path)] = path
    return found


def code_of(path):
    """The file's text without comments, strings and its test module."""
    text = open(path, encoding="utf-8").read()
    test = re.search(r"^#\[cfg\(test\)\]\s*\n(pub(\([a-z]+\))? )?mod \w+ \{", text, re.M)
    if test:
        text = text[: test.start()]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return text


def resolve(known, start, parts):
    """The longest prefix of `start + parts` that is a module."""
    path = list(start) + parts
    while path and tuple(path) not in known:
        path.pop()
    return tuple(path)


def paths_in(code):
    """Every path the code names from `crate`, `super` or `self`, expanding `use` groups."""
    found = []
    for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", code, re.S):
        found.extend(expand(re.sub(r"\s+", "", m.group(1))))
    without_uses = re.sub(r"\buse\s+[^;]*;", "", code, flags=re.S)
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", without_uses):
        found.append(m.group(1))
    return found


def expand(tree):
    """`a::{b, c::{d}}` into `a::b`, `a::c::d`."""
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for part in parts:
        if part:
            out.extend(expand(prefix + part))
    return out


def reexports(known):
    """The crate root's `pub use a::b::Name;` items: `Name` -> the module `a::b`."""
    found = {}
    for p in paths_in(code_of(os.path.join(ROOT, "lib.rs"))):
        parts = p.split("::")
        if parts[0] == "self":
            parts = parts[1:]
        if len(parts) >= 2 and parts[-1] not in ("*",):
            found[parts[-1].split("as")[0]] = resolve(known, (), parts[:-1])
    return found


def dependencies(known, roots, module, path):
    deps = set()
    for p in paths_in(code_of(path)):
        head = p.split("::")[0]
        rest = p.split("::")[1:]
        if head == "crate":
            base = ()
        elif head == "super":
            base = module[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        else:  # self
            base = module
        target = resolve(known, base, rest)
        if target == () and head == "crate" and rest and rest[0] in roots:
            target = roots[rest[0]]
        # The crate root only declares modules and re-exports their items; a path through
        # it names the item's own module only by its re-export, which is not a cycle.
        if target in (module, ()) or module == ():
            continue
        deps.add(target)
    return deps


def cycles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def name(module):
    return "::".join(("crate",) + module)


def main():
    known = modules()
    roots = reexports(known)
    graph = {m: dependencies(known, roots, m, p) for m, p in known.items()}
    if "--graph" in sys.argv:
        for m in sorted(graph):
            print(f"{name(m)} -> {', '.join(name(d) for d in sorted(graph[m])) or '-'}")
    found = cycles(graph)
    for comp in found:
        members = set(comp)
        print(f"cycle: {' , '.join(name(m) for m in comp)}")
        for m in comp:
            back = sorted(d for d in graph[m] if d in members)
            print(f"  {name(m)} imports {', '.join(name(d) for d in back)}")
    if found:
        print(f"{len(found)} import cycle(s) among src/ modules", file=sys.stderr)
        return 1
    print(f"imports run one way: {len(known)} modules, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
