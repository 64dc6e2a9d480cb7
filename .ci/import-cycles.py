#!/usr/bin/env python3
"""Import check of the workspace's Rust sources. Run from the repository root; exits 1 on a finding.

What it checks, in every library crate of the workspace (the CRATES table: the gateway's src/,
loadtest/src/, wire/src/, proto/src/, parsers/src/, fuzz/targets/src/):

1. File cycles: no source file imports (directly or through others) from a file that imports it
   back.
2. Module cycles: the same between sibling modules, a folder counting as one module with
   everything under it. `load/` importing `sim/` while some file of `sim/` imports `load/` is a
   cycle even when no single file closes the loop.
   KNOWN_MODULE_CYCLES lists the ones that predate this check, each with the work that unties it.
3. Floors: the ground floors of the gateway (FLOORS) import nothing from the floors above them,
   save GROUND (the log macros and the clock), which is below them all. Every path the table names must exist, so the table cannot go stale when a file becomes a
   folder.

An import is a `crate::`/`super::` path (`use` lists included), `use child::...` or `child::f()` in
a mod.rs/lib.rs, or a `crate::warn!`-style log macro (an import of log.rs). `#[cfg(test)] mod tests
{...}` blocks are skipped (test code may reach anywhere), and so are binaries (src/main.rs,
src/bin/): they use their library by its crate name, which cannot close a loop.
"""
import os
import re
import sys

# Library crates: the folder holding lib.rs.
CRATES = ['src', 'loadtest/src', 'wire/src', 'proto/src', 'parsers/src', 'fuzz/targets/src']

# Floors of the gateway: files under the key import nothing from the paths listed, GROUND aside.
FLOORS = {
    'src/http/': ('src/api/', 'src/serve/', 'src/shard.rs', 'src/runtime/', 'src/config/'),
    'src/io.rs': ('src/',),
    'src/clock.rs': ('src/',),
    'src/spare.rs': ('src/',),
    'src/api/': ('src/serve/', 'src/shard.rs', 'src/runtime/'),
    'src/workers/': ('src/http/', 'src/api/', 'src/serve/', 'src/shard.rs', 'src/runtime/'),
}

# Module cycles that predate this check, each with the work that unties it. An entry that no
# longer matches a cycle fails the check too, so it is deleted with the fix. Nothing else goes here.
KNOWN_MODULE_CYCLES = {
}

# Below every floor: the log macros, the clock and the spare buffers (which import nothing
# themselves, by FLOORS).
GROUND = ('src/log.rs', 'src/clock.rs', 'src/spare.rs')

TESTS_BLOCK = re.compile(r'#\[cfg\(test\)\]\s*mod tests \{.*', re.S)
PATH = re.compile(r'\b(crate|super)((?:::\w+)+)')
USE_LIST = re.compile(r'\b(crate|super)((?:::\w+)*)::\{([^}]*)\}')
CHILD_MOD = re.compile(r'^\s*(?:pub(?:\(crate\))? )?mod (\w+);', re.M)
LOG_MACRO = re.compile(r'crate::(warn|info|debug|error)!')


def read_crate(root):
    """{file path: source without its tests block}, binaries left out."""
    files = {}
    for d, _, names in os.walk(root):
        if os.path.relpath(d, root).split(os.sep)[0] == 'bin':
            continue
        for f in names:
            p = os.path.join(d, f)
            if f.endswith('.rs') and p != os.path.join(root, 'main.rs'):
                files[p] = TESTS_BLOCK.sub('', open(p).read())
    return files


def module_path(root, p):
    """src/http/mod.rs -> ('http',); src/http/pool.rs -> ('http', 'pool'); src/lib.rs -> ()."""
    segs = os.path.relpath(p, root)[:-3].split(os.sep)
    return tuple(segs[:-1] if segs[-1] in ('mod', 'lib') else segs)


def file_edges(root, files):
    mods = {module_path(root, p): p for p in files}

    def resolve(segs):
        # The longest prefix that is a module file; items of lib.rs itself are not edges.
        for n in range(len(segs), 0, -1):
            if tuple(segs[:n]) in mods:
                return mods[tuple(segs[:n])]
        return None

    edges = {p: set() for p in files}
    for p, s in files.items():
        me = module_path(root, p)
        # `super` of a mod.rs and of a plain file are both the parent of the module path.
        parent = list(me[:-1])

        def add(segs, base):
            while segs and segs[0] == 'super':
                base, segs = base[:-1], segs[1:]
            t = resolve(base + segs)
            if t and t != p:
                edges[p].add(t)

        for m in PATH.finditer(s):
            # `crate::a::{b, c}` imports a::b and a::c, not a itself: the list does it below.
            if not s.startswith('::{', m.end()):
                add(m.group(2).split('::')[1:], [] if m.group(1) == 'crate' else parent)
        for m in USE_LIST.finditer(s):
            prefix = m.group(2).split('::')[1:]
            for item in m.group(3).split(','):
                segs = [x.strip(' \n{') for x in item.split('::')]
                add(prefix + [x for x in segs if x and x != 'self'], [] if m.group(1) == 'crate' else parent)
        if os.path.basename(p) in ('mod.rs', 'lib.rs'):
            for child in CHILD_MOD.findall(s):
                if child != 'tests' and re.search(r'(?<![\w:])' + child + r'::', s):
                    t = resolve(list(me) + [child])
                    if t:
                        edges[p].add(t)
        log = os.path.join(root, 'log.rs')
        if LOG_MACRO.search(s) and p != log and log in files:
            edges[p].add(log)
    return edges


def module_edges(root, edges):
    """Edges between sibling modules: an import from anywhere under A into anywhere under B,
    A and B children of the same parent. Imports between a module and its own parent or
    child are the file check's business."""
    out = {}
    for p, ts in edges.items():
        a = module_path(root, p)
        for t in ts:
            b = module_path(root, t)
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            if k < len(a) and k < len(b):
                out.setdefault(a[:k + 1], set()).add(b[:k + 1])
                out.setdefault(b[:k + 1], set())
    return out


def cycles(edges):
    """Strongly connected components of more than one node (Tarjan's, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(edges.get(w, ()))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return found


def main():
    failures = 0
    all_edges = {}
    for root in CRATES:
        files = read_crate(root)
        edges = file_edges(root, files)
        all_edges.update(edges)
        file_loops = cycles(edges)
        module_loops = cycles(module_edges(root, edges))
        for c in file_loops:
            print(f'file cycle: {c}')
        new = 0
        for c in module_loops:
            key = (root, tuple("/".join(m) for m in c))
            known = KNOWN_MODULE_CYCLES.pop(key, None)
            print(f'module cycle in {root}: {list(key[1])}' + (f' (known: {known})' if known else ''))
            new += not known
        print(f'{root}: {len(file_loops)} file cycles, {len(module_loops)} module cycles ({new} new)')
        failures += len(file_loops) + new
    for (root, c), why in KNOWN_MODULE_CYCLES.items():
        print(f'known module cycle {list(c)} in {root} is gone: delete its entry ({why})')
        failures += 1

    stale = [path for floor, above in FLOORS.items() for path in (floor,) + above
             if path != 'src/' and not os.path.exists(path.rstrip('/'))]
    for path in sorted(set(stale)):
        print(f'floor table names {path}, which does not exist')
    bad = sorted(f'{p} imports {t}' for p, ts in all_edges.items() for floor, above in FLOORS.items()
                 if p.startswith(floor)
                 for t in ts if t.startswith(above) and not t.startswith(floor) and t not in GROUND)
    for b in bad:
        print(b)
    print(f'{len(bad)} imports across floors')
    sys.exit(1 if failures or bad or stale else 0)


if __name__ == '__main__':
    main()
