#!/usr/bin/env python3
"""The benchmark's figures as documentation: the one place they are typed.

`make bench` (bench/bench.py --docs docs/bench-results.md --readme README.md) calls write()
with its results; the page and the README's table are generated, dated, and name the machine
and the command. Rerun on a saved run without benchmarking again:

    python3 bench/results_md.py [bench/out/latest.json] [--docs docs/bench-results.md] [--readme README.md]
                                [--add bench/out/load/latest.json]...

--add: the cases of another saved run (one case run alone, e.g. `make bench-load`) put beside
the first run's, replacing its own of the same name; the page and the table say which cases come
from which run, with that run's date, revision and load average.

(the page's full report is then bench/out/latest.txt when it belongs to that run, else the
JSON's summary is rebuilt). Standard library only.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench  # noqa: E402  (TARGETS, INFO_ONLY, TARGET_DESC, verdict)

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

# the README's rows, in this order, then every other bar that failed (the page lists every bar)
README_KEYS = ("kernel_vs_memcpy", "disk_vs_dd", "vs_python_speed", "vs_python_rss", "rss_growth",
               "rss_predicted", "scale_w64_vs_w8", "parts_vs_whole", "merge_vs_whole",
               "part_device_vs_share", "loader_w64_s", "loader_w64_rss_mb", "node_vs_dd", "load_vs_floor",
               "load_vs_peers", "load_cold_vs_dd")
# bench.py arguments that say where, not what: left out of the command shown
PATH_ARGS = ("--build", "--python", "--data", "--disk-dir", "--shm", "--out", "--docs", "--readme")


def machine(m):
    isa = "/".join(m.get("isa") or []) or "no AVX2"
    return (f"{m.get('cpu') or 'unknown CPU'}, {m.get('nproc')} CPUs ({isa}), "
            f"{(m.get('mem_bytes') or 0) / 2**30:.0f} GiB, Linux {m.get('kernel', '?')}")


def command(m):
    """The bench.py arguments of the run, paths left out."""
    argv = m.get("argv")
    if argv is None:  # a run saved before its argv was recorded: its parsed arguments
        argv = []
        for k, v in (m.get("args") or {}).items():
            if isinstance(v, list):
                v = ",".join(str(x) for x in v)
            argv += [f"--{k.replace('_', '-')}", str(v)]
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        name = x.split("=", 1)[0]
        if name in PATH_ARGS:
            skip = "=" not in x
            continue
        out.append(x if x and all(c.isalnum() or c in "-_.,:=/" for c in x) else repr(x))
    return "bench/bench.py " + " ".join(out)


def rows(res, keys=None):
    """[(description, verdict, worst, all items)] for every target the run measured."""
    targ = res.get("targets") or {}
    out = []
    for key, lim in list(bench.TARGETS.items()) + list(bench.INFO_ONLY.items()):
        if keys is not None and key not in keys:
            continue
        items = targ.get(key)
        if not items:
            continue
        worst, ok, field = bench.verdict(key, items)
        tag = ("PASS" if ok else "FAIL") if key in bench.TARGETS else "info"
        name = lambda x: (x.get("op") or x.get("model") or x.get("what") or "").strip()
        out.append((bench.TARGET_DESC[key] % lim, tag, f"{worst[field]:.2f} {name(worst)}".strip(),
                    ", ".join(f"{name(x)} {x[field]:.2f}".strip() for x in items)))
    if keys is not None:
        order = {k: i for i, k in enumerate(keys)}
        descs = {bench.TARGET_DESC[k] % v: k for k, v in list(bench.TARGETS.items()) + list(bench.INFO_ONLY.items())}
        out.sort(key=lambda r: order[descs[r[0]]])
    return out


def md_cell(s):
    return s.replace("|", "\\|")


def load_line(m):
    s = f"load average {m.get('loadavg_start')} at the start, {m.get('loadavg_end')} at the end"
    for x in m.get("added") or []:
        s += (f"; the {', '.join(x['cases'])} case from a separate run on {(x.get('date') or '?')[:16]}, bfshard "
              f"`{x.get('git', '?')}`, load average {x.get('loadavg_start')} at the start, {x.get('loadavg_end')} at the end")
    return s


def page(res, text):
    m = res.get("meta") or {}
    L = [
        "# Benchmark results",
        "",
        "What this page holds: the figures of the latest `make bench`, written by `bench/bench.py`",
        "(`bench/results_md.py`); do not edit it by hand. How to run the benchmark and what each",
        "case measures: [BENCHMARKS.md](BENCHMARKS.md).",
        "",
        f"- **Date**: {m.get('date', '?')}; bfshard git `{m.get('git', '?')}` (`{m.get('bfshard', '?')}`)",
        f"- **Machine**: {machine(m)}; {load_line(m)}",
        f"- **Command**: `{command(m)}` (what `make bench` ran, paths left out;"
        " [BENCHMARKS.md](BENCHMARKS.md#how-to-run) maps the Makefile's knobs to these arguments)",
        "",
        "## Bars",
        "",
        "The worst measured item of each bar (lower or higher is better as the bar says); every item in the last column.",
        "",
        "| bar | verdict | worst | every item |",
        "|---|---|---|---|",
    ]
    r = rows(res)
    for desc, tag, worst, every in r:
        L.append(f"| {md_cell(desc)} | {tag} | {md_cell(worst)} | {md_cell(every)} |")
    if not r:
        L.append("| (no bar was measured) | | | |")
    L += ["", "## Full report", "", "The run's own summary (`bench/out/latest.txt`):", "", "```", text.rstrip("\n"), "```", ""]
    return "\n".join(L)


def readme_table(res, docs_link):
    m = res.get("meta") or {}
    L = [BEGIN,
         f"Latest `make bench` ({(m.get('date') or '?')[:10]}, bfshard `{m.get('git', '?')}`; {machine(m)}; "
         f"{load_line(m)}). Every figure and the command: [{docs_link}]({docs_link}).",
         "",
         "| bar | verdict | worst |",
         "|---|---|---|"]
    r = rows(res, README_KEYS)
    shown = {x[0] for x in r}
    r += [x for x in rows(res) if x[1] == "FAIL" and x[0] not in shown]  # a failing bar is always shown
    for desc, tag, worst, _ in r:
        L.append(f"| {md_cell(desc)} | {tag} | {md_cell(worst)} |")
    if not r:
        L.append("| (no bar was measured) | | |")
    L.append(END)
    return "\n".join(L)


def replace_region(text, region):
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"bench: no '{BEGIN}' ... '{END}' region to rewrite")
    return text[:i] + region + text[j + len(END):]


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def write(res, text, docs="", readme=""):
    """Writes the page and/or the README region; returns the paths written."""
    done = []
    if docs:
        write_atomic(docs, page(res, text))
        done.append(docs)
    if readme:
        with open(readme) as f:
            old = f.read()
        link = os.path.relpath(docs or os.path.join(ROOT, "docs", "bench-results.md"), os.path.dirname(os.path.abspath(readme)))
        write_atomic(readme, replace_region(old, readme_table(res, link)))
        done.append(readme)
    return done


# a saved run's sections that are not cases
NOT_CASES = ("meta", "targets", "notes", "verdicts")


def add_cases(res, other):
    """other's measured cases into res (replacing res's of the same name); noted in res's meta"""
    cases = [k for k, v in other.items() if k not in NOT_CASES and v]
    for k in cases:
        res[k] = other[k]
    m = other.get("meta") or {}
    res.setdefault("meta", {}).setdefault("added", []).append(
        {"cases": cases, "date": m.get("date"), "git": m.get("git"), "loadavg_start": m.get("loadavg_start"),
         "loadavg_end": m.get("loadavg_end")})
    return cases


def summary_text(res, latest_txt):
    """latest.txt when it is this run's (and nothing was added to it), else the summary rebuilt from
    the JSON (res's targets with it)."""
    date = (res.get("meta") or {}).get("date", "")
    try:
        with open(latest_txt) as f:
            t = f.read()
        if date and date in t.split("\n", 1)[0] and not (res.get("meta") or {}).get("added"):
            return t
    except OSError:
        pass
    import copy
    a = argparse.Namespace(**(res.get("meta") or {}).get("args", {}))
    b = bench.Bench.__new__(bench.Bench)
    b.a, b.res, b.nproc = a, copy.deepcopy(res), (res.get("meta") or {}).get("nproc", 1)
    b.res["targets"], b.res["notes"] = {}, []  # summarize() derives them again
    b.res["notes"] = list(res.get("notes") or [])
    text = b.summarize()
    res["targets"] = b.res["targets"]
    return text


def main():
    ap = argparse.ArgumentParser(description="write the benchmark's results page and README table from a saved run")
    ap.add_argument("json", nargs="?", default=os.path.join(ROOT, "bench", "out", "latest.json"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs", "bench-results.md"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--add", action="append", default=[], help="a saved run whose cases join the first's")
    a = ap.parse_args()
    import json
    with open(a.json) as f:
        res = json.load(f)
    for path in a.add:
        with open(path) as f:
            print(f"{path}: the {', '.join(add_cases(res, json.load(f))) or 'no'} case(s)", file=sys.stderr)
    text = summary_text(res, os.path.join(os.path.dirname(a.json), "latest.txt"))
    for p in write(res, text, docs=a.docs, readme=a.readme):
        print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
