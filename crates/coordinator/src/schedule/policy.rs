//! The order reads are served in: a pure data structure, no threads and no clock of its
//! own (time is passed in), so that its behaviour is tested exactly.
//!
//! Classes (seed 002): a *point read* (named rows of named partitions, asked by a client
//! of this node or by another coordinator) is short; *scan work* — a whole scan of this
//! node's data, or one chunk of a scan coordinated anywhere — may be long.
//!
//! [`Ordering::PointFirst`] serves every queued point read before any scan work. Scan work
//! is served by its scan's [`ScanTicket`], not by when each piece arrived: every node
//! ranks the chunks of one scan alike, so the scans under way finish one after another
//! instead of all progressing together and all finishing late (processor sharing, which
//! is what arrival order amounts to when each scan is a sequence of chunks). Scans rank by
//! when they began; with `narrow_first`, a wider scan (more of the ring, then a larger
//! limit) ranks as if it had begun up to [`OVERTAKE_WINDOW`] later, so among scans begun
//! close together the narrowest go first, and no scan is ever overtaken by one that began
//! more than [`OVERTAKE_WINDOW`] after it.
//!
//! In the point-first orders the scheduler does not queue point reads at all (it serves
//! them at once and runs scan work at a lower CPU priority, see [`super`]); the queue's
//! point-first rule and aging define the order should they be queued.
//!
//! **Aging** keeps point reads from holding off scan work for ever: once the oldest queued
//! scan work has waited [`ReadQueue::aging_bound`], the best-ranked scan work goes next
//! whatever else is queued. So scans get a thread at least once per aging bound under any
//! stream of point reads, and among scans the overtaking window bounds the wait.
//! [`Ordering::Fifo`] serves everything in arrival order, as Cassandra's read stage does —
//! kept for comparison.

pub use shoal_replication::ScanTicket;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How much later than it began a scan may rank for being wide (narrow-first): a scan is
/// never overtaken by one that began this long after it. Well below
/// `RANGE_READ_TIMEOUT`, so that a chunk overtaken this way is still read.
pub const OVERTAKE_WINDOW: Duration = Duration::from_secs(2);

/// What kind of read a queued request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadClass {
    /// Named rows read for a client of this node.
    LocalPoint,
    /// Named rows read for another coordinator (this node is a replica).
    RemotePoint,
    /// Scan work: a scan of this node's data or one chunk of a scan, in the turn of its
    /// scan.
    Scan(ScanTicket),
}

impl ReadClass {
    /// The name `shoal admin` and the metrics give it.
    pub fn name(self) -> &'static str {
        match self {
            ReadClass::LocalPoint => "local_point",
            ReadClass::RemotePoint => "remote_point",
            ReadClass::Scan(_) => "scan",
        }
    }

    /// Index into per-class counters: local point, remote point, scan.
    pub fn index(self) -> usize {
        match self {
            ReadClass::LocalPoint => 0,
            ReadClass::RemotePoint => 1,
            ReadClass::Scan(_) => 2,
        }
    }
}

/// How the queue orders requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Arrival order.
    Fifo,
    /// Point reads before scan work; scans by when they began, the narrower first among
    /// scans begun close together when `narrow_first`.
    PointFirst { narrow_first: bool },
}

impl std::str::FromStr for Ordering {
    type Err = String;
    fn from_str(text: &str) -> Result<Ordering, String> {
        match text {
            "fifo" => Ok(Ordering::Fifo),
            "point_first" => Ok(Ordering::PointFirst {
                narrow_first: false,
            }),
            "narrow_first" => Ok(Ordering::PointFirst { narrow_first: true }),
            other => Err(format!(
                "unknown read scheduling {other:?}: expected fifo, point_first or narrow_first"
            )),
        }
    }
}

/// Where scan work ranks (smaller first): the moment its scan counts as begun, in
/// microseconds since the epoch, then the scan's random id.
pub type Rank = (u64, u64);

impl Ordering {
    /// The rank of `scan`'s work in this order.
    pub fn rank(self, scan: &ScanTicket) -> Rank {
        let penalty = match self {
            Ordering::PointFirst { narrow_first: true } => size_penalty_micros(scan),
            _ => 0,
        };
        (scan.started_micros.saturating_add(penalty), scan.id)
    }
}

/// Rows at which a scan's limit makes it count as wide as a scan of the whole ring
/// (narrow-first).
pub const FULL_WIDTH_ROWS: u64 = 10_000;

/// How much later a scan ranks for its size, up to [`OVERTAKE_WINDOW`]: in proportion to
/// the larger of its share of the ring and its limit as a share of [`FULL_WIDTH_ROWS`] —
/// what it may have to read. (A scan that stops at a LIMIT below the page size counts as
/// one 64th of the ring, so such scans are ordered by their limits.)
fn size_penalty_micros(scan: &ScanTicket) -> u64 {
    let share_of_ring = f64::from(scan.width.clamp(1, 64) - 1) / 63.0;
    let share_of_rows = scan.limit.min(FULL_WIDTH_ROWS) as f64 / FULL_WIDTH_ROWS as f64;
    (OVERTAKE_WINDOW.as_micros() as f64 * share_of_ring.max(share_of_rows)) as u64
}

/// A queued request and when it arrived.
#[derive(Debug)]
struct Queued<T> {
    class: ReadClass,
    arrived: Instant,
    item: T,
}

/// The queue: point reads in arrival order, scan work by arrival and by rank.
#[derive(Debug)]
pub struct ReadQueue<T> {
    ordering: Ordering,
    aging_bound: Duration,
    capacity: usize,
    next_sequence: u64,
    points: VecDeque<(u64, Queued<T>)>,
    /// Scan work by arrival: sequence → its rank.
    scans_by_arrival: BTreeMap<u64, Rank>,
    /// Scan work by rank: (rank, sequence) → the work.
    scans_by_rank: BTreeMap<(Rank, u64), Queued<T>>,
}

/// The queue is full: the request is refused (the client gets `Overloaded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl<T> ReadQueue<T> {
    /// An empty queue of at most `capacity` requests.
    pub fn new(ordering: Ordering, aging_bound: Duration, capacity: usize) -> ReadQueue<T> {
        ReadQueue {
            ordering,
            aging_bound,
            capacity,
            next_sequence: 0,
            points: VecDeque::new(),
            scans_by_arrival: BTreeMap::new(),
            scans_by_rank: BTreeMap::new(),
        }
    }

    /// How long scan work may be held off by point reads before it is served next.
    pub fn aging_bound(&self) -> Duration {
        self.aging_bound
    }

    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    pub fn len(&self) -> usize {
        self.points.len() + self.scans_by_rank.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point reads waiting.
    pub fn points_waiting(&self) -> usize {
        self.points.len()
    }

    /// Queues `item`; `Full` when the queue holds `capacity` requests already.
    pub fn push(&mut self, class: ReadClass, arrived: Instant, item: T) -> Result<(), Full> {
        if self.len() >= self.capacity {
            return Err(Full);
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let queued = Queued {
            class,
            arrived,
            item,
        };
        match class {
            ReadClass::Scan(scan) => {
                let rank = self.ordering.rank(&scan);
                self.scans_by_arrival.insert(sequence, rank);
                self.scans_by_rank.insert((rank, sequence), queued);
            }
            _ => self.points.push_back((sequence, queued)),
        }
        Ok(())
    }

    /// The next request to serve at `now`, with its class and when it arrived.
    pub fn pop(&mut self, now: Instant) -> Option<(ReadClass, Instant, T)> {
        let oldest_scan = self
            .scans_by_arrival
            .first_key_value()
            .map(|(sequence, rank)| (*sequence, *rank));
        let oldest_point = self.points.front().map(|(sequence, _)| *sequence);
        let take_scan = match (self.ordering, oldest_point, oldest_scan) {
            (_, None, None) => return None,
            (_, None, Some(_)) => true,
            (_, Some(_), None) => false,
            (Ordering::Fifo, Some(point), Some((scan, _))) => scan < point,
            // The oldest scan work has waited the aging bound: scan work goes next.
            (Ordering::PointFirst { .. }, Some(_), Some((sequence, rank))) => self
                .scans_by_rank
                .get(&(rank, sequence))
                .is_some_and(|queued| {
                    now.saturating_duration_since(queued.arrived) >= self.aging_bound
                }),
        };
        if !take_scan {
            let (_, queued) = self.points.pop_front()?;
            return Some((queued.class, queued.arrived, queued.item));
        }
        let key = match self.ordering {
            Ordering::Fifo => {
                let (sequence, rank) = oldest_scan?;
                (rank, sequence)
            }
            Ordering::PointFirst { .. } => *self.scans_by_rank.first_key_value()?.0,
        };
        let queued = self.scans_by_rank.remove(&key)?;
        self.scans_by_arrival.remove(&key.1);
        Some((queued.class, queued.arrived, queued.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// Some moment, in microseconds since the epoch, scans of the tests begin after.
    const EPOCH_MICROS: u64 = 1_800_000_000_000_000;

    fn ms(count: u64) -> Duration {
        Duration::from_millis(count)
    }

    /// A scan begun `began_ms` after [`EPOCH_MICROS`].
    fn ticket(began_ms: u64, width: u32, limit: u64) -> ScanTicket {
        ScanTicket {
            started_micros: EPOCH_MICROS + began_ms * 1000,
            id: began_ms,
            width,
            limit,
        }
    }

    fn scan(began_ms: u64, width: u32, limit: u64) -> ReadClass {
        ReadClass::Scan(ticket(began_ms, width, limit))
    }

    /// Pushes `arrivals` (name, class, arrival in ms) and pops everything from the last
    /// arrival on, one request per `service_ms`; returns the names in the order served.
    fn serve(
        ordering: Ordering,
        aging_ms: u64,
        arrivals: &[(&'static str, ReadClass, u64)],
        service_ms: u64,
    ) -> Vec<&'static str> {
        let start = Instant::now();
        let mut queue = ReadQueue::new(ordering, ms(aging_ms), 100);
        for (name, class, at) in arrivals {
            queue.push(*class, start + ms(*at), *name).unwrap();
        }
        let mut now = start + ms(arrivals.iter().map(|a| a.2).max().unwrap_or(0));
        let mut served = Vec::new();
        while let Some((_, _, name)) = queue.pop(now) {
            served.push(name);
            now += ms(service_ms);
        }
        served
    }

    /// Each scan arrives as it begins.
    fn arrivals() -> Vec<(&'static str, ReadClass, u64)> {
        vec![
            ("wide scan", scan(0, 64, 10_000), 0),
            ("get 1", ReadClass::LocalPoint, 1),
            ("narrow scan", scan(2, 1, 10), 2),
            ("get 2", ReadClass::RemotePoint, 3),
            ("medium scan", scan(4, 1, 5_000), 4),
            ("get 3", ReadClass::LocalPoint, 5),
        ]
    }

    #[test]
    fn fifo_serves_in_arrival_order() {
        assert_eq!(
            serve(Ordering::Fifo, 1_000, &arrivals(), 1),
            [
                "wide scan",
                "get 1",
                "narrow scan",
                "get 2",
                "medium scan",
                "get 3"
            ]
        );
    }

    #[test]
    fn point_first_serves_every_point_read_then_scans_in_the_order_they_began() {
        let ordering = Ordering::PointFirst {
            narrow_first: false,
        };
        assert_eq!(
            serve(ordering, 1_000, &arrivals(), 1),
            [
                "get 1",
                "get 2",
                "get 3",
                "wide scan",
                "narrow scan",
                "medium scan"
            ]
        );
    }

    #[test]
    fn narrow_first_orders_scans_by_what_they_may_read() {
        let ordering = Ordering::PointFirst { narrow_first: true };
        assert_eq!(
            serve(ordering, 1_000, &arrivals(), 1),
            [
                "get 1",
                "get 2",
                "get 3",
                "narrow scan",
                "medium scan",
                "wide scan"
            ]
        );
    }

    #[test]
    fn once_scan_work_waited_the_aging_bound_the_best_ranked_scan_work_goes_next() {
        // Serving starts 5 ms after the wide scan arrived, one request per millisecond,
        // with a 4 ms bound: the wide scan has waited too long at once, so scan work goes
        // first — in rank order — until none is left.
        let ordering = Ordering::PointFirst { narrow_first: true };
        assert_eq!(
            serve(ordering, 4, &arrivals(), 1),
            [
                "narrow scan",
                "medium scan",
                "wide scan",
                "get 1",
                "get 2",
                "get 3"
            ]
        );
    }

    #[test]
    fn scan_work_is_held_off_by_point_reads_no_longer_than_the_aging_bound() {
        let ordering = Ordering::PointFirst { narrow_first: true };
        let bound = 10 * MS;
        let start = Instant::now();
        let mut queue = ReadQueue::new(ordering, bound, 1_000);
        queue.push(scan(0, 8, 100), start, "scan").unwrap();
        // A point read arrives every millisecond and each takes a millisecond: without
        // aging the scan would wait forever.
        let mut now = start;
        let mut served_scan_at = None;
        for tick in 0..100u32 {
            queue.push(ReadClass::LocalPoint, now, "get").unwrap();
            if let Some((_, arrived, name)) = queue.pop(now) {
                if name == "scan" {
                    served_scan_at = Some(now.duration_since(arrived));
                    break;
                }
            }
            now = start + (tick + 1) * MS;
        }
        let waited = served_scan_at.expect("the scan was served");
        assert!(waited >= bound && waited <= bound + MS, "waited {waited:?}");
    }

    /// Two scans of three chunks each, begun 1 ms apart, on one read thread: a scan sends
    /// its next chunk when the previous one is answered. Returns the chunks in the order
    /// served.
    fn two_scans_of_chunks(ordering: Ordering) -> Vec<&'static str> {
        let chunks = |scan: &str| -> Vec<&'static str> {
            match scan {
                "a" => vec!["a1", "a2", "a3"],
                _ => vec!["b1", "b2", "b3"],
            }
        };
        let start = Instant::now();
        let mut queue = ReadQueue::new(ordering, Duration::from_secs(1), 100);
        let tickets = [("a", ticket(0, 8, 1_000)), ("b", ticket(1, 8, 1_000))];
        let mut next = [0usize, 0usize];
        for (scan, ticket) in &tickets {
            queue
                .push(ReadClass::Scan(*ticket), start, chunks(scan)[0])
                .unwrap();
        }
        let mut served = Vec::new();
        let mut now = start;
        while let Some((_, _, chunk)) = queue.pop(now) {
            served.push(chunk);
            now += MS;
            let which = usize::from(chunk.starts_with('b'));
            next[which] += 1;
            let (scan, ticket) = &tickets[which];
            if let Some(following) = chunks(scan).get(next[which]) {
                queue
                    .push(ReadClass::Scan(*ticket), now, following)
                    .unwrap();
            }
        }
        served
    }

    #[test]
    fn chunks_are_served_by_their_scan_so_scans_finish_one_after_another() {
        for narrow_first in [false, true] {
            assert_eq!(
                two_scans_of_chunks(Ordering::PointFirst { narrow_first }),
                ["a1", "a2", "a3", "b1", "b2", "b3"]
            );
        }
        // In arrival order the scans' chunks alternate: both finish late.
        assert_eq!(
            two_scans_of_chunks(Ordering::Fifo),
            ["a1", "b1", "a2", "b2", "a3", "b3"]
        );
    }

    #[test]
    fn a_scan_is_never_overtaken_by_one_that_began_more_than_the_window_after_it() {
        let ordering = Ordering::PointFirst { narrow_first: true };
        let wide = ticket(0, 64, u64::MAX);
        let window_ms = OVERTAKE_WINDOW.as_millis() as u64;
        // The narrowest scan begun within the window goes first...
        assert!(ordering.rank(&ticket(window_ms / 2, 1, 1)) < ordering.rank(&wide));
        // ...one begun after it does not, however narrow.
        assert!(ordering.rank(&ticket(window_ms, 1, 1)) > ordering.rank(&wide));
        // The larger of the share of the ring and the limit counts.
        assert!(ordering.rank(&ticket(0, 1, 100)) < ordering.rank(&ticket(0, 1, 5_000)));
        assert!(ordering.rank(&ticket(0, 2, 10)) < ordering.rank(&ticket(0, 64, 10)));
        assert_eq!(
            ordering.rank(&ticket(0, 64, 10)),
            ordering.rank(&ticket(0, 64, 10_000))
        );
        // Under the other orders scans rank by when they began.
        let point_first = Ordering::PointFirst {
            narrow_first: false,
        };
        assert!(point_first.rank(&wide) < point_first.rank(&ticket(1, 1, 1)));
    }

    #[test]
    fn a_full_queue_refuses_and_takes_requests_again_once_served() {
        let mut queue = ReadQueue::new(Ordering::Fifo, MS, 2);
        let now = Instant::now();
        queue.push(ReadClass::LocalPoint, now, 1).unwrap();
        queue.push(scan(0, 1, 1), now, 2).unwrap();
        assert_eq!(queue.push(ReadClass::LocalPoint, now, 3), Err(Full));
        assert!(queue.pop(now).is_some());
        assert!(queue.push(ReadClass::LocalPoint, now, 3).is_ok());
    }
}
