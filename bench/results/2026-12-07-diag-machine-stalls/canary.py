#!/usr/bin/env python3
"""Wakes every millisecond; logs every gap over 10 ms with wall time, and the /proc/stat
ticks (user, system, iowait, steal) across it."""
import sys, time
def stat():
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]
out = open(sys.argv[1], "w")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    before, s0 = time.monotonic(), stat()
    time.sleep(0.001)
    gap = time.monotonic() - before
    if gap > 0.010:
        s1 = stat()
        d = [b - a for a, b in zip(s0, s1)]
        out.write(f"{time.time():.3f} gap_ms={1000*gap:.1f} user={d[0]} sys={d[2]} idle={d[3]} iowait={d[4]} steal={d[7]}\n")
        out.flush()
