"""Summarise an `ncu --page source --print-source sass --csv` dump by SASS opcode, per tile.

    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        -k tiled_csl_spmm -c 1 python benchmarks/profile_tiled.py 28672,7168,0.9,8,tiled_csl_spmm > src.csv
    python benchmarks/ncu_source_summary.py src.csv TILES [ROWS]

TILES: the kernel's 128 x 64 tiles times its column tiles (28672 x 7168, one column tile: 25088).
Prints warp instructions and shared-memory wavefronts per tile, the opcodes with the most stall
samples, and the stall reasons over 2 % of the samples.
"""
import collections
import csv
import re
import sys

rows=list(csv.reader(open(sys.argv[1])))
tiles=float(sys.argv[2])
hi=[i for i,r in enumerate(rows) if r and r[0]=="Address"][0]
h=rows[hi]; data=[r for r in rows[hi+1:] if len(r)==len(h)]
ix={k:i for i,k in enumerate(h)}
num=lambda v: float(v.replace(',','')) if v.replace(',','').replace('.','',1).isdigit() else 0.0
agg=collections.defaultdict(lambda:[0,0,0,0])
for r in data:
    src=r[ix["Source"]].strip()
    op=re.sub(r'^@!?U?P\w+\s+','',src).split()[0] if src else '?'
    a=agg[op]; a[0]+=num(r[ix["L1 Wavefronts Shared"]]); a[1]+=num(r[ix["L1 Wavefronts Shared Excessive"]]); a[2]+=num(r[ix["Instructions Executed"]]); a[3]+=num(r[ix["Warp Stall Sampling (All Samples)"]])
tot=sum(a[2] for a in agg.values()); wf=sum(a[0] for a in agg.values()); ss=sum(a[3] for a in agg.values())
print(f"total warp instr {tot:.0f}, per tile {tot/tiles:.0f}; smem wavefronts per tile {wf/tiles:.0f}")
for op,a in sorted(agg.items(), key=lambda kv:-kv[1][3])[:int(sys.argv[3]) if len(sys.argv)>3 else 16]:
    print(f"{op:24s} {a[2]/tiles:6.1f}/tile wf={a[0]/tiles:6.1f}/tile ex={a[1]/tiles:6.1f} stall-samples={100*a[3]/ss:5.1f}%")
stalls=[k for k in h if k.startswith("stall_") and "Not Issued" not in k]
print(" ".join(f"{k[6:]}={100*sum(num(r[ix[k]]) for r in data)/ss:.0f}%" for k in stalls if sum(num(r[ix[k]]) for r in data)>0.02*ss))
