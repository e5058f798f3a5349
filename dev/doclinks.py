#!/usr/bin/env python3
"""The links between README.md and docs/, checked (`make test` runs it as `make check-docs`).

Fails, naming the file and line, on:
  - a relative link ([text](path), [text](path#anchor), [text](#anchor), [ref]: path) whose
    file does not exist, or whose #anchor is no heading (GitHub's slug) of that page;
  - a mention of a `docs/NAME.md` page that does not exist;
  - a docs/*.md page that no chain of links reaches from README.md (an orphan);
and, with --bfshard BIN:
  - an option of a command's --help (the option table's lines, the usage's "[--x") that
    docs/USAGE.md does not name;
  - README.md's "Exit codes" table, the exit codes `bfshard --help` lists and the man
    page's EXIT STATUS (doc/bfshard.1.scd) not holding the same codes.
Links inside code blocks and code spans are text, not links; http(s) and mailto links are
not followed. `--selftest` breaks each rule in a small made-up tree and must see it fail.
Standard library only.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("convert", "inspect", "verify", "merge", "pack", "compress", "decompress", "extract")

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
DOCS_MENTION = re.compile(r"(?<![\w/.-])docs/[A-Za-z0-9_.-]+\.md\b")


def lines_outside_fences(text):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading's text (github-slugger: lower case, punctuation and
    symbols dropped, spaces to hyphens)."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    t = re.sub(r"<[^>]+>", "", t)  # inline HTML
    out = []
    for ch in t.lower():
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat in ("Mn", "Mc"):
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def anchors(text):
    seen, out = {}, set()
    for _, line in lines_outside_fences(text):
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
        for a in HTML_ANCHOR.findall(line):
            out.add(a)
    return out


def links(text):
    """(line number, target) of every link outside code. A reference definition
    ("[x]: target") cannot interrupt a paragraph: only after a blank line or a heading."""
    prev = ""
    for n, line in lines_outside_fences(text):
        m = REF_DEF.match(line)
        after_break, prev = prev.strip() == "" or HEADING.match(prev) is not None, line
        if m and after_break:
            yield n, m.group(1)
            continue
        bare = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(bare):
            yield n, m.group(1)


def external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


def check_links(root):
    """Dead links and anchors, missing docs/ mentions, orphan pages: a list of problems."""
    problems = []
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    pages = ["README.md"] + docs
    cache = {}

    def read(rel):
        if rel not in cache:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                cache[rel] = f.read()
        return cache[rel]

    edges = {}
    for page in pages:
        text = read(page)
        edges[page] = set()
        for n, target in links(text):
            if external(target):
                continue
            path, _, frag = target.partition("#")
            if path:
                rel = os.path.normpath(os.path.join(os.path.dirname(page), path))
                if rel.startswith(".."):
                    problems.append(f"{page}:{n}: link '{target}' leaves the repository")
                    continue
                if not os.path.exists(os.path.join(root, rel)):
                    problems.append(f"{page}:{n}: dead link '{target}': no file {rel}")
                    continue
            else:
                rel = page
            if rel.endswith(".md"):
                edges[page].add(rel)
                if frag and frag not in anchors(read(rel)):
                    problems.append(f"{page}:{n}: dead link '{target}': {rel} has no heading #{frag}")
        for n, line in lines_outside_fences(text):
            # a link to another project's docs/ is not a mention of ours
            line = INLINE_LINK.sub(lambda m: " " if external(m.group(1)) else m.group(0), line)
            for m in DOCS_MENTION.finditer(line):
                if not os.path.exists(os.path.join(root, m.group(0))):
                    problems.append(f"{page}:{n}: '{m.group(0)}' does not exist")
    reached, todo = {"README.md"}, ["README.md"]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    for d in docs:
        if d not in reached:
            problems.append(f"{d}: orphan page: no chain of links reaches it from README.md")
    return problems


def help_options(text):
    """The options a --help text documents: those that begin a line of its option table
    ("  -T, --threads N"), and its usage lines' "[--x ...]"."""
    opts = set()
    usage = True
    for line in text.split("\n"):
        if usage and (line.startswith("usage:") or line.startswith("       ")):
            opts.update(re.findall(r"\[(--?[a-zA-Z][a-z0-9-]*)", line))
            continue
        usage = False
        m = re.match(r"^  (-[^ ].*)", line)
        if m:
            head = re.split(r"\s{2,}", m.group(1))[0]
            opts.update(re.findall(r"(?<![\w-])(--?[a-zA-Z][a-z0-9-]*)", head))
    return opts


def named(opt, text):
    return re.search(r"(?<![\w-])" + re.escape(opt) + r"(?![\w-])", text) is not None


def readme_exit_codes(text):
    codes, inside = [], False
    for _, line in lines_outside_fences(text):
        if HEADING.match(line):
            inside = slug(HEADING.match(line).group(2)) == "exit-codes"
            continue
        m = re.match(r"^\|\s*(\d+)\s*\|", line) if inside else None
        if m:
            codes.append(int(m.group(1)))
    return codes


def help_exit_codes(text):
    i = text.find("exit codes:")
    if i < 0:
        return []
    block = text[i + len("exit codes:"):]
    return [int(x) for x in re.findall(r"(?:^|[ ,])(\d+) (?=[a-zA-Z])", block)]


def man_exit_codes(text):
    m = re.search(r"^# EXIT STATUS\n(.*?)(?=^# )", text, re.S | re.M)
    return [int(x) for x in re.findall(r"^\*(\d+)\*\s*$", m.group(1), re.M)] if m else []


def check_cli(root, bfshard):
    problems = []
    with open(os.path.join(root, "docs", "USAGE.md"), encoding="utf-8") as f:
        usage = f.read()

    def run(*args):
        return subprocess.run([bfshard, *args], capture_output=True, text=True, check=False).stdout

    for c in COMMANDS:
        for opt in sorted(help_options(run(c, "--help"))):
            if opt in ("-h", "--help"):
                continue
            if not named(opt, usage):
                problems.append(f"docs/USAGE.md: 'bfshard {c} --help' has {opt}, this page does not name it")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = readme_exit_codes(f.read())
    helped = help_exit_codes(run("--help"))
    with open(os.path.join(root, "doc", "bfshard.1.scd"), encoding="utf-8") as f:
        man = man_exit_codes(f.read())
    if not readme:
        problems.append("README.md: no '## Exit codes' table")
    if readme != sorted(set(readme)):
        problems.append(f"README.md: exit codes not in order or twice: {readme}")
    if sorted(set(helped)) != sorted(set(readme)):
        problems.append(f"README.md's exit codes {sorted(set(readme))} != 'bfshard --help' {sorted(set(helped))}")
    if sorted(set(man)) != sorted(set(readme)):
        problems.append(f"README.md's exit codes {sorted(set(readme))} != doc/bfshard.1.scd's EXIT STATUS {sorted(set(man))}")
    return problems


# ---- self-test: each rule broken on purpose must be caught ----
GOOD = {
    "README.md": "# T\n\n## Exit codes\n\n| code | meaning |\n|---|---|\n| 0 | ok |\n| 2 | usage |\n\n"
                 "[usage](docs/USAGE.md), [a](docs/A.md#a-heading-with-code-x), see `docs/A.md`,\n"
                 "  [512, 256]: not a definition; [`docs/spec.md`](https://example.org/docs/spec.md).\n"
                 "```\n[not a link](NOPE.md)\n```\nand `[code](NOPE.md)`\n",
    "docs/USAGE.md": "# Usage\n\nWhat it covers.\n\n| `--world-size W`, `-w W` | ranks |\n| `--json` | json |\n",
    "docs/A.md": "# A\n\n## A heading with `code`: x\n\n[back](../README.md#exit-codes), [b](B.md), [self](#a)\n",
    "docs/B.md": "# B\n\n[a](A.md#a-heading-with-code-x)\n",
    "doc/bfshard.1.scd": "# NAME\n\n# EXIT STATUS\n\n*0*\n\tok\n\n*2*\n\tusage\n\n# SEE ALSO\n",
}
HELP = ("usage: bfshard COMMAND\n\nexit codes: 0 ok, 2 usage\n",
        "usage: bfshard convert INPUT OUTDIR [--json]\n\n  --world-size W, -w W   ranks\n")


def selftest():
    def tree(files, helps=HELP):
        d = tempfile.mkdtemp(prefix="doclinks-")
        for k, v in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(k)), exist_ok=True)
            with open(os.path.join(d, k), "w") as f:
                f.write(v)
        b = os.path.join(d, "fake-bfshard")
        with open(b, "w") as f:
            f.write("#!/bin/sh\nif [ \"$1\" = --help ]; then cat <<'E'\n%sE\nelse cat <<'E'\n%sE\nfi\n" % helps)
        os.chmod(b, 0o755)
        return d, b

    def run(files, helps=HELP):
        d, b = tree(files, helps)
        try:
            return check_links(d) + check_cli(d, b)
        finally:
            shutil.rmtree(d)

    fails = 0
    got = run(GOOD)
    print(("ok  " if not got else "BAD ") + "a good tree passes" + ("" if not got else f": {got}"))
    fails += bool(got)
    cases = [
        ("a dead file link", {"README.md": GOOD["README.md"] + "[x](docs/GONE.md)\n"}, "dead link 'docs/GONE.md'"),
        ("a dead anchor", {"docs/B.md": "# B\n\n[a](A.md#no-such)\n"}, "has no heading #no-such"),
        ("a dead same-page anchor", {"docs/A.md": GOOD["docs/A.md"] + "[s](#nowhere)\n"}, "#nowhere"),
        ("an orphan page", {"docs/C.md": "# C\n\n[r](../README.md)\n"}, "docs/C.md: orphan page"),
        ("a page reached only from an orphan", {"docs/C.md": "# C\n\n[b](B.md)\n",
                                                "docs/A.md": "# A\n\n## A heading with `code`: x\n"},
         "docs/B.md: orphan page"),
        ("a missing docs/ mention", {"docs/B.md": "# B\n\n[a](A.md) and docs/GONE.md\n"}, "'docs/GONE.md' does not exist"),
        ("an option --help has and USAGE.md lacks", {"docs/USAGE.md": "# Usage\n\n`--world-size W` `--json`\n"},
         "has -w, this page"),
        ("an exit code only --help has", {}, "!= 'bfshard --help'",
         ("usage: bfshard COMMAND\n\nexit codes: 0 ok, 2 usage, 3 bad input\n", HELP[1])),
        ("an exit code only the man page has", {"doc/bfshard.1.scd": GOOD["doc/bfshard.1.scd"].replace("# SEE", "*9*\n\tx\n\n# SEE")},
         "EXIT STATUS"),
    ]
    for case in cases:
        what, change, want = case[:3]
        helps = case[3] if len(case) > 3 else HELP
        got = run({**GOOD, **change}, helps)
        ok = any(want in p for p in got)
        print(("ok  " if ok else "BAD ") + what + ("" if ok else f": wanted '{want}', got {got}"))
        fails += not ok
    if fails:
        print(f"FAILED: {fails} self-test case(s)")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--bfshard", help="also check docs/USAGE.md's options and the exit codes against this binary")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    problems = check_links(a.root)
    if a.bfshard:
        problems += check_cli(a.root, a.bfshard)
    pages = 1 + sum(f.endswith(".md") for f in os.listdir(os.path.join(a.root, "docs")))
    for p in problems:
        print(f"doclinks: {p}", file=sys.stderr)
    if problems:
        print(f"FAILED: {len(problems)} documentation problem(s) (dev/doclinks.py)", file=sys.stderr)
        return 1
    print(f"doclinks: README.md and {pages - 1} docs pages: every relative link and anchor alive, no orphan"
          + (", options and exit codes in step with --help and the man page" if a.bfshard else "") + ", 0 problem(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
