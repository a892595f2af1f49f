import re, datetime, json, sys, glob, os
out = sys.argv[1]; logs = sys.argv[2]
ansi = re.compile(r'\x1b\[[0-9;]*m')
d = json.load(open(os.path.join(out, 'results.json')))
for idx, j in enumerate(d['joins']):
    label = f"shoal-1024mib-write-{idx+1}" if len(d['joins']) > 1 else "shoal-1024mib-write"
    start = j['join_started_unix']
    events = []
    for f in sorted(glob.glob(os.path.join(logs, label, 'node?.log'))):
        node = os.path.basename(f)[:5]
        for line in open(f, errors='replace'):
            line = ansi.sub('', line)
            m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+(\w+)\s+(.*)', line)
            if not m: continue
            t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
            rel = (t - start) * 1000
            if -100 < rel < 1500:
                events.append((rel, node, m.group(3)[:200]))
    events.sort()
    print(f"== {label}: join {j['join_seconds']:.3f}s, {len(events)} log lines")
    for s in j['slowest_during_join'][:15]:
        b, l = s['began_ms_after_join_start'], s['latency_ms']
        near = [e for e in events if b - 3 <= e[0] <= b + l + 1]
        print(f"-- write began {b:.1f} ms, took {l:.2f} ms")
        for e in near[:8]:
            print(f"     {e[0]:8.1f} {e[1]} {e[2]}")
