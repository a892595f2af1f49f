//! The read scheduler: every node's reads — point reads, scans and the chunks of scans —
//! ordered by [`policy`] and run on a fixed set of read threads (seed 002).
//!
//! Work on the **read threads** never waits for another node: scans of this node's own
//! data (a one-node cluster) and chunks of scans — asked by this node's scans or by
//! another coordinator's — each in the turn of its scan's [`ScanTicket`], so every node
//! serves the scans under way in the same order and they finish one after another.
//!
//! **Point reads first.** In the point-first orders ([`Ordering::PointFirst`]) a point
//! read never waits for scan work: it is served on the connection's task at once from
//! what the node holds in memory ([`shoal_storage::InMemory`]), and all scan work — on the
//! read threads and the scan threads — runs at a lower CPU priority
//! ([`SCAN_THREAD_NICE`]), so when point reads want the CPU they get it. (Queued behind a
//! read thread busy with a chunk, a point read would wait for that chunk each time;
//! decision 0014 has the figures.) A point read that needs data not in memory is read
//! again ([`ReadScheduler::run_point`]): where such reads lately found their blocks in
//! the page cache, at once on the same task (a copy of a few microseconds); where they
//! lately read from a disk ([`DiskMisses`]), on a **point thread**, of normal priority
//! and never given scan work, so that waiting for the disk holds neither a runtime worker
//! (and the requests of every connection on it) nor a turn behind scan work. Scan work
//! cannot
//! starve: a niced thread keeps a share of the CPU under any load (Linux gives niceness
//! 14 about 4% of a normal thread's weight), and among scans the ticket order bounds
//! overtaking. With [`Ordering::Fifo`] (the `read_scheduling = "fifo"` switch, for
//! comparison) every read is queued and served in arrival order at one priority, as in
//! Cassandra's read stage.
//!
//! A scan across the cluster is *coordinated* on its own **scan threads**: it spends most
//! of its time waiting for chunks, so it must not hold a read thread those chunks (its
//! own, or those of the scans of the node it waits for) need. Coordinated scans start in
//! the order of their tickets too, at most [`SCANS_PER_READ_THREAD`] per read thread at
//! once, which bounds the chunks in flight and the memory they buffer.
//!
//! The queues are bounded: a read arriving at a full queue is refused with `Overloaded`.
//! Scan work is not done for nobody: a scan or a chunk still queued after
//! [`RANGE_READ_TIMEOUT`] (its client or coordinator has given up on it) is answered with
//! an error instead of being read, and a queued read whose requester went away (its
//! connection closed) is dropped unread. Queue lengths, reads served and their
//! queue wait per class are counted ([`ReadScheduler::statistics`]) for `shoal admin` and
//! the metrics.

pub mod policy;

pub use policy::{Ordering, ReadClass, ScanTicket};

use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use policy::ReadQueue;
use shoal_cql::CqlError;
use shoal_replication::{ReplicaResponse, ScanStage, RANGE_READ_TIMEOUT};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as Atomic};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads queued at most before new ones are refused with `Overloaded`.
pub const QUEUE_CAPACITY: usize = 4096;
/// How long queued scan work may be held off by queued point reads before it is served
/// next (see [`policy`]).
pub const AGING_BOUND: Duration = Duration::from_millis(50);
/// Scans coordinated at once per read thread.
pub const SCANS_PER_READ_THREAD: usize = 2;
/// Point threads per read thread in the point-first orders: point reads that wait for
/// the disk, many at once so that the disk serves them side by side (Cassandra reads
/// with 32 threads, `concurrent_reads`).
pub const POINT_THREADS_PER_READ_THREAD: usize = 16;
/// The niceness of the read and scan threads in point-first orders unless configured
/// (`scan_nice`): the CPU scan work spends reading, merging and encoding rows goes to
/// point reads first when they want it.
pub const SCAN_THREAD_NICE: u8 = 14;
/// The share of recent point reads of data not in memory that read from a disk above
/// which such reads go to the point threads, in 1/1024ths: 1/16.
const DISK_SHARE_THRESHOLD: u32 = 64;

/// Whether point reads of data not in memory have lately read from a disk or found their
/// blocks in the page cache: a moving share of the reads that made the kernel read from
/// a storage device (the thread's `ru_inblock` went up; a page-cache hit leaves it be).
/// Counting reads rather than timing them keeps a read that was merely preempted on a
/// busy machine from looking like one that waited for the disk.
#[derive(Default)]
pub struct DiskMisses {
    /// In 1/1024ths, over about the last eight reads.
    share: std::sync::atomic::AtomicU32,
}

impl DiskMisses {
    /// Counts a read of data not in memory, which did or did not read from a disk.
    pub fn record(&self, read_from_disk: bool) {
        // A few reads from the disk are enough to move reads off the runtime's workers,
        // and once the blocks are cached a few reads without bring them back. Racing
        // recorders lose an update at worst.
        let share = self.share.load(Atomic::Relaxed);
        let next = (share * 7 + if read_from_disk { 1024 } else { 0 }) / 8;
        self.share.store(next, Atomic::Relaxed);
    }

    /// True when such reads have lately read from a disk.
    pub fn waits_for_disk(&self) -> bool {
        self.share.load(Atomic::Relaxed) > DISK_SHARE_THRESHOLD
    }
}

/// Blocks the calling thread has made the kernel read from storage devices so far
/// (`ru_inblock`); reads served by the page cache do not count.
fn blocks_read_by_this_thread() -> i64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0, |usage| usage.block_reads())
}

/// Lowers the calling thread's CPU priority, for a thread that only ever does background
/// or bulk work (a thread cannot raise its priority back without privileges): `nice` 0
/// leaves it unchanged, 1 to 18 put it under Linux's batch policy at that niceness (its
/// share of a contended core shrinks with each step), and 19 under the idle policy: it
/// runs only on CPU no other thread of the machine wants.
pub fn lower_thread_priority(nice: u8) {
    if nice == 0 {
        return;
    }
    use thread_priority::unix::{
        set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
        ThreadSchedulePolicy,
    };
    use thread_priority::{ThreadPriority, ThreadPriorityValue};
    // thread-priority maps 0..=99 onto niceness 19..=-20.
    let nice = u32::from(nice.min(19));
    let value = 99 - ((nice + 20) * 99).div_ceil(39).min(99);
    let Ok(value) = ThreadPriorityValue::try_from(value as u8) else {
        return;
    };
    let (policy, priority) = if nice >= 19 {
        // The idle policy has no niceness: the lowest priority is its only one.
        (NormalThreadSchedulePolicy::Idle, ThreadPriority::Min)
    } else {
        (
            NormalThreadSchedulePolicy::Batch,
            ThreadPriority::Crossplatform(value),
        )
    };
    if let Err(error) = set_thread_priority_and_policy(
        thread_native_id(),
        priority,
        ThreadSchedulePolicy::Normal(policy),
    ) {
        tracing::debug!(?error, "could not lower a thread's priority");
    }
}

type Task = Box<dyn FnOnce() + Send>;

/// Per-class counts, indexed by [`ReadClass::index`].
#[derive(Default)]
struct ClassCounters {
    queued: AtomicUsize,
    served: AtomicU64,
    waited_micros: AtomicU64,
}

/// A queue and the threads serving it.
struct Shared {
    queue: Mutex<ReadQueue<Task>>,
    ready: Condvar,
    counters: [ClassCounters; 3],
    stopping: AtomicBool,
}

impl Shared {
    fn new(ordering: Ordering) -> Arc<Shared> {
        Arc::new(Shared {
            queue: Mutex::new(ReadQueue::new(ordering, AGING_BOUND, QUEUE_CAPACITY)),
            ready: Condvar::new(),
            counters: Default::default(),
            stopping: AtomicBool::new(false),
        })
    }

    /// Starts `threads` threads serving the queue, at niceness `nice`.
    fn start_threads(self: &Arc<Self>, name: &str, threads: usize, nice: u8) {
        for number in 0..threads.max(1) {
            let shared = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{number}"))
                .spawn(move || {
                    lower_thread_priority(nice);
                    serve_queue(shared)
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a {name} thread");
            }
        }
    }

    fn served(&self, class: ReadClass, arrived: Instant) {
        let counters = &self.counters[class.index()];
        counters.queued.fetch_sub(1, Atomic::Relaxed);
        counters.served.fetch_add(1, Atomic::Relaxed);
        counters
            .waited_micros
            .fetch_add(arrived.elapsed().as_micros() as u64, Atomic::Relaxed);
    }

    /// Queues `read` in its turn; its answer comes on the receiver: `Err(waited)` instead
    /// when it was still queued `deadline` after it arrived. A read whose receiver is gone
    /// by its turn is not run. `Overloaded` when the queue is full.
    fn submit<R: Send + 'static>(
        self: &Arc<Self>,
        class: ReadClass,
        deadline: Option<Duration>,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<R, Duration>>, CqlError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let counters = &self.counters[class.index()];
        counters.queued.fetch_add(1, Atomic::Relaxed);
        let arrived = Instant::now();
        // The task never panics: a read that does answers its client with an error (its
        // sender is dropped), and the thread lives on.
        let task: Task = Box::new(move || {
            if answer.is_closed() {
                return;
            }
            let waited = arrived.elapsed();
            if deadline.is_some_and(|deadline| waited >= deadline) {
                let _ = answer.send(Err(waited));
                return;
            }
            if let Ok(result) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
                let _ = answer.send(Ok(result));
            }
        });
        let pushed = self.queue.lock().push(class, arrived, task);
        if pushed.is_err() {
            counters.queued.fetch_sub(1, Atomic::Relaxed);
            return Err(CqlError::overloaded(format!(
                "Too many reads queued on this node ({QUEUE_CAPACITY}); retry later"
            )));
        }
        self.ready.notify_one();
        Ok(answered)
    }

    fn stop(&self) {
        {
            // Under the queue's lock: a thread checks `stopping` under it before it
            // waits, so it either sees it set or is already waiting for the wake-up.
            let _queue = self.queue.lock();
            self.stopping.store(true, Atomic::Release);
        }
        self.ready.notify_all();
    }
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

/// The read threads, the scan threads, the point threads and their queues.
pub struct ReadScheduler {
    /// Local scans and chunks; point reads too in arrival order.
    reads: Arc<Shared>,
    /// Queued point reads: the point threads in the point-first orders (point reads that
    /// need the disk), the read threads (`reads`) in arrival order.
    points: Arc<Shared>,
    /// Whether point reads of data not in memory lately read from a disk.
    disk_misses: Arc<DiskMisses>,
    /// Scans coordinated across the cluster.
    coordinated: Arc<Shared>,
    ordering: Ordering,
    /// How long scan work may wait in a queue: [`RANGE_READ_TIMEOUT`] unless configured.
    scan_deadline: Duration,
}

impl ReadScheduler {
    /// `threads` read threads (and [`SCANS_PER_READ_THREAD`] scan threads per read
    /// thread) serving reads in `ordering`.
    pub fn new(ordering: Ordering, threads: usize) -> ReadScheduler {
        ReadScheduler::with_scan_nice(ordering, threads, SCAN_THREAD_NICE)
    }

    /// [`ReadScheduler::new`], with scan work at niceness `scan_nice` in the point-first
    /// orders (see [`lower_thread_priority`]; the `scan_nice` setting).
    pub fn with_scan_nice(ordering: Ordering, threads: usize, scan_nice: u8) -> ReadScheduler {
        let threads = threads.max(1);
        let reads = Shared::new(ordering);
        // In arrival order every read is equal, as in Cassandra.
        let nice = match ordering {
            Ordering::Fifo => 0,
            Ordering::PointFirst { .. } => scan_nice,
        };
        reads.start_threads("shoal-read", threads, nice);
        let coordinated = Shared::new(ordering);
        coordinated.start_threads("shoal-scan", threads * SCANS_PER_READ_THREAD, nice);
        let points = match ordering {
            Ordering::Fifo => Arc::clone(&reads),
            Ordering::PointFirst { .. } => {
                let points = Shared::new(Ordering::Fifo);
                points.start_threads("shoal-point", threads * POINT_THREADS_PER_READ_THREAD, 0);
                points
            }
        };
        ReadScheduler {
            reads,
            points,
            disk_misses: Arc::default(),
            coordinated,
            ordering,
            scan_deadline: RANGE_READ_TIMEOUT,
        }
    }

    /// The scheduler with `deadline` instead of [`RANGE_READ_TIMEOUT`] for scan work (the
    /// node's `range_request_timeout_ms`).
    pub fn with_scan_deadline(mut self, deadline: Duration) -> ReadScheduler {
        self.scan_deadline = deadline;
        self
    }

    /// The order reads are served in.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// True when point reads run on the caller's task at once, from memory
    /// ([`shoal_storage::InMemory`]), rather than queued: in the point-first orders, where
    /// nothing goes before them. A read that needs data not in memory is then served by
    /// [`ReadScheduler::run_point`].
    pub fn point_read_inline(&self) -> bool {
        self.ordering != Ordering::Fifo
    }

    /// Runs a point read in its turn. In arrival order, that is on a read thread
    /// ([`ReadScheduler::run`]). In the point-first orders `read` needs data not in
    /// memory: it runs here at once while such reads find their blocks in the page cache,
    /// and on a point thread while they read from a disk ([`DiskMisses`]).
    pub async fn run_point<R: Send + 'static>(
        &self,
        class: ReadClass,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CqlError> {
        if !self.point_read_inline() {
            return self.run(class, read).await;
        }
        let counted = {
            let disk_misses = Arc::clone(&self.disk_misses);
            move || {
                let before = blocks_read_by_this_thread();
                let result = read();
                disk_misses.record(blocks_read_by_this_thread() > before);
                result
            }
        };
        if self.disk_misses.waits_for_disk() {
            self.run(class, counted).await
        } else {
            Ok(counted())
        }
    }

    /// Runs `read` in its turn — a point read on a point thread (in arrival order: on a
    /// read thread), anything else on a read thread; `Overloaded` when the queue is full.
    /// `read` must not wait for other nodes (a scan across the cluster is
    /// [`ReadScheduler::run_coordinated_scan`]).
    /// A scan (a [`ReadClass::Scan`]) still queued after the scan deadline is refused with
    /// `Overloaded` instead.
    pub async fn run<R: Send + 'static>(
        &self,
        class: ReadClass,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CqlError> {
        let (queue, deadline) = match class {
            ReadClass::Scan(_) => (&self.reads, Some(self.scan_deadline)),
            ReadClass::LocalPoint | ReadClass::RemotePoint => (&self.points, None),
        };
        let answered = queue.submit(class, deadline, read)?;
        match answered.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(waited)) => Err(self.waited_too_long("a read thread", waited)),
            Err(_) => Err(CqlError::server("the read failed unexpectedly")),
        }
    }

    /// Runs a scan across the cluster on a scan thread in the turn of `scan`; refused with
    /// `Overloaded` when it is still queued after the scan deadline.
    pub async fn run_coordinated_scan<R: Send + 'static>(
        &self,
        scan: ScanTicket,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CqlError> {
        let answered =
            self.coordinated
                .submit(ReadClass::Scan(scan), Some(self.scan_deadline), read)?;
        match answered.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(waited)) => Err(self.waited_too_long("a scan thread", waited)),
            Err(_) => Err(CqlError::server("the scan failed unexpectedly")),
        }
    }

    /// The read threads as the stage where this node serves the chunks of scans.
    pub fn chunk_stage(&self) -> Arc<dyn ScanStage> {
        Arc::new(ChunkTurns {
            reads: Arc::clone(&self.reads),
            deadline: self.scan_deadline,
        })
    }

    /// The error for a scan still queued after its deadline: its client has given up on
    /// it (drivers time requests out after 12 s), so it is not run for nobody.
    fn waited_too_long(&self, stage: &str, waited: Duration) -> CqlError {
        CqlError::overloaded(format!(
            "The scan waited {:.1} s for {stage} on this node, longer than {:.1} s: the node \
             is busy with other scans; retry later",
            waited.as_secs_f64(),
            self.scan_deadline.as_secs_f64()
        ))
    }

    /// Per class: reads queued now, served so far and the time they waited; the last row
    /// (`coordinated_scan`) counts the scans coordinated across the cluster.
    pub fn statistics(&self) -> Vec<ClassStatistics> {
        let statistics = |shared: &Shared, class: ReadClass, name: &'static str| {
            let counters = &shared.counters[class.index()];
            ClassStatistics {
                class: name,
                queued: counters.queued.load(Atomic::Relaxed),
                served: counters.served.load(Atomic::Relaxed),
                waited: Duration::from_micros(counters.waited_micros.load(Atomic::Relaxed)),
            }
        };
        let any_scan = ReadClass::Scan(ScanTicket {
            started_micros: 0,
            id: 0,
            width: 1,
            limit: 1,
        });
        let mut rows: Vec<ClassStatistics> =
            [ReadClass::LocalPoint, ReadClass::RemotePoint, any_scan]
                .into_iter()
                .map(|class| match class {
                    ReadClass::Scan(_) => statistics(&self.reads, class, class.name()),
                    ReadClass::LocalPoint | ReadClass::RemotePoint => {
                        statistics(&self.points, class, class.name())
                    }
                })
                .collect();
        rows.push(statistics(&self.coordinated, any_scan, "coordinated_scan"));
        rows
    }
}

/// Chunks of scans served in their turn on the read threads.
struct ChunkTurns {
    reads: Arc<Shared>,
    /// How long a chunk may wait for its turn before it is answered with an error.
    deadline: Duration,
}

impl ScanStage for ChunkTurns {
    fn run(
        &self,
        scan: ScanTicket,
        read: Box<dyn FnOnce() -> ReplicaResponse + Send>,
    ) -> BoxFuture<'static, ReplicaResponse> {
        let deadline = self.deadline;
        let submitted = self
            .reads
            .submit(ReadClass::Scan(scan), Some(deadline), read);
        Box::pin(async move {
            match submitted {
                Ok(answered) => match answered.await {
                    Ok(Ok(response)) => response,
                    Ok(Err(waited)) => ReplicaResponse::Error(format!(
                        "the chunk waited {waited:?} for its turn, longer than {deadline:?}"
                    )),
                    Err(_) => ReplicaResponse::Error("the read failed unexpectedly".into()),
                },
                Err(refused) => ReplicaResponse::Error(refused.message),
            }
        })
    }
}

impl Drop for ReadScheduler {
    fn drop(&mut self) {
        self.reads.stop();
        self.coordinated.stop();
        self.points.stop();
    }
}

fn serve_queue(shared: Arc<Shared>) {
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
mod tests;
