//! The read scheduler: every node's reads — point reads and scans — ordered by
//! [`policy`] and run on a fixed set of read threads (seed 002).
//!
//! A scan (one page of a token range or a whole table) is queued as one request; point
//! reads are queued only while a scan is queued or running (otherwise they are served on
//! the connection's task at once: nothing could overtake them and a thread hop would only
//! cost). With [`Ordering::PointFirst`] every queued point read goes before any queued
//! scan, and a running scan lets queued point reads through at its *checkpoints*
//! ([`checkpoint`], every few rows it visits): the scan's thread serves them in place and
//! then carries on, so a long scan never keeps a point read waiting for more than a
//! checkpoint's worth of rows. Aging bounds how long a scan can be overtaken. With
//! [`Ordering::Fifo`] (the `read_scheduling = "fifo"` switch, for comparison) every read
//! is queued and served in arrival order, as in Cassandra's read stage.
//!
//! The queue is bounded: a read arriving at a full queue is refused with `Overloaded`.
//! Queue lengths, reads served and their queue wait per class are counted
//! ([`ReadScheduler::statistics`]) for `shoal admin` and the metrics.

pub mod policy;

pub use policy::{Ordering, ReadClass};

use parking_lot::{Condvar, Mutex};
use policy::ReadQueue;
use shoal_cql::CqlError;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as Atomic};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads queued at most before new ones are refused with `Overloaded`.
pub const QUEUE_CAPACITY: usize = 4096;
/// How long a scan may be overtaken by point reads before it is served next.
pub const AGING_BOUND: Duration = Duration::from_millis(50);
/// Rows a scan visits between two checkpoints.
pub const CHECKPOINT_ROWS: u32 = 32;

type Task = Box<dyn FnOnce() + Send>;

/// Per-class counts, indexed by [`ReadClass::index`].
#[derive(Default)]
struct ClassCounters {
    queued: AtomicUsize,
    served: AtomicU64,
    waited_micros: AtomicU64,
}

struct Shared {
    queue: Mutex<ReadQueue<Task>>,
    ready: Condvar,
    /// Scans queued or running: point reads are queued only while there are any (or
    /// always, in FIFO order).
    scans: AtomicUsize,
    counters: [ClassCounters; 3],
    stopping: AtomicBool,
}

impl Shared {
    fn served(&self, class: ReadClass, arrived: Instant) {
        let counters = &self.counters[class.index()];
        counters.queued.fetch_sub(1, Atomic::Relaxed);
        counters.served.fetch_add(1, Atomic::Relaxed);
        counters
            .waited_micros
            .fetch_add(arrived.elapsed().as_micros() as u64, Atomic::Relaxed);
    }
}

thread_local! {
    /// On a read thread running a scan: the scheduler whose point reads it lets through.
    static RUNNING_SCAN: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
    /// Rows visited since the last checkpoint that served.
    static ROWS_SINCE_CHECKPOINT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Called for every row a read visits. On a read thread running a scan, every
/// [`CHECKPOINT_ROWS`] rows it serves the point reads queued meanwhile (unless the order
/// is FIFO); anywhere else it does nothing.
pub fn checkpoint() {
    RUNNING_SCAN.with(|running| {
        let running = running.borrow();
        let Some(shared) = running.as_ref() else {
            return;
        };
        let rows = ROWS_SINCE_CHECKPOINT.with(|rows| {
            let next = rows.get() + 1;
            rows.set(if next >= CHECKPOINT_ROWS { 0 } else { next });
            next
        });
        if rows < CHECKPOINT_ROWS {
            return;
        }
        loop {
            let Some((class, arrived, task)) = shared.queue.lock().pop_point() else {
                return;
            };
            shared.served(class, arrived);
            task();
        }
    });
}

/// What one class of reads has seen since the node started.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassStatistics {
    pub class: &'static str,
    pub queued: usize,
    pub served: u64,
    /// Total time served reads of this class waited in the queue.
    pub waited: Duration,
}

/// The read threads and their queue.
pub struct ReadScheduler {
    shared: Arc<Shared>,
    ordering: Ordering,
}

impl ReadScheduler {
    /// `threads` read threads serving reads in `ordering`.
    pub fn new(ordering: Ordering, threads: usize) -> ReadScheduler {
        let shared = Arc::new(Shared {
            queue: Mutex::new(ReadQueue::new(ordering, AGING_BOUND, QUEUE_CAPACITY)),
            ready: Condvar::new(),
            scans: AtomicUsize::new(0),
            counters: Default::default(),
            stopping: AtomicBool::new(false),
        });
        for number in 0..threads.max(1) {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("shoal-read-{number}"))
                .spawn(move || read_thread(shared));
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a read thread");
            }
        }
        ReadScheduler { shared, ordering }
    }

    /// The order reads are served in.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// True when a point read may run on the caller's task now: nothing queued or running
    /// could go before it (and the order is not FIFO).
    pub fn point_read_inline(&self) -> bool {
        self.ordering != Ordering::Fifo && self.shared.scans.load(Atomic::Acquire) == 0
    }

    /// Runs `read` on a read thread in its turn; `Overloaded` when the queue is full.
    pub async fn run<R: Send + 'static>(
        &self,
        class: ReadClass,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CqlError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let is_scan = matches!(class, ReadClass::Scan { .. });
        let shared = Arc::clone(&self.shared);
        let counters = &self.shared.counters[class.index()];
        counters.queued.fetch_add(1, Atomic::Relaxed);
        // The task never panics: a read that does answers its client with an error (its
        // sender is dropped), and the read thread lives on.
        let task: Task = Box::new(move || {
            let previous = is_scan
                .then(|| RUNNING_SCAN.with(|running| running.replace(Some(Arc::clone(&shared)))));
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
            if let Some(previous) = previous {
                RUNNING_SCAN.with(|running| running.replace(previous));
                shared.scans.fetch_sub(1, Atomic::Release);
            }
            if let Ok(result) = result {
                let _ = answer.send(result);
            }
        });
        if is_scan {
            self.shared.scans.fetch_add(1, Atomic::AcqRel);
        }
        let pushed = self.shared.queue.lock().push(class, Instant::now(), task);
        if pushed.is_err() {
            counters.queued.fetch_sub(1, Atomic::Relaxed);
            if is_scan {
                self.shared.scans.fetch_sub(1, Atomic::Release);
            }
            return Err(CqlError::overloaded(format!(
                "Too many reads queued on this node ({QUEUE_CAPACITY}); retry later"
            )));
        }
        self.shared.ready.notify_one();
        answered
            .await
            .map_err(|_| CqlError::server("the read failed unexpectedly"))
    }

    /// Per class: reads queued now, served so far and the time they waited.
    pub fn statistics(&self) -> Vec<ClassStatistics> {
        [
            ReadClass::LocalPoint,
            ReadClass::RemotePoint,
            ReadClass::Scan { width: 0, limit: 0 },
        ]
        .into_iter()
        .map(|class| {
            let counters = &self.shared.counters[class.index()];
            ClassStatistics {
                class: class.name(),
                queued: counters.queued.load(Atomic::Relaxed),
                served: counters.served.load(Atomic::Relaxed),
                waited: Duration::from_micros(counters.waited_micros.load(Atomic::Relaxed)),
            }
        })
        .collect()
    }
}

impl Drop for ReadScheduler {
    fn drop(&mut self) {
        {
            // Under the queue's lock: a read thread checks `stopping` under it before it
            // waits, so it either sees it set or is already waiting for the wake-up.
            let _queue = self.shared.queue.lock();
            self.shared.stopping.store(true, Atomic::Release);
        }
        self.shared.ready.notify_all();
    }
}

fn read_thread(shared: Arc<Shared>) {
    loop {
        let next = {
            let mut queue = shared.queue.lock();
            loop {
                if shared.stopping.load(Atomic::Acquire) {
                    return;
                }
                if let Some(next) = queue.pop(Instant::now()) {
                    break next;
                }
                shared.ready.wait(&mut queue);
            }
        };
        let (class, arrived, task) = next;
        shared.served(class, arrived);
        task();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_point_read_queued_behind_a_running_scan_is_served_at_its_next_checkpoint() {
        let scheduler = Arc::new(ReadScheduler::new(
            Ordering::PointFirst { narrow_first: true },
            1,
        ));
        let (started, scan_started) = std::sync::mpsc::channel();
        let point_done = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&point_done);
        // A scan that checks in until the point read has been served (or gives up).
        let scan = {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move {
                scheduler
                    .run(
                        ReadClass::Scan {
                            width: 8,
                            limit: 1000,
                        },
                        move || {
                            let _ = started.send(());
                            let begun = Instant::now();
                            while !seen.load(Atomic::Acquire)
                                && begun.elapsed() < Duration::from_secs(10)
                            {
                                checkpoint();
                                std::thread::yield_now();
                            }
                            seen.load(Atomic::Acquire)
                        },
                    )
                    .await
            })
        };
        scan_started.recv().unwrap();
        assert!(!scheduler.point_read_inline(), "a scan is running");
        let done = Arc::clone(&point_done);
        let answer = scheduler
            .run(ReadClass::LocalPoint, move || {
                done.store(true, Atomic::Release);
                42
            })
            .await
            .unwrap();
        assert_eq!(answer, 42);
        // The one read thread was busy with the scan: the point read ran at a checkpoint,
        // and the scan saw it done before it finished.
        assert!(scan.await.unwrap().unwrap());
        assert!(scheduler.point_read_inline(), "no scan any more");
        let statistics = scheduler.statistics();
        assert_eq!(statistics[0].served, 1);
        assert_eq!(statistics[2].served, 1);
        assert!(statistics.iter().all(|s| s.queued == 0));
    }
}
