"""The import graph of one folder of the crate, from its `use` lines and
inline `super::x::` paths: how many arrows and floors, the circles, and the
arrows that run up (from a file into the `mod.rs` of a folder holding it).

    python3 scripts/import_graph.py src/python [-v]

Exits 1 if there is a circle or an arrow up. It reads text, so a path
written through a re-export (`crate::Foo`) is not counted."""
import collections
import os
import re
import sys

root = sys.argv[1].rstrip('/')
crate_path = os.path.relpath(root, 'src').replace('/', '::')
mods = {}
for dp, dn, fn in os.walk(root):
    for f in fn:
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f)
        rel = os.path.relpath(p, root)[:-3]
        name = rel[:-4] if rel.endswith('/mod') else rel
        if name == 'mod': name = ''
        text = open(p).read()
        # A file's unit tests (`use super::*`) are not arrows.
        mods[name] = text.split('#[cfg(test)]\nmod ')[0]
def resolve(cur, path):
    # cur: module name like 'controller/options'; path segments after use
    segs = path.split('::')
    if segs[0] == 'crate':
        prefix = crate_path.split('::')
        if segs[1:1 + len(prefix)] == prefix:
            base, segs = [], segs[1 + len(prefix):]
        else:
            return None
    else:
        base = cur.split('/') if cur else []
        while segs and segs[0] in ('super', 'self'):
            if segs[0] == 'super': base = base[:-1]
            segs = segs[1:]
    # longest module prefix
    for n in range(len(segs), 0, -1):
        cand = '/'.join(base + segs[:n])
        if cand in mods: return cand
    # An item of the module itself (a folder's `mod.rs`).
    cand = '/'.join(base)
    return cand if cand in mods else None
edges = set()
for m, src in mods.items():
    # join multi-line use statements
    for u in re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);', src, re.M):
        u = re.sub(r'\s+', '', u)
        # expand one level of braces
        mm = re.match(r'^(.*?)::\{(.*)\}$', u)
        paths = [u]
        if mm:
            pre, inner = mm.groups()
            depth, cur, parts = 0, '', []
            for ch in inner:
                if ch == '{': depth += 1
                if ch == '}': depth -= 1
                if ch == ',' and depth == 0: parts.append(cur); cur = ''
                else: cur += ch
            parts.append(cur)
            paths = [pre + '::' + p.split('::{')[0] for p in parts if p]
        for p in paths:
            t = resolve(m, p)
            if t is not None and t != m:
                edges.add((m, t))
    # inline paths like super::status::x(
    for p in re.findall(r'\b((?:super::)+[a-z_]+)::', src):
        t = resolve(m, p)
        if t is not None and t != m: edges.add((m, t))
g = collections.defaultdict(set)
for a, b in edges: g[a].add(b)
# upward: a is inside folder b (b is an ancestor of a), excluding root mod.rs ('' )
up = [(a, b) for a, b in edges if b != '' and a.startswith(b + '/')]
up += [(a, '') for a, b in edges if b == '' and a]
print('modules', len(mods), 'arrows', len(edges))
print('upward arrows:', up or 'none')
# cycles via Tarjan
idx, low, st, on, res, c = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in g[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: res.append(comp)
for v in list(mods):
    if v not in idx: sc(v)
print('circles:', res or 'none')
# floors
floor = {}
def fl(v, seen=()):
    if v in floor: return floor[v]
    if v in seen: return 0
    floor[v] = 1 + max([fl(w, seen + (v,)) for w in g[v]] or [0])
    return floor[v]
for v in mods: fl(v)
print('floors:', max(floor.values()))
if '-v' in sys.argv:
    for v in sorted(mods, key=lambda v: (floor[v], v)): print(floor[v], v or '(mod.rs)', sorted(g[v]))
sys.exit(1 if up or res else 0)
