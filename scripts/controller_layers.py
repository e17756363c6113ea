"""Import graph of src/controller/: which module names which (any
`super::X` / `crate::controller::X` path outside comments, in `use` lines
or inline), its circles, and the arrows that run up against the layer
order of src/controller/mod.rs's module doc (top floor first; `+` joins
the files of one floor). Exits 1 on a circle or an arrow up.

    python3 scripts/controller_layers.py [ORDER]
"""
import re, glob, os, sys, itertools
root = 'src/controller'
nodes = {}
for f in glob.glob(root + '/*.rs'):
    nodes[os.path.basename(f)[:-3]] = [f]
for d in glob.glob(root + '/*/'):
    name = os.path.basename(d.rstrip('/'))
    nodes.setdefault(name, []).extend(glob.glob(d + '**/*.rs', recursive=True))
mod_items = {}  # names defined/re-exported in mod.rs map to their module
edges = {n: set() for n in nodes}
for n, files in nodes.items():
    for f in files:
        text = open(f).read()
        text = re.sub(r'//.*', '', text)
        depth = f[len(root) + 1:].count('/')
        pats = [r'crate::controller::(\w+)']
        if n == 'mod':
            pats.append(r'\bself::(\w+)')
            pats.append(r'^\s*(?:pub(?:\(crate\))? )?use (\w+)::', )
        elif depth == 0:
            pats.append(r'\bsuper::(\w+)')
            pats.append(r'\bsuper::\{([^}]*)\}')
        else:
            pats.append(r'\bsuper::super::(\w+)')
        for p in pats:
            for m in re.finditer(p, text, re.M):
                for tok in re.split(r'[,\s]+', m.group(1)):
                    tok = tok.split('::')[0].strip()
                    if not tok:
                        continue
                    target = tok if tok in nodes else 'mod'
                    if target != n:
                        edges[n].add(target)
ORDER = ('mod+run_signals,replicas,start,handle,stopping,features,'
         'status+persist+triggers+watch+batch+dependencies,worker+hangs,core,'
         'finish+gate+groups+debounce+inspect+life+metrics+outcome+watchdog')
order = (sys.argv[1] if len(sys.argv) > 1 else ORDER).split(',')
for n in sorted(edges):
    print(f'{n:14} -> {", ".join(sorted(edges[n]))}')
# circles (SCCs)
index = {}; low = {}; stack = []; on = set(); sccs = []; c = [0]
def strong(v):
    index[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(comp)
sys.setrecursionlimit(10000)
for v in edges:
    if v not in index: strong(v)
print('circles:', sccs or 'none')
rank = {}
for i, layer in enumerate(order):
    for n in layer.split('+'):
        rank[n] = i
missing = set(nodes) - set(rank)
if missing:
    print('not in the order:', sorted(missing))
back = [(a, b) for a in edges for b in edges[a] if a in rank and b in rank and rank[b] < rank[a]]
print('arrows up:', back or 'none')
sys.exit(1 if sccs or back or missing else 0)
