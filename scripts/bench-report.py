#!/usr/bin/env python3
"""Turn one `cargo bench --bench limiters` run (and the memory example's CSV) into Markdown
tables and an SVG chart. Python 3 standard library only.

    cargo bench --bench limiters
    cargo run --release --example memory -- target/memory.csv
    for i in 1 2 3; do cargo run --release --example hot_path > target/hot_path.$i.txt; done
    python3 scripts/bench-report.py --memory target/memory.csv \
        --hot-path target/hot_path.1.txt --hot-path target/hot_path.2.txt \
        --hot-path target/hot_path.3.txt --svg docs/benchmarks.svg --update docs/BENCHMARKS.md

Reads every `<criterion>/**/new/benchmark.json` and the `estimates.json` beside it (the
median's point estimate, ns per iteration). For each group it prints the contestants' medians
and their ratio to governor's median in the same group (and value, for the thread groups):
`time / governor` below 1 and `speed-up` above 1 mean tollgate is faster. With `--update`,
the tables replace whatever sits between `<!-- bench-report:begin -->` and
`<!-- bench-report:end -->` in the given file; otherwise they go to stdout.
"""

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

# Display order of the groups, and the order of contestants inside a group.
GROUPS = [
    ("direct", "direct limiter, allowed (1 thread)"),
    ("direct_denied", "direct limiter, denied (1 thread)"),
    ("keyed_hot_u64", "keyed, one hot u64 key"),
    ("keyed_hot_str", "keyed, one hot String key looked up by &str"),
    ("keyed_many_u64_100k_seq", "keyed, 100k u64 keys, sequential"),
    ("keyed_many_u64_100k_random", "keyed, 100k u64 keys, random order"),
    ("keyed_many_u64_1m_seq", "keyed, 1M u64 keys, sequential"),
    ("keyed_many_u64_1m_random", "keyed, 1M u64 keys, random order"),
    ("keyed_many_string_100k_random", "keyed, 100k 11-byte String keys, random order"),
    ("threads_direct", "threads on one direct limiter (ns per decision of aggregate throughput)"),
    ("threads_one_key", "threads on one key (ns per decision of aggregate throughput)"),
    ("threads_many_keys", "threads on 100k keys (ns per decision of aggregate throughput)"),
    ("algorithms_direct", "algorithms, direct limiter"),
    ("algorithms_keyed_hot", "algorithms, keyed, one hot u64 key"),
    ("evict_1m", "one evict_idle / retain_recent over 1M at-rest keys"),
    ("cached_clock_direct", "direct limiter, both on cached clocks refreshed every 1 ms"),
    ("cached_clock_keyed_hot_str", "keyed, one hot String key, both on cached clocks (1 ms)"),
    ("primitives", "the parts of a decision, timed alone"),
    ("maps_hot_u64", "one hot-key lookup in each map, value read with one load"),
    ("maps_random_u64_100k", "lookups of 100k u64 keys in random order in each map, value read with one load"),
]
CONTESTANTS = [
    "tollgate",
    "tollgate_foldhash",
    "tollgate_token_bucket",
    "tollgate_sliding_log_100",
    "tollgate_sliding_counter",
    "tollgate_one_word",
    "governor",
    "std_mutex",
    "parking_lot",
    "mutex_fast",
    "floor",
    "tollgate_default_clock",
    "governor_default_clock",
]
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"


def default_criterion_dir():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    return str(Path(target) / "criterion")


def load_criterion(root):
    """{(group, value): {function: median_ns}} and the span of the files' times."""
    results, stamps = {}, []
    for meta_path in Path(root).glob("**/new/benchmark.json"):
        est_path = meta_path.with_name("estimates.json")
        if not est_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        est = json.loads(est_path.read_text())
        key = (meta["group_id"], meta.get("value_str") or "")
        results.setdefault(key, {})[meta["function_id"]] = est["median"]["point_estimate"]
        stamps.append(est_path.stat().st_mtime)
    return results, stamps


def load_memory(path):
    if not path or not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fmt_time(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.1f} ns"


def order_key(name):
    return (CONTESTANTS.index(name), "") if name in CONTESTANTS else (len(CONTESTANTS), name)


def value_order(value):
    return (0, int(value)) if value.isdigit() else (1, value)


def markdown(results, memory):
    out = []
    out.append("| case | contestant | median | time / governor | speed-up vs governor |")
    out.append("|---|---|---:|---:|---:|")
    known = [g for g, _ in GROUPS]
    groups = known + sorted({g for g, _ in results} - set(known))
    titles = dict(GROUPS)
    for group in groups:
        values = sorted({v for g, v in results if g == group}, key=value_order)
        for value in values:
            row = results[(group, value)]
            gov = row.get("governor")
            case = f"`{group}`" + (f" {value} thr" if value else "")
            for name in sorted(row, key=order_key):
                ns = row[name]
                median = fmt_time(ns)
                if group.startswith("threads"):
                    median += f" ({1e3 / ns:.1f} Mops/s)"
                if gov:
                    ratio, speed = f"{ns / gov:.2f}", f"{gov / ns:.2f}x"
                else:
                    ratio = speed = "n/a"
                out.append(f"| {case} | {name} | {median} | {ratio} | {speed} |")
                case = ""
    out.append("")
    out.append("Cases: " + "; ".join(f"`{g}`: {t}" for g, t in GROUPS if any(k[0] == g for k in results)) + ".")

    mem = [r for r in memory if r["case"] == "memory"]
    if mem:
        sizes = sorted({int(r["keys"]) for r in mem})
        out.append("")
        out.append("Heap bytes per tracked key (ratio to governor in brackets):")
        out.append("")
        out.append("| limiter | key | " + " | ".join(f"{n // 1000}k" for n in sizes) + " |")
        out.append("|---|---|" + "---:|" * len(sizes))
        gov = {(r["key"], int(r["keys"])): float(r["value"]) for r in mem if r["limiter"].startswith("governor")}
        seen = []
        for r in mem:
            if (r["limiter"], r["key"]) not in seen:
                seen.append((r["limiter"], r["key"]))
        # Keys grouped (u64 first), limiters in the CSV's order within each key.
        for limiter, key in sorted(seen, key=lambda lk: (lk[1] != "u64", lk[1])):
            cells = []
            for n in sizes:
                v = next((float(r["value"]) for r in mem if r["limiter"] == limiter and r["key"] == key and int(r["keys"]) == n), None)
                g = gov.get((key, n))
                if v is None:
                    cells.append("")
                elif g and not limiter.startswith("governor"):
                    cells.append(f"{v:.1f} ({v / g:.2f})")
                else:
                    cells.append(f"{v:.1f}")
            out.append(f"| {limiter} | {key} | " + " | ".join(cells) + " |")
    ev = [r for r in memory if r["case"].startswith("evict")]
    if ev:
        out.append("")
        out.append(f"One sweep over {int(ev[0]['keys']):,} at-rest u64 keys (memory example, one shot):")
        out.append("")
        out.append("| sweep | time | peak heap above start | live heap change |")
        out.append("|---|---:|---:|---:|")
        for limiter in dict.fromkeys(r["limiter"] for r in ev):
            get = {r["case"]: float(r["value"]) for r in ev if r["limiter"] == limiter}
            out.append(
                f"| {limiter} | {get.get('evict_time', float('nan')):.2f} ms | "
                f"{get.get('evict_peak', float('nan')):,.0f} B | {get.get('evict_live_change', float('nan')):,.0f} B |"
            )
    return "\n".join(out) + "\n"


# ---- SVG -------------------------------------------------------------------------------

CHART_CASES = [
    ("direct", "", "direct"),
    ("keyed_hot_u64", "", "hot u64 key"),
    ("keyed_hot_str", "", "hot String by &str"),
    ("keyed_many_u64_100k_random", "", "100k u64, random"),
    ("keyed_many_u64_1m_random", "", "1M u64, random"),
    ("keyed_many_string_100k_random", "", "100k String, random"),
    ("threads_direct", "2", "2 threads, direct"),
    ("threads_one_key", "2", "2 threads, one key"),
    ("threads_many_keys", "2", "2 threads, 100k keys"),
    ("evict_1m", "", "evict 1M keys"),
    ("cached_clock_direct", "", "direct, cached clocks"),
    ("cached_clock_keyed_hot_str", "", "hot String, cached clocks"),
]
COLORS = {
    "tollgate": "#1b7f5f",
    "tollgate_foldhash": "#6cc3a0",
    "governor": "#8a8a8a",
    "parking_lot": "#c98a2b",
    "mutex_fast": "#b5523b",
    "floor": "#3b5fa8",
}


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_chart(results, memory):
    rows = []  # (label, [(contestant, ratio, text)])
    for group, value, label in CHART_CASES:
        row = results.get((group, value))
        if not row or "governor" not in row:
            continue
        gov = row["governor"]
        bars = [(n, row[n] / gov, fmt_time(row[n])) for n in sorted(row, key=order_key) if n in COLORS]
        rows.append((label, bars))
    mem = [r for r in memory if r["case"] == "memory"]
    if mem:
        biggest = max(int(r["keys"]) for r in mem)
        for key, label in [("u64", "bytes/key, u64"), ("String (11 B)", "bytes/key, String")]:
            at = {r["limiter"]: float(r["value"]) for r in mem if r["key"] == key and int(r["keys"]) == biggest}
            gov = next((v for k, v in at.items() if k.startswith("governor")), None)
            tg = at.get("tollgate token-bucket")
            if gov and tg:
                n = f"{biggest // 1000}k" if biggest < 1_000_000 else f"{biggest // 1_000_000}M"
                rows.append((f"{label} ({n})", [("tollgate", tg / gov, f"{tg:.1f} B"), ("governor", 1.0, f"{gov:.1f} B")]))
    if not rows:
        return None

    bar_h, gap, left, right, top = 14, 12, 170, 120, 56
    max_ratio = max(2.0, max(r for _, bars in rows for _, r, _ in bars) * 1.05)
    width = 900
    plot_w = width - left - right
    height = top + sum(len(b) * bar_h + gap for _, b in rows) + 40
    x = lambda ratio: left + plot_w * ratio / max_ratio  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="15" font-weight="bold">tollgate vs governor: median time '
        f"(or bytes) relative to governor, lower is better</text>",
    ]
    legend_x = left
    for name, color in COLORS.items():
        parts.append(f'<rect x="{legend_x}" y="30" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{legend_x + 16}" y="40">{name}</text>')
        legend_x += 24 + 7 * len(name)
    y = top
    for label, bars in rows:
        block = len(bars) * bar_h
        parts.append(f'<text x="{left - 8}" y="{y + block / 2 + 4}" text-anchor="end">{esc(label)}</text>')
        for name, ratio, text in bars:
            w = max(1.0, x(ratio) - left)
            parts.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" fill="{COLORS[name]}">'
                f"<title>{esc(name)}: {esc(text)} ({ratio:.2f}x governor)</title></rect>"
            )
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 4}" font-size="10">{esc(text)} ({ratio:.2f})</text>')
            y += bar_h
        y += gap
    for tick in [t / 2 for t in range(0, int(max_ratio * 2) + 1)]:
        tx = x(tick)
        parts.append(f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{y}" stroke="#ccc" stroke-width="0.5"/>')
        parts.append(f'<text x="{tx:.1f}" y="{y + 14}" text-anchor="middle" font-size="10">{tick:g}x</text>')
    one = x(1.0)
    parts.append(f'<line x1="{one:.1f}" y1="{top - 6}" x2="{one:.1f}" y2="{y}" stroke="#333" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{one + 4:.1f}" y="{y + 28}" font-size="10">governor = 1</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def refuse_disturbed(hot_path_outputs):
    """Exits unless three or more hot_path outputs were given and each says its run was valid:
    a run on a disturbed machine (its floor well above a bare clock read, its repetitions
    spread) gives ratios that do not reproduce, and the docs must not carry them."""
    if len(hot_path_outputs) < 3:
        sys.exit("--update needs three runs of `cargo run --release --example hot_path` from the "
                 "same quiet spell, each given with --hot-path FILE")
    for path in hot_path_outputs:
        verdicts = [line.strip() for line in Path(path).read_text().splitlines()
                    if line.startswith("run: ")]
        if verdicts != ["run: VALID"]:
            found = verdicts[-1] if verdicts else "no `run:` line"
            sys.exit(f"{path}: {found}; refusing to update the docs from a disturbed run")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--criterion", default=default_criterion_dir(), help="criterion output dir (default: $CARGO_TARGET_DIR/criterion or target/criterion)")
    ap.add_argument("--memory", help="CSV written by `cargo run --release --example memory -- FILE`")
    ap.add_argument("--svg", help="write the bar chart here (e.g. docs/benchmarks.svg)")
    ap.add_argument("--update", help="splice the tables into this Markdown file between the bench-report markers")
    ap.add_argument("--hot-path", action="append", default=[], metavar="FILE",
                    help="the output of `cargo run --release --example hot_path` from the same quiet "
                         "spell (give it three times, one per run); --update refuses unless every "
                         "run says `run: VALID`")
    args = ap.parse_args()

    results, stamps = load_criterion(args.criterion)
    if not results:
        sys.exit(f"no criterion results under {args.criterion}: run `cargo bench --bench limiters` first")
    span = (max(stamps) - min(stamps)) / 60
    oldest = time.strftime("%Y-%m-%d %H:%M", time.localtime(min(stamps)))
    if span > 20:
        print(f"warning: results span {span:.0f} minutes (oldest {oldest}); they may mix several runs. "
              f"`rm -rf {args.criterion}` and run once for side-by-side numbers.", file=sys.stderr)
    memory = load_memory(args.memory)
    md = markdown(results, memory)

    if args.update:
        refuse_disturbed(args.hot_path)
        doc = Path(args.update).read_text()
        if BEGIN not in doc or END not in doc:
            sys.exit(f"{args.update} has no {BEGIN} ... {END} markers")
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        Path(args.update).write_text(f"{head}{BEGIN}\n{md}{END}{tail}")
        print(f"updated {args.update}", file=sys.stderr)
    else:
        sys.stdout.write(md)
    if args.svg:
        svg = svg_chart(results, memory)
        if svg:
            Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
            Path(args.svg).write_text(svg)
            print(f"wrote {args.svg}", file=sys.stderr)


if __name__ == "__main__":
    main()
