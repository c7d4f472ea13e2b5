# Timelines of a decode step from kernels compiled with the KTRACE define: each traced block
# prints "KT <kernel> <a> <b> <block> <flag> <entry> <waited> <ready> <first warp done> <last
# warp done>" (global-timer ns). Groups the lines into launches (sorted by entry, consecutive
# lines of one kernel and shape) and prints, per kernel and shape, the mean over launches of:
# enter (first block's entry after the previous launch's last block ended), waitgap (first block
# past its PDL wait after that), waitspr (spread of the blocks' waits), prolog (last block ready
# after the last wait), run (last block done after the first wait), tail (spread of the blocks'
# ends), span (last end after the previous launch's last end), and for split-copy launches the
# weight bytes over run in TB/s. Device printf perturbs the step (tg falls to ~20 t/s), so read
# the per-launch phases, not the gaps between launches.
#   SYNAPTIX_PRINTF_FIFO=536870912 SYNAPTIX_KERNEL_DEFINES=KTRACE \
#     .dev/bin/synaptix bench M --device cuda -p 0 -n 6 -r 1 > /tmp/kt.txt; python3 scripts/dev/kt.py /tmp/kt.txt
# Lines "KTA <head> <position> <ready> <scores> <softmax> <P·V> <reduced>" (the one-pass
# attention's phases) give the mean of each phase over blocks, by position range.
import sys, collections, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
recs = []
phases = collections.defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("KTA "):
        f = line.split()
        try:
            pos, t = int(f[2]), [int(x) for x in f[3:8]]
        except (ValueError, IndexError):
            continue
        phases[min(pos // 32, 3)].append([t[i + 1] - t[i] for i in range(4)])
        continue
    if not line.startswith("KT "): continue
    f = line.split()
    if len(f) != 11: continue
    try:
        tag, a, b, blk, fl = f[1], int(f[2]), int(f[3]), int(f[4]), int(f[5])
        t = [int(x) for x in f[6:11]]
    except ValueError:
        continue
    recs.append((t[0], tag, a, b, blk, fl, t))
recs.sort()
groups = []
for r in recs:
    key = (r[1], r[2], r[3], r[5] if r[1] == "q8s" else 0)  # attention's flag is its position
    if groups and groups[-1][0] == key: groups[-1][1].append(r[6])
    else: groups.append((key, [r[6]]))
print("records", len(recs), "launches", len(groups))
def q8s_bytes(n, k): return n * (k // 32) * 34
prev_end = None
rows = []
for key, ts in groups:
    e0 = min(t[0] for t in ts); e1 = max(t[0] for t in ts)
    w0 = min(t[1] for t in ts); w1 = max(t[1] for t in ts)
    p1 = max(t[2] for t in ts)
    d0 = min(t[4] for t in ts); d1 = max(t[4] for t in ts)
    rows.append(dict(key=key, n=len(ts), e0=e0, e1=e1, w0=w0, w1=w1, p1=p1, d0=d0, d1=d1, prev=prev_end))
    prev_end = d1
# Per shape averages over launches with a previous launch.
agg = collections.defaultdict(list)
for r in rows:
    if r["prev"] is None: continue
    tag, a, b, fl = r["key"]
    gap = r["w0"] - r["prev"]
    enter_after = r["e0"] - r["prev"]
    pro = r["p1"] - r["w1"]
    run = r["d1"] - r["w0"]
    tail = r["d1"] - r["d0"]
    agg[r["key"]].append((gap, enter_after, r["w1"] - r["w0"], pro, run, tail, r["d1"] - r["prev"], r["n"]))
print("%-28s %5s %5s %8s %8s %8s %8s %8s %8s %8s %7s" % ("launch", "count", "blks", "enter", "waitgap", "waitspr", "prolog", "run", "tail", "span", "TB/s"))
tot = 0
for key, v in sorted(agg.items(), key=lambda kv: -sum(x[6] for x in kv[1])):
    m = [sum(x[i] for x in v) / len(v) / 1000 for i in range(7)]
    tag, a, b, fl = key
    rate = q8s_bytes(a, b) / (m[4] * 1000) / 1000 if tag == "q8s" else 0
    tot += sum(x[6] for x in v)
    print("%-28s %5d %5d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f" % (f"{tag} {a}x{b}{'p' if fl else ''}", len(v), v[0][7], m[1], m[0], m[2], m[3], m[4], m[5], m[6], rate))
if rows:
    print("sum of spans (us)", tot / 1000, "over", len(rows), "launches; first..last", (rows[-1]["d1"] - rows[0]["e0"]) / 1000)
if phases:
    print("%-16s %6s %8s %8s %8s %8s  (one-pass attention, mean us a block)" % ("positions", "blocks", "scores", "softmax", "P.V", "reduce"))
    for b in sorted(phases):
        v = phases[b]
        m = [sum(x[i] for x in v) / len(v) / 1000 for i in range(4)]
        label = f"{32 * b}-{32 * b + 31}" if b < 3 else "96+"
        print("%-16s %6d %8.2f %8.2f %8.2f %8.2f" % (label, len(v), *m))
