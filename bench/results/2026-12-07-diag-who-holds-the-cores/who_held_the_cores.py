#!/usr/bin/env python3
"""Who ran on a core while a client-facing thread waited for it.

Reads `perf sched timehist` output (one line per thread switched out: time, cpu,
name[tid/pid], wait, scheduling delay, run time) and, for every thread serving requests
(the nodes' `shoal-conn-*` and `shoal-worker` threads, `shoal-writer`, and the load
client's `tokio-rt-worker`) that waited longer than --min-delay-ms between its wakeup and
its run, charges the time each other thread ran on that core meanwhile.

    perf sched record -a -o sched.data -- sleep 3      # around a join
    perf sched timehist -i sched.data > timehist.txt
    who_held_the_cores.py timehist.txt FROM TO         # perf timestamps of the join

Prints the total charged per thread name (streaming's are `shoal-stream-out`,
`shoal-stream-io`, `shoal-ingest`; RocksDB's own `rocksdb:low`/`rocksdb:high`) and the
longest waits with what ran meanwhile.
"""
import argparse
import collections
import re

SERVING = re.compile(r"shoal-conn|tokio-rt|shoal-writer|shoal-worker")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("timehist")
    parser.add_argument("start", type=float)
    parser.add_argument("end", type=float)
    parser.add_argument("--min-delay-ms", type=float, default=1.0)
    parser.add_argument("--longest", type=int, default=12)
    args = parser.parse_args()
    ran = collections.defaultdict(list)  # cpu -> [(start, end, thread)]
    waits = []  # (cpu, woken, ran at, thread, delay)
    for line in open(args.timehist):
        fields = line.split()
        if len(fields) < 6 or not fields[1].startswith("["):
            continue
        try:
            at, delay, run = float(fields[0]), float(fields[4]) / 1e3, float(fields[5]) / 1e3
        except ValueError:
            continue
        cpu, thread = fields[1], fields[2]
        ran[cpu].append((at - run, at, thread))
        if args.start <= at <= args.end and SERVING.match(thread) and delay * 1e3 > args.min_delay_ms:
            waits.append((cpu, at - run - delay, at - run, thread, delay))
    charged = collections.Counter()
    for cpu, woken, started, _, _ in waits:
        for begin, end, thread in ran[cpu]:
            if begin < started and end > woken:
                charged[thread.split("[")[0]] += (min(end, started) - max(begin, woken)) * 1e3
    print(f"{len(waits)} waits over {args.min_delay_ms} ms by threads serving requests")
    for thread, ms in charged.most_common(20):
        print(f"  {thread:24s} {ms:7.1f} ms")
    print("longest waits:")
    for cpu, woken, started, thread, delay in sorted(waits, key=lambda w: -w[4])[:args.longest]:
        meanwhile = [f"{t.split('[')[0]} {(e - b) * 1e3:.2f}" for b, e, t in ran[cpu]
                     if b < started and e > woken and (e - b) * 1e3 >= 0.2]
        print(f"  {woken:.4f} {cpu} {thread.split('[')[0]:16s} waited {delay * 1e3:.2f} ms; "
              f"ran there meanwhile (>= 0.2 ms): {', '.join(meanwhile)}")


if __name__ == "__main__":
    main()
