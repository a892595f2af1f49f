#!/usr/bin/env python3
"""Samples of a `perf record -a` taken over a join, by process and thread name, and the
top functions of each thread name, within the first SECONDS of the recording.

    perf script -i perf.data -F comm,pid,time,ip,sym > samples.txt
    profile_by_thread.py samples.txt [SECONDS]
"""
import collections
import re
import sys

path = sys.argv[1]
window = float(sys.argv[2]) if len(sys.argv) > 2 else 0.6
rows = []
for line in open(path):
    m = re.match(r"\s*(.+?)\s+(\d+)\s+([\d.]+):\s+([0-9a-f]+)\s*(.*)", line)
    if m:
        rows.append((m.group(1), int(m.group(2)), float(m.group(3)), m.group(5).strip()))
start = rows[0][2]
by_process = collections.Counter()
by_symbol = collections.defaultdict(collections.Counter)
for comm, pid, time, symbol in rows:
    if time - start < window:
        by_process[(pid, comm)] += 1
        by_symbol[(pid, comm)][symbol] += 1
print(f"samples in the first {window} s, by process and thread name")
for (pid, comm), count in sorted(by_process.items(), key=lambda kv: -kv[1]):
    if count >= 20:
        top = ", ".join(f"{symbol} {n}" for symbol, n in by_symbol[(pid, comm)].most_common(8))
        print(f"{pid:>6} {comm:<16} {count:>5}  {top}")
