#!/usr/bin/env python3
"""Wakeups of request-serving threads onto a core where a streaming thread (idle CPU
priority) was running, and how each ended: within 1 ms or not, and whether a reschedule
interrupt or a timer tick reached that core before its next context switch.

    record_scheduler_and_interrupts.sh trace.data      # while bench/elastic runs a join
    perf script -i trace.data > trace.txt
    who_was_woken_onto_a_streaming_core.py trace.txt
"""
import sys, re, collections
# input: perf script output with sched_switch, sched_wakeup, reschedule_entry, call_function_single_entry, local_timer_entry
IDLE=re.compile(r'shoal-stream-ou|shoal-ingest$|shoal-stream-io')
FG=re.compile(r'shoal-conn|tokio-rt-worker|shoal-worker')
ev=collections.defaultdict(list)  # cpu -> [(t, kind, data)]
for line in open(sys.argv[1]):
    m=re.match(r'\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)', line)
    if not m: continue
    comm,pid,cpu,t,name,rest=m.groups(); t=float(t); cpu=int(cpu)
    ev[cpu].append((t,name,comm,rest))
# wakeups target cpu from sched_wakeup "target_cpu=00X"
res=collections.Counter(); examples=[]
wake=[]
for cpu,lst in ev.items():
    for t,name,comm,rest in lst:
        if name=='sched:sched_wakeup':
            mm=re.search(r'comm=(.+?) pid=(\d+) prio=\d+ target_cpu=(\d+)',rest)
            if mm and FG.match(mm.group(1)): wake.append((t,int(mm.group(3)),mm.group(1),mm.group(2)))
# index per cpu
for t,tcpu,comm,pid in wake:
    lst=ev[tcpu]
    # find what is running on tcpu at t: last sched_switch before t
    running=None
    for tt,name,c,rest in lst:
        if tt>t: break
        if name=='sched:sched_switch':
            running=re.search(r'next_comm=(.+?) next_pid',rest).group(1)
    if not running or not IDLE.match(running): continue
    # find when pid switched in on tcpu and what happened between
    kinds=[]; end=None
    for tt,name,c,rest in lst:
        if tt<=t: continue
        if name=='sched:sched_switch':
            end=tt; prev=re.search(r'prev_comm=(.+?) prev_pid',rest).group(1)
            kinds.append('switch')
            break
        kinds.append(name.split(':')[1])
    if end is None: continue
    d=(end-t)*1e3
    key=('>1ms' if d>1 else '<=1ms', 'resched_ipi' if 'reschedule_entry' in kinds else ('tick' if 'local_timer_entry' in kinds else 'none'))
    res[key]+=1
    if d>1 and len(examples)<12: examples.append((t,tcpu,comm,running,round(d,2),kinds[:8]))
for k,v in sorted(res.items()): print(k,v)
for e in examples: print(e)
