#!/usr/bin/env python3
"""The layering check (`make test` runs it; dev/layers/order is the allowed order).

It derives the file-level dependency graph of src/ and kernels/ from the code itself:
  - includes: every `#include "..."` of every .c/.h/.cu/.cuh, resolved as the compiler
    resolves it (the file's own folder, then -Isrc, -Iinclude);
  - uses: every symbol an object file needs (`nm`, type U) joined to the object that
    defines it, i.e. calls and references to tables, from the objects of BUILD.
and fails, naming the file, the symbol or header and the rule, on
  - a back-edge: a folder using a folder below it in dev/layers/order (or one its
    "FOLDER: A B" line does not name);
  - a cycle between files: two or more files that use each other (within a folder too);
  - a file of src/ or kernels/ in no folder of the order;
  - size: a file over 800 lines, or a function over 150 lines;
  - a file that does not open with a comment, a folder without a README.md.

Usage: check.py [--build BUILD] [--root ROOT] [--order FILE] [--graph]   (exit 0: clean, 1: not)
       check.py --selftest   (proves on a small made-up tree that each rule fails when broken)
Needs python3 (stdlib only) and nm (binutils).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

MAX_FILE_LINES = 800
MAX_FUNC_LINES = 150
SRC_EXT = ('.c', '.cu')
HDR_EXT = ('.h', '.cuh')


def read_order(path):
    """[(folder, allowed set or None)], bottom first."""
    order = []
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            if ':' in line:
                folder, rest = line.split(':', 1)
                order.append((folder.strip(), set(rest.split())))
            else:
                order.append((line, None))
    return order


def may_use(order, a, b):
    """Whether folder a may use folder b."""
    if a == b:
        return True
    idx = {f: i for i, (f, _) in enumerate(order)}
    if a not in idx or b not in idx:
        return False
    allowed = order[idx[a]][1]
    if allowed is not None:
        return b in allowed
    return idx[b] < idx[a]


def strip_c(src):
    """Comments and string/char literals blanked, newlines kept (for brace counting)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * src.count('\n', i, j))
            i = j
        elif src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src[i] in '"\'':
            q, j = src[i], i + 1
            while j < n and src[j] != q and src[j] != '\n':
                j += 2 if src[j] == '\\' else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return ''.join(out)


def long_functions(text):
    """(name, first line, lines) of every top-level brace block that follows `name(...)`."""
    s = strip_c(text)
    res, depth, line, start, name = [], 0, 1, 0, None
    for i, c in enumerate(s):
        if c == '\n':
            line += 1
        elif c == '{':
            if depth == 0:
                m = re.search(r'(\w+)\s*\([^;{}]*\)\s*(?:__attribute__\s*\(\(.*\)\)\s*)?$', s[max(0, i - 600):i])
                name, start = (m.group(1) if m else None), line
            depth += 1
        elif c == '}':
            depth -= 1
            if depth == 0 and name:
                if line - start + 1 > MAX_FUNC_LINES:
                    res.append((name, start, line - start + 1))
                name = None
    return res


def nm_symbols(obj):
    """(defined, undefined) global symbol sets of an object file."""
    out = subprocess.run(['nm', '-P', obj], check=True, capture_output=True, text=True).stdout
    d, u = set(), set()
    for ln in out.splitlines():
        p = ln.split()
        if len(p) < 2:
            continue
        if p[1] == 'U':
            u.add(p[0])
        elif p[1] in 'TDBRVWGS':
            d.add(p[0])
    return d, u


def check(root, order_path, build, echo=print, graph=False):
    order = read_order(order_path)
    folders = [f for f, _ in order]
    errors = []
    files = []
    for dirpath, _, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        if top not in ('src', 'kernels', 'include'):
            continue
        for nm_ in sorted(names):
            if nm_.endswith(SRC_EXT + HDR_EXT):
                rel = os.path.normpath(os.path.join(rel_dir, nm_))
                if os.path.dirname(rel) not in folders:
                    errors.append(f'{rel}: in no folder of {os.path.relpath(order_path, root)}')
                    continue
                files.append(rel)
    files.sort()
    for fo in folders:
        if fo != 'include' and os.path.isdir(os.path.join(root, fo)) and \
                not os.path.exists(os.path.join(root, fo, 'README.md')):
            errors.append(f'{fo}/: no README.md saying what it owns and what it may use')
    fset = set(files)
    folder = {f: os.path.dirname(f) for f in files}
    edges = {}  # (a, b) -> reason

    # includes
    for f in files:
        with open(os.path.join(root, f), errors='replace') as fh:
            text = fh.read()
        for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
            inc = m.group(1)
            for base in (os.path.dirname(f), 'src', 'include'):
                cand = os.path.normpath(os.path.join(base, inc))
                if cand in fset:
                    if cand != f:
                        edges.setdefault((f, cand), f'includes "{inc}"')
                    break
        if not text.lstrip().startswith(('/*', '//')):
            errors.append(f'{f}: does not open with a comment on what it owns')
        # size limits
        n = text.count('\n')
        if n > MAX_FILE_LINES:
            errors.append(f'{f}: {n} lines, over the limit of {MAX_FILE_LINES}')
        if f.endswith(SRC_EXT + HDR_EXT):
            for name, line, cnt in long_functions(text):
                errors.append(f'{f}:{line}: function {name} is {cnt} lines, over the limit of {MAX_FUNC_LINES}')

    # uses, from the objects
    defs, undefs, missing = {}, {}, []
    for f in files:
        if not f.endswith(SRC_EXT):
            continue
        obj = os.path.join(build, f[:-3] + '.cu.o' if f.endswith('.cu') else f[:-2] + '.o')
        if not os.path.exists(obj):
            missing.append(f)
            continue
        d, u = nm_symbols(obj)
        undefs[f] = u
        for s in d:
            defs.setdefault(s, f)
    for f, us in undefs.items():
        for s in sorted(us):
            g = defs.get(s)
            if g and g != f:
                edges.setdefault((f, g), f'calls {s}')

    # the public API: a folder whose line names `include` may call the functions
    # include/*.h declares, wherever the library defines them
    public = set()
    for f in files:
        if folder[f] == 'include':
            with open(os.path.join(root, f), errors='replace') as fh:
                public |= set(re.findall(r'\b(bfs_\w+)\s*\(', strip_c(fh.read())))
    limited = {f: a for f, a in order if a is not None}

    # back-edges between folders
    for (a, b), why in sorted(edges.items()):
        if why.startswith('calls ') and why[6:] in public and 'include' in limited.get(folder[a], ()):
            continue
        if not may_use(order, folder[a], folder[b]):
            errors.append(f'back-edge: {a} {why} ({b}): {folder[a]} may not use {folder[b]}')

    # cycles between files (Tarjan's strongly connected components)
    adj = {}
    for (a, b) in edges:
        adj.setdefault(a, []).append(b)
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, []):
            if w not in index:
                strong(w)
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
                sccs.append(sorted(comp))

    for v in files:
        if v not in index:
            strong(v)
    for comp in sccs:
        cs = set(comp)
        # one cycle through the component's first file, by breadth-first search back to it
        start, prev, todo = comp[0], {}, [comp[0]]
        while todo:
            v = todo.pop(0)
            for w in sorted(adj.get(v, [])):
                if w in cs and w not in prev:
                    prev[w] = v
                    todo.append(w)
        path, v = [start], prev.get(start)
        while v is not None and v != start:
            path.append(v)
            v = prev.get(v)
        path.append(start)
        path.reverse()
        steps = '; '.join(f'{path[i]} {edges[(path[i], path[i + 1])]} ({path[i + 1]})'
                          for i in range(len(path) - 1))
        errors.append(f'cycle between files {", ".join(comp)}: {steps}')

    if graph:  # the folder-level graph, for the README's picture (public calls: `include`)
        fg = {}
        for (a, b), why in edges.items():
            if why.startswith('calls ') and why[6:] in public and 'include' in limited.get(folder[a], ()):
                b = 'include/bfshard.h'
            if folder[a] != os.path.dirname(b):
                fg.setdefault(folder[a], set()).add(os.path.dirname(b))
        for f in folders:
            echo(f'{f} -> {" ".join(sorted(fg.get(f, ()), key=folders.index))}')
    for e in errors:
        echo('layers: ' + e)
    nuse = sum(1 for w in edges.values() if w.startswith('calls'))
    echo(f'layers: {len(files)} files in {len(folders)} folders, {len(edges)} file edges '
         f'({nuse} by calls), {len(errors)} problem(s)'
         + (f'; not built here, includes only: {", ".join(missing)}' if missing else ''))
    return not errors


# ---- the self-test: each rule, broken on purpose in a small tree, must fail ----------------
def selftest():
    cc = os.environ.get('CC', 'cc')
    ok = True

    def tree(files, order):
        d = tempfile.mkdtemp(prefix='bfs-layers-')
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, 'w') as fh:
                fh.write(text)
        for rel in files:
            p = os.path.join(d, rel)
            if rel.endswith('.c'):
                o = os.path.join(d, 'build', rel[:-2] + '.o')
                os.makedirs(os.path.dirname(o), exist_ok=True)
                subprocess.run([cc, '-c', '-I' + os.path.join(d, 'src'), '-I' + os.path.join(d, 'include'), p, '-o', o], check=True)
        with open(os.path.join(d, 'order'), 'w') as fh:
            fh.write(order)
        return d

    base = {
        'src/low/README.md': 'low\n', 'src/high/README.md': 'high\n',
        'src/low/low.h': '/* low */\nint low_f(void);\n',
        'src/low/low.c': '/* low */\n#include "low/low.h"\nint low_f(void) { return 1; }\n',
        'src/high/high.c': '/* high */\n#include "low/low.h"\nint high_f(void) { return low_f(); }\n',
    }
    order = 'src/low\nsrc/high\n'
    cases = [
        ('a clean tree', base, order, True, None),
        ('a call back up', dict(base, **{'src/low/low.c':
            'int high_f(void);\nint low_f(void) { return high_f(); }\n'}), order, False, 'calls high_f'),
        ('an include back up', dict(base, **{'src/high/high.h': 'int high_f(void);\n',
            'src/low/low.c': '#include "high/high.h"\nint low_f(void) { return 1; }\n'}),
            order, False, 'includes "high/high.h"'),
        ('a cycle inside a folder', dict(base, **{
            'src/low/a.c': 'int b_f(void);\nint a_f(void) { return b_f(); }\n',
            'src/low/b.c': 'int a_f(void);\nint b_f(void) { return a_f(); }\n'}), order, False, 'cycle between files'),
        ('a folder not in the order', dict(base, **{'src/other/x.c': 'int x_f(void) { return 0; }\n'}),
            order, False, 'in no folder'),
        ('a long function', dict(base, **{'src/low/long.c':
            'int long_f(int x)\n{\n' + '    x++;\n' * 160 + '    return x;\n}\n'}), order, False, 'function long_f'),
        ('a long file', dict(base, **{'src/low/big.h': '/* x */\n' * 900}), order, False, '900 lines'),
        ('a limited folder', base, 'src/low\nsrc/high: include\n', False, 'src/high may not use src/low'),
        ('a limited folder using the public API', dict(base, **{'include/api.h': '/* api */\nint bfs_api(void);\n',
            'src/low/low.c': '/* low */\nint bfs_api(void) { return 1; }\n',
            'src/high/high.c': '/* high */\n#include "api.h"\nint high_f(void) { return bfs_api(); }\n'}),
            'include\nsrc/low\nsrc/high: include\n', True, None),
        ('a file without its opening comment', dict(base, **{'src/low/bare.c': 'int bare_f(void) { return 0; }\n'}),
            order, False, 'does not open with a comment'),
        ('a folder without its README', {k: v for k, v in base.items() if k != 'src/high/README.md'},
            order, False, 'no README.md'),
    ]
    for name, files, ordr, want, needle in cases:
        d = tree(files, ordr)
        lines = []
        got = check(d, os.path.join(d, 'order'), os.path.join(d, 'build'), echo=lines.append)
        shutil.rmtree(d)
        good = got == want and (needle is None or any(needle in ln for ln in lines))
        print(f'layers selftest: {"ok  " if good else "FAIL"} {name}' + ('' if good else ': ' + ' | '.join(lines)))
        ok = ok and good
    return ok


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default=os.path.dirname(os.path.dirname(here)))
    ap.add_argument('--build', default='build')
    ap.add_argument('--order', default=os.path.join(here, 'order'))
    ap.add_argument('--selftest', action='store_true')
    ap.add_argument('--graph', action='store_true', help='also print which folders each folder uses')
    a = ap.parse_args()
    if a.selftest:
        return 0 if selftest() else 1
    build = a.build if os.path.isabs(a.build) else os.path.join(a.root, a.build)
    return 0 if check(a.root, a.order, build, graph=a.graph) else 1


if __name__ == '__main__':
    sys.exit(main())
