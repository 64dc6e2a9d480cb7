#!/usr/bin/env python3
"""Fails when a source file of src/ imports (directly or through others) from a file that
imports it back, or when a lower floor (http/, io.rs, api/, workers/) imports from one
above it. Counts `crate::`/`super::` paths, `use child::...` in a mod.rs, and the log
macros; `#[cfg(test)] mod tests {...}` blocks are skipped. Run from the repository root."""
import os,re,sys
root='src'
files={}
for d,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'): files[os.path.join(d,f)]=open(os.path.join(d,f)).read()
def modpath(p):
    rel=os.path.relpath(p,root)[:-3].split(os.sep)
    if rel[-1] in('mod','lib','main'): rel=rel[:-1]
    return rel
mods={tuple(modpath(p)):p for p in files}
def resolve(segs):
    # longest prefix that is a module file
    for n in range(len(segs),0,-1):
        if tuple(segs[:n]) in mods: return mods[tuple(segs[:n])]
    return None
edges={p:set() for p in files}
for p,s in files.items():
    # strip tests
    s=re.sub(r'#\[cfg\(test\)\]\s*mod tests \{.*','',s,flags=re.S)
    me=modpath(p)
    isdir = os.path.basename(p) in ('mod.rs','lib.rs')
    for m in re.finditer(r'\b(crate|super)((?:::\w+)+)',s):
        segs=m.group(2).split('::')[1:]
        if m.group(1)=='crate': base=[]
        else:
            base=me[:-1] if not isdir else me[:-1]
            if isdir: base=me[:-1]
            else: base=me[:-1]
        # handle super::super
        while segs and segs[0]=='super':
            base=base[:-1]; segs=segs[1:]
        t=resolve(base+segs)
        if t and t!=p: edges[p].add(t)
    # use super::{a, b}
    for m in re.finditer(r'use (crate|super)::\{([^}]*)\}',s):
        base=[] if m.group(1)=='crate' else me[:-1]
        for item in m.group(2).split(','):
            item=item.strip().split('::')
            t=resolve(base+[x.strip() for x in item if x.strip()])
            if t and t!=p: edges[p].add(t)
# relative paths into child modules: `use child::X`, `child::f()` in a mod.rs
for p,s2 in files.items():
    if os.path.basename(p) not in ('mod.rs','lib.rs'): continue
    me=modpath(p)
    body=re.sub(r'#\[cfg\(test\)\]\s*mod tests \{.*','',s2,flags=re.S)
    for child in re.findall(r'^\s*(?:pub(?:\(crate\))? )?mod (\w+);',body,flags=re.M):
        if child=='tests': continue
        if re.search(r'(?<![\w:])'+child+r'::',body):
            t=resolve(me+[child])
            if t: edges[p].add(t)
# macros: crate::warn! etc -> log.rs
for p,s in files.items():
    if re.search(r'crate::(warn|info|debug|error)!',s) and p!='src/log.rs': edges[p].add('src/log.rs')
# tarjan
idx={};low={};st=[];on=set();res=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: res.append(comp)
for v in edges:
    if v not in idx: sc(v)
for r in res: print(sorted(r))
print(f'{len(res)} import cycles')
# Layers: the ground floors import nothing from the floors above them.
FORBIDDEN = {
    'src/http/': ('src/api/', 'src/serve/', 'src/shard.rs', 'src/runtime/', 'src/config.rs'),
    'src/io.rs': ('src/',),
    'src/api/': ('src/serve/', 'src/shard.rs', 'src/runtime/'),
    'src/workers/': ('src/http/', 'src/api/', 'src/serve/', 'src/shard.rs', 'src/runtime/'),
}
bad = []
for p, ts in edges.items():
    for floor, above in FORBIDDEN.items():
        if p.startswith(floor):
            bad += [f'{p} imports {t}' for t in ts if t.startswith(above) and not t.startswith(floor)
                    and not (t == 'src/log.rs')]
for b in sorted(bad):
    print(b)
print(f'{len(bad)} imports across layers')
sys.exit(1 if res or bad else 0)
