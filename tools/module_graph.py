#!/usr/bin/env python3
"""module_graph.py - who calls whom between the source files of a library, and its cycles.

An arrow A -> B means that A's object file uses a global symbol (a function or a variable) that
B's object file defines: read from the build with `nm`, so it is exactly what the linker sees
(no guessing from #include lines, which in C say little: one hub header can hide any cycle).
A cycle is a strongly connected component of that graph: files that reach each other through
their calls. The daemon's rule (issue 14): no cycle of more than three files.

    tools/module_graph.py build/server/CMakeFiles/colld_core.dir      # the daemon
    tools/module_graph.py build/client/CMakeFiles/libcolld_static.dir  # libcolld
    tools/module_graph.py --edges DIR                                   # every arrow too
    tools/module_graph.py --max-cycle 3 DIR                             # exit 1 above 3

Prints the number of files and arrows, then each cycle (its files), largest first.
"""
import argparse
import os
import subprocess
import sys


def objects(root):
    """Every object file under root, keyed by its source path relative to the target dir."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".o"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, root)[: -len(".o")]
                out[name] = path
    return out


def symbols(path):
    """(defined, undefined) global symbols of an object file."""
    text = subprocess.run(["nm", "-g", path], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVWC":
            defined.add(parts[2])
    return defined, undefined


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="a CMake target's object directory (build/.../CMakeFiles/NAME.dir)")
    ap.add_argument("--edges", action="store_true", help="print every arrow")
    ap.add_argument("--max-cycle", type=int, default=0, help="exit 1 when a cycle has more files than this")
    args = ap.parse_args()
    objs = objects(args.dir)
    if not objs:
        sys.exit(f"module_graph: no object files under {args.dir} (build it first)")
    defs, uses = {}, {}
    for name, path in objs.items():
        d, u = symbols(path)
        uses[name] = u
        for s in d:
            defs[s] = name
    edges = {n: set() for n in objs}
    for name, u in uses.items():
        for s in u:
            owner = defs.get(s)
            if owner and owner != name:
                edges[name].add(owner)
    narrows = sum(len(e) for e in edges.values())
    comps = sorted((c for c in sccs(sorted(objs), edges) if len(c) > 1), key=len, reverse=True)
    print(f"{len(objs)} files, {narrows} arrows, {len(comps)} cycle(s); largest: {len(comps[0]) if comps else 1} file(s)")
    for c in comps:
        print(f"  cycle of {len(c)}: {' '.join(c)}")
    if args.edges:
        for n in sorted(edges):
            for m in sorted(edges[n]):
                print(f"  {n} -> {m}")
    if args.max_cycle and comps and len(comps[0]) > args.max_cycle:
        sys.exit(1)


if __name__ == "__main__":
    main()
