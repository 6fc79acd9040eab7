#!/usr/bin/env python3
"""Every code block in README.md and docs/*.md pastes: a reader who copies a block into a
project with the dependencies the same file names gets code that compiles, or is told that
the block is a fragment. Python 3 standard library only; run from anywhere:

    python3 scripts/check-doc-blocks.py [FILE.md ...]

Without arguments it checks README.md and docs/*.md. It exits 1 and names each block that
breaks a rule below (file, line of the opening fence, rule), 0 when all pass. Each run first
checks the rules themselves on blocks made to break them (`SELF_TEST`), and exits 2 if one
no longer fires. The Rust blocks
themselves are compiled by `cargo test --doc --all-features`: src/lib.rs includes each of these
files as a doc comment under `cfg(doctest)`. This script checks what rustdoc does not: that
what rustdoc compiles is what a reader sees and pastes.

Conventions
-----------

* **Every fence names its language**: ```rust, ```toml, ```sh, ```text, ```json, ... A fence
  with no tag fails (rustdoc compiles it as Rust; a reader cannot tell what it is), and so does
  one that starts with a rustdoc attribute (```ignore, ```no_run): write ```rust,ignore.
* **```rust**: a whole program (with `fn main`) or whole items (`use`, `fn`, `struct`, ...),
  compiled and run as a doc test. It must paste as shown:
  - no hidden lines: rustdoc hides a line that starts with `# ` (or is `#` alone), so the test
    compiles code the reader never sees. Write the `fn main` out instead.
  - without `fn main`, items only: a statement at the top level (`let x = ...;`) compiles as a
    doc test only because rustdoc wraps the block in a `main` of its own.
* **```rust,no_run**: compiled, never run, for a block that needs what a test machine does
  not have: a Redis server, a socket to listen on (a block that shows one must be `no_run`). The block must show it (`redis://`,
  `TcpListener`, `serve(`), or the nearest non-blank line above it must say why with the
  words "not run".
* **```rust,ignore**: a fragment, neither compiled nor run. The nearest non-blank line above
  the fence must say so with the word "fragment" (for example "A fragment of a handler:").
* Any other attribute on a Rust block (`should_panic`, `compile_fail`, `edition2021`, ...)
  fails: add it to this list, with its rule, first.
* **Crates**: a crate that a compiled block names at the start of a path (`use axum::...`,
  `#[tokio::main]`) must be `std`, `core`, `alloc`, `tollgate`, or a dependency that the same
  file names in a ```toml block. The crate's own dev-dependencies let the doc test compile,
  but a reader has only what the docs told them to add.
* **Covered**: each file with a compiled Rust block is included by src/lib.rs
  (`include_str!("../<file>")`), so the doc tests compile it.
* **Examples listed**: every `examples/*.rs` is named in README.md's "Layout" section.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# rustdoc's code block attributes: a fence whose first word is one of these is Rust to rustdoc.
RUSTDOC_ATTRIBUTES = {
    "ignore",
    "no_run",
    "should_panic",
    "compile_fail",
    "test_harness",
    "standalone_crate",
}
ALLOWED_RUST_ATTRIBUTES = {"", "no_run", "ignore"}
BUILTIN_CRATES = {"std", "core", "alloc", "tollgate", "crate", "self", "super"}
# Primitive types whose associated items are written as paths (`u64::MAX`, `str::from_utf8`).
PRIMITIVES = {
    "bool", "char", "str", "f32", "f64",
    "i8", "i16", "i32", "i64", "i128", "isize",
    "u8", "u16", "u32", "u64", "u128", "usize",
}
# What a `no_run` block shows that a test machine lacks.
NEEDS_A_SERVER = ("redis://", "TcpListener", "serve(")
# The first word of a top-level line that starts or continues an item (never a statement).
ITEM_STARTS = re.compile(
    r"^(pub(\([^)]*\))?\s+|async\s+|const\s+|unsafe\s+|extern\s+)*"
    r"(use|fn|struct|enum|union|impl|trait|mod|const|static|type|macro_rules!|extern)\b"
)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
HIDDEN = re.compile(r"^\s*#(\s|$|#)")
MAIN = re.compile(r"^\s*(pub\s+)?(async\s+)?fn\s+main\s*\(", re.M)
CRATE_PATH = re.compile(r"(?<![\w:.])([a-z_][a-z0-9_]*)::(?!<)")
TOML_DEPENDENCY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


class Block:
    def __init__(self, path, line, info, body, before):
        self.path = path
        self.line = line  # 1-based line of the opening fence
        words = [w for w in re.split(r"[,\s]+", info.strip()) if w]
        self.lang = words[0] if words else ""
        self.attributes = words[1:]
        self.body = body
        self.before = before  # the nearest non-blank line above the fence

    def where(self):
        return f"{shown(self.path)}:{self.line}"


def shown(path):
    """`path` as a message names it: from the repository's root when it is inside."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def blocks(path, text=None):
    """The fenced code blocks of a Markdown file (or of `text`, named `path`), in order."""
    if text is None:
        text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.groups()
        before = next((l for l in reversed(lines[:i]) if l.strip()), "")
        body = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (
                closing
                and closing.group(2)[0] == fence[0]
                and len(closing.group(2)) >= len(fence)
                and not closing.group(3).strip()
            ):
                break
            # Inside a list item the block is indented with it; the reader pastes it without.
            line = lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        found.append(Block(path, i + 1, info, body, before))
        i = j + 1
    return found


def code_only(text):
    """`text` with comments, string and char literals blanked out, lines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not text[i - 1].isalnum()):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'\n])'", text[i:]):
            literal = re.match(r"'(\\.[^']*|[^\\'\n])'", text[i:]).group(0)
            out.append(" " * len(literal))
            i += len(literal)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def top_level_statements(code):
    """Lines that start something other than an item at the top level of `code`."""
    found = []
    depth = 0
    ended = True  # the previous top-level item or statement is complete
    for number, line in enumerate(code.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if depth == 0 and ended:
            starts_item = (
                ITEM_STARTS.match(stripped)
                or stripped.startswith(("#[", "#!["))
                or stripped[0] in "})]"
            )
            if not starts_item:
                found.append((number, stripped))
        for c in stripped:
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth = max(depth - 1, 0)
        if depth == 0:
            # An attribute line leaves its item to come; `;` and `}` complete one.
            ended = stripped[-1] in ";}" and not stripped.startswith("#")
    return found


def named_dependencies(file_blocks):
    """The crates the file's ```toml blocks add, as Rust names them."""
    names = set()
    for block in file_blocks:
        if block.lang != "toml":
            continue
        section = "dependencies"
        for line in block.body:
            header = re.match(r"^\s*\[([^\]]+)\]", line)
            if header:
                section = header.group(1).strip()
                continue
            dependency = TOML_DEPENDENCY.match(line)
            if dependency and section.endswith("dependencies"):
                names.add(dependency.group(1).replace("-", "_"))
    return names


def check_block(block, dependencies):
    """The rules `block` breaks, as messages."""
    if block.lang == "":
        return ["fence without a language: tag it (```rust, ```text, ```sh, ...)"]
    if block.lang in RUSTDOC_ATTRIBUTES or block.lang.startswith("edition"):
        return [f"fence starts with the rustdoc attribute `{block.lang}`: write ```rust,{block.lang}"]
    if block.lang != "rust":
        return []
    problems = []
    attribute = ",".join(block.attributes)
    if attribute not in ALLOWED_RUST_ATTRIBUTES:
        problems.append(
            f"```rust,{attribute}: only ```rust, ```rust,no_run and ```rust,ignore are allowed"
        )
        return problems
    text = "\n".join(block.body)
    for offset, line in enumerate(block.body, 1):
        if HIDDEN.match(line):
            problems.append(
                f"line {block.line + offset}: `{line.strip()}` is a hidden line in rustdoc, shown "
                "when pasted; write the code out (a `fn main` instead of `# fn main`)"
            )
    if attribute == "ignore":
        if "fragment" not in block.before.lower():
            problems.append(
                "```rust,ignore without a reason: the nearest line above must call it a fragment"
            )
        return problems
    shows_server = any(marker in text for marker in NEEDS_A_SERVER)
    if attribute == "" and shows_server:
        problems.append(
            "a block that needs a server (Redis, a socket to listen on) must be ```rust,no_run: "
            "the doc tests compile it and cannot run it"
        )
    if attribute == "no_run":
        if not shows_server and "not run" not in block.before.lower():
            problems.append(
                "```rust,no_run without a reason: the block needs no server it shows "
                f"({', '.join(NEEDS_A_SERVER)}) and the line above does not say why it is not run"
            )
    code = code_only(text)
    if not MAIN.search(code):
        for number, line in top_level_statements(code):
            problems.append(
                f"line {block.line + number}: `{line}` is a statement outside any function; "
                "rustdoc wraps the block in a main, a pasted file does not: write `fn main`"
            )
    # A `use` names a crate by its first segment; what it imports (`thread` of
    # `use std::thread;`, `routing` of `use axum::{routing::get}`) is then a local name.
    uses = re.findall(r"\buse\s+([^;]*);", code)
    local = set(re.findall(r"\bmod\s+([a-z_][a-z0-9_]*)", code))
    for tree in uses:
        local.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tree))
    used = {re.match(r"\s*(?:::)?([A-Za-z_][A-Za-z0-9_]*)", tree).group(1) for tree in uses}
    rest = re.sub(r"\buse\s+[^;]*;", "", code)
    used |= set(CRATE_PATH.findall(rest)) - local
    used -= BUILTIN_CRATES | PRIMITIVES
    for crate in sorted(used - dependencies):
        problems.append(
            f"uses the crate `{crate}`, which no ```toml block of this file adds: name it there "
            "or use it through a crate that is named"
        )
    return problems


def check_coverage(path, file_blocks, lib_rs):
    compiled = [b for b in file_blocks if b.lang == "rust" and "ignore" not in b.attributes]
    include = f'include_str!("../{shown(path)}")'
    if compiled and include not in lib_rs:
        return [f"{shown(path)}: its Rust blocks are not compiled: src/lib.rs has no "
                f"`#[doc = {include}]` under cfg(doctest)"]
    return []


def check_examples_listed(readme):
    """Every example in examples/ is named in the README's Layout section."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    if not section:
        return ["README.md: no \"## Layout\" section to list the examples in"]
    problems = []
    for example in sorted((ROOT / "examples").glob("*.rs")):
        if f"examples/{example.name}" not in section.group(1):
            problems.append(
                f"README.md: the Layout section does not name examples/{example.name}"
            )
    return problems


# Each rule on a block that breaks it, and a part of the message it must give: run first on
# every check, so a rule that stops firing fails the run instead of passing everything.
SELF_TEST = [
    ("```\nuntagged\n```", "without a language"),
    ("```no_run\nfn main() {}\n```", "write ```rust,no_run"),
    ("```rust\nfn main() {}\n# fn hidden() {}\n```", "hidden line"),
    ("```rust\nuse std::fmt;\nlet x = 1;\n```", "statement outside any function"),
    ("Some text.\n\n```rust,ignore\nfoo();\n```", "without a reason"),
    ("```rust,no_run\nfn main() {}\n```", "without a reason"),
    ("```rust,should_panic\nfn main() {}\n```", "only ```rust"),
    ("```rust\nfn main() { let _ = \"redis://h\"; }\n```", "must be ```rust,no_run"),
    ("```rust\nfn main() { serde_json::json!(1); }\n```", "crate `serde_json`"),
]
# Blocks that follow the rules: items only, a multi-line signature, strings that look like
# code, a named fragment, a server shown, a crate the file adds, a use tree.
SELF_TEST_PASSES = """
```toml
[dependencies]
tokio = "1"
```

```rust
use std::{fmt, thread};
#[derive(Debug)]
struct A {
    a: u8,
}
fn helper(x: u8)
    -> u8
{
    thread::yield_now();
    x
}
const S: &str = "let x = 1; serde::x";
```

A fragment of a handler:

```rust,ignore
foo();
```

```rust,no_run
#[tokio::main]
async fn main() {
    let _ = "redis://127.0.0.1";
}
```
"""


def self_test():
    """The rules' failures, each checked on a block made to break it."""
    failures = []
    for text, expected in SELF_TEST:
        (block,) = blocks(Path("self-test.md"), text)
        problems = check_block(block, set())
        if not any(expected in p for p in problems):
            failures.append(f"self-test: {text!r} should fail with {expected!r}, got {problems}")
    good = blocks(Path("self-test.md"), SELF_TEST_PASSES)
    for block in good:
        for problem in check_block(block, named_dependencies(good)):
            failures.append(f"self-test: block at line {block.line} should pass: {problem}")
    return failures


def main(argv):
    failures = self_test()
    if failures:
        print("\n".join(failures))
        print("the checker's own rules are broken: fix scripts/check-doc-blocks.py")
        return 2
    paths = [Path(a).resolve() for a in argv] or [ROOT / "README.md"] + sorted(
        (ROOT / "docs").glob("*.md")
    )
    lib_rs = (ROOT / "src" / "lib.rs").read_text(encoding="utf-8")
    problems = []
    checked = 0
    for path in paths:
        file_blocks = blocks(path)
        dependencies = named_dependencies(file_blocks)
        for block in file_blocks:
            checked += 1
            problems += [f"{block.where()}: {p}" for p in check_block(block, dependencies)]
        problems += check_coverage(path, file_blocks, lib_rs)
    if not argv:
        problems += check_examples_listed((ROOT / "README.md").read_text(encoding="utf-8"))
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in {checked} code blocks (rules: scripts/check-doc-blocks.py)")
        return 1
    print(f"{checked} code blocks in {len(paths)} files paste as shown")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
