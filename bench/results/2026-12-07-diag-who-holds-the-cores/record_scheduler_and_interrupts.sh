#!/bin/bash
# Records the scheduler's events and the reschedule, function-call and timer interrupts
# for DURATION seconds, DELAY seconds after bench/elastic's load client starts (its join
# begins 40 s after that). Usage: record_scheduler_and_interrupts.sh OUT [DELAY] [DURATION]
out=$1; delay=${2:-39.5}; dur=${3:-3}
for i in $(seq 1 2400); do
  if pgrep -f "bench ycsb .*--phase run" >/dev/null; then break; fi
  sleep 0.25
done
sleep $delay
perf record -e sched:sched_switch -e sched:sched_wakeup -e sched:sched_waking -e sched:sched_migrate_task -e irq_vectors:reschedule_entry -e irq_vectors:call_function_single_entry -e irq_vectors:local_timer_entry -a -o $out -- sleep $dur > $out.log 2>&1
