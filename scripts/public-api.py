#!/usr/bin/env python3
"""The crate's public API, one line per item, checked against the committed api/public-api.txt.

Every path a user can name (modules, types, traits, functions, constants, macros, and what
the root and the modules re-export), every public method and associated constant of a
public type with its signature, every field of a public struct or variant of a public enum,
and every trait a public type implements (auto traits and blanket impls left out), with
every feature on. Any change to the public API is then a visible diff in review, and the
CHANGELOG says why.

    python3 scripts/public-api.py            # compare with api/public-api.txt (CI runs it)
    python3 scripts/public-api.py --update   # rewrite api/public-api.txt from the code

It reads rustdoc's JSON output, which needs a nightly toolchain (`cargo +nightly rustdoc
... --output-format json`); the stable toolchain builds and tests everything else. The JSON
format is versioned: a format this script does not know fails loudly rather than listing
something else.
"""

import difflib
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SNAPSHOT = os.path.join(ROOT, "api", "public-api.txt")
TARGET = os.environ.get("PUBLIC_API_TARGET_DIR", os.path.join(ROOT, "target", "public-api"))
# rustdoc JSON format versions whose shape this script reads.
KNOWN_FORMATS = range(50, 60)


def build():
    env = dict(os.environ, CARGO_TARGET_DIR=TARGET, RUSTDOCFLAGS="")
    cmd = [
        "cargo", "+nightly", "rustdoc", "--lib", "--all-features", "--quiet", "--",
        "-Z", "unstable-options", "--output-format", "json",
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    with open(os.path.join(TARGET, "doc", "tollgate.json"), encoding="utf-8") as f:
        return json.load(f)


class Api:
    def __init__(self, doc):
        if doc["format_version"] not in KNOWN_FORMATS:
            sys.exit(f"rustdoc JSON format {doc['format_version']} is not one this script reads "
                     f"({KNOWN_FORMATS.start} to {KNOWN_FORMATS.stop - 1}): update it")
        self.index = doc["index"]
        self.lines = set()
        self.seen = set()

    def item(self, id_):
        return self.index.get(str(id_))

    # -- types and signatures -------------------------------------------------------------

    def ty(self, t):
        if t is None:
            return "()"
        (kind, v), = t.items()
        if kind == "primitive":
            return v
        if kind == "generic":
            return v
        if kind == "resolved_path":
            return v["path"].split("::")[-1] + self.args(v.get("args"))
        if kind == "borrowed_ref":
            life = f"{v['lifetime']} " if v.get("lifetime") else ""
            return f"&{life}{'mut ' if v['is_mutable'] else ''}{self.ty(v['type'])}"
        if kind == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ")"
        if kind == "slice":
            return f"[{self.ty(v)}]"
        if kind == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if kind == "impl_trait":
            return "impl " + " + ".join(self.bound(b) for b in v)
        if kind == "dyn_trait":
            return "dyn " + " + ".join(
                p["trait"]["path"].split("::")[-1] + self.args(p["trait"].get("args"))
                for p in v["traits"])
        if kind == "qualified_path":
            return f"<{self.ty(v['self_type'])}>::{v['name']}"
        if kind == "raw_pointer":
            return f"*{'mut' if v['is_mutable'] else 'const'} {self.ty(v['type'])}"
        if kind == "function_pointer":
            return "fn(" + ", ".join(self.ty(x[1]) for x in v["sig"]["inputs"]) + ")"
        return kind

    def args(self, a):
        if not a:
            return ""
        if "angle_bracketed" in a:
            parts = []
            for arg in a["angle_bracketed"]["args"]:
                (k, v), = arg.items()
                parts.append(self.ty(v) if k == "type" else (v if isinstance(v, str) else k))
            for c in a["angle_bracketed"].get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding:
                    (_, v), = binding["equality"].items()
                    parts.append(f"{c['name']} = {self.ty(v) if isinstance(v, dict) else v}")
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in a:
            p = a["parenthesized"]
            out = f"({', '.join(self.ty(x) for x in p['inputs'])})"
            return out + (f" -> {self.ty(p['output'])}" if p.get("output") else "")
        return ""

    def bound(self, b):
        if "trait_bound" in b:
            t = b["trait_bound"]["trait"]
            maybe = "?" if b["trait_bound"].get("modifier") == "maybe" else ""
            return maybe + t["path"].split("::")[-1] + self.args(t.get("args"))
        if "outlives" in b:
            return b["outlives"]
        return "?"

    def generics(self, g):
        params = []
        for p in g.get("params", []):
            kind = p["kind"]
            if "lifetime" in kind:
                params.append(p["name"])
            elif "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue
                bounds = [self.bound(b) for b in kind["type"].get("bounds", [])]
                default = kind["type"].get("default")
                text = p["name"] + (": " + " + ".join(bounds) if bounds else "")
                params.append(text + (f" = {self.ty(default)}" if default else ""))
            elif "const" in kind:
                params.append(f"const {p['name']}: {self.ty(kind['const']['type'])}")
        return "<" + ", ".join(params) + ">" if params else ""

    def signature(self, where, name, f):
        """`fn where::name<...>(...) -> ...`, with `const` or `async` in front."""
        sig = f["sig"]
        header = f.get("header", {})
        qualifiers = ("const " if header.get("is_const") else "") + (
            "async " if header.get("is_async") else "")
        ins = []
        for arg_name, t in sig["inputs"]:
            ins.append("self" if arg_name == "self" and self.ty(t) == "Self" else
                       ("&self" if arg_name == "self" and self.ty(t) == "&Self" else
                        ("&mut self" if arg_name == "self" and self.ty(t) == "&mut Self" else
                         f"{arg_name}: {self.ty(t)}")))
        out = f" -> {self.ty(sig['output'])}" if sig.get("output") else ""
        return f"{qualifiers}fn {where}::{name}{self.generics(f['generics'])}({', '.join(ins)}){out}"

    # -- the walk ---------------------------------------------------------------------------

    def add(self, line):
        self.lines.add(line)

    def module(self, path, id_):
        it = self.item(id_)
        self.add(f"mod {path}")
        for child in it["inner"]["module"]["items"]:
            self.named(path, child)

    def named(self, prefix, id_, name=None):
        it = self.item(id_)
        if it is None:
            return
        (kind, inner), = it["inner"].items()
        if kind == "use":
            if inner.get("is_glob"):
                target = self.item(inner["id"]) if inner.get("id") is not None else None
                if target and "module" in target["inner"]:
                    for child in target["inner"]["module"]["items"]:
                        self.named(prefix, child)
                return
            if inner.get("id") is None:
                self.add(f"pub use {prefix}::{inner['name']} (from {inner['source']})")
                return
            self.named(prefix, inner["id"], inner["name"])
            return
        if it.get("visibility") != "public" and name is None:
            return
        name = name or it["name"]
        path = f"{prefix}::{name}"
        if kind == "module":
            if (path, id_) in self.seen:
                return
            self.seen.add((path, id_))
            self.module(path, id_)
        elif kind == "struct":
            self.add(f"struct {path}{self.generics(inner['generics'])}")
            shape = inner["kind"] if isinstance(inner["kind"], dict) else {}
            fields = shape.get("plain", {}).get("fields", []) or shape.get("tuple") or []
            for field in fields:
                f = self.item(field) if field is not None else None
                if f and f.get("visibility") == "public":
                    self.add(f"field {path}::{f['name']}: {self.ty(f['inner']['struct_field'])}")
            self.impls(path, inner["impls"])
        elif kind == "enum":
            self.add(f"enum {path}{self.generics(inner['generics'])}")
            for variant in inner["variants"]:
                v = self.item(variant)
                self.add(f"variant {path}::{v['name']}")
            self.impls(path, inner["impls"])
        elif kind == "trait":
            self.add(f"trait {path}{self.generics(inner['generics'])}")
            for member in inner["items"]:
                m = self.item(member)
                if "function" in m["inner"]:
                    self.add(f"trait {self.signature(path, m['name'], m['inner']['function'])}")
                else:
                    self.add(f"trait item {path}::{m['name']}")
        elif kind == "function":
            self.add(self.signature(prefix, name, inner))
        elif kind == "constant":
            self.add(f"const {path}: {self.ty(inner['type'])}")
        elif kind == "type_alias":
            self.add(f"type {path} = {self.ty(inner['type'])}")
        elif kind in ("macro", "proc_macro"):
            self.add(f"macro {path}")
        else:
            self.add(f"{kind} {path}")

    def impls(self, path, impl_ids):
        for impl_id in impl_ids:
            imp = self.item(impl_id)["inner"]["impl"]
            if imp.get("is_synthetic") or imp.get("blanket_impl") is not None:
                continue
            if imp["trait"] is not None:
                trait = imp["trait"]["path"].split("::")[-1] + self.args(imp["trait"].get("args"))
                self.add(f"impl {trait} for {path}")
                continue
            for member in imp["items"]:
                m = self.item(member)
                if m.get("visibility") != "public":
                    continue
                if "function" in m["inner"]:
                    self.add(self.signature(path, m["name"], m["inner"]["function"]))
                elif "assoc_const" in m["inner"]:
                    self.add(f"const {path}::{m['name']}: {self.ty(m['inner']['assoc_const']['type'])}")


def main():
    doc = build()
    api = Api(doc)
    root = doc["index"][str(doc["root"])]
    for child in root["inner"]["module"]["items"]:
        api.named("tollgate", child)
    text = "\n".join(sorted(api.lines)) + "\n"
    if "--update" in sys.argv:
        os.makedirs(os.path.dirname(SNAPSHOT), exist_ok=True)
        with open(SNAPSHOT, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{len(api.lines)} items written to api/public-api.txt")
        return 0
    try:
        with open(SNAPSHOT, encoding="utf-8") as f:
            committed = f.read()
    except FileNotFoundError:
        committed = ""
    if committed == text:
        print(f"public API unchanged: {len(api.lines)} items (api/public-api.txt)")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        committed.splitlines(keepends=True), text.splitlines(keepends=True),
        "api/public-api.txt (committed)", "public API (the code)"))
    print("\nthe public API differs from api/public-api.txt: if the change is meant, run "
          "`python3 scripts/public-api.py --update`, commit the file, and say in CHANGELOG.md "
          "what changed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
