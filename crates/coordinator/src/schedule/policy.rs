//! The order reads are served in: a pure data structure, no threads and no clock of its
//! own (time is passed in), so that its behaviour is tested exactly.
//!
//! Classes (seed 002): a *point read* (named rows of named partitions, asked by a client
//! of this node or by another coordinator) is short; a *scan* (a token range or a whole
//! table, one page of it) may be long. [`Ordering::PointFirst`] serves every queued point
//! read before any scan; among scans, with `narrow_first`, the one spanning the fewest
//! tablets comes first, then the one with the smallest limit. **Aging** keeps scans from
//! starving: a scan that has waited [`ReadQueue::aging_bound`] is served next whatever
//! else is queued, so no request is overtaken for longer than that bound (plus the time
//! of the request being served). [`Ordering::Fifo`] serves in arrival order, as
//! Cassandra's read stage does — kept for comparison.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// What kind of read a queued request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadClass {
    /// Named rows read for a client of this node.
    LocalPoint,
    /// Named rows read for another coordinator (this node is a replica).
    RemotePoint,
    /// A token range or a whole table: `width` is the number of tablets it spans, `limit`
    /// the rows it may return.
    Scan { width: u32, limit: u64 },
}

impl ReadClass {
    /// The name `shoal admin` and the metrics give it.
    pub fn name(self) -> &'static str {
        match self {
            ReadClass::LocalPoint => "local_point",
            ReadClass::RemotePoint => "remote_point",
            ReadClass::Scan { .. } => "scan",
        }
    }

    /// Index into per-class counters: local point, remote point, scan.
    pub fn index(self) -> usize {
        match self {
            ReadClass::LocalPoint => 0,
            ReadClass::RemotePoint => 1,
            ReadClass::Scan { .. } => 2,
        }
    }

    fn is_point(self) -> bool {
        !matches!(self, ReadClass::Scan { .. })
    }
}

/// How the queue orders requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Arrival order.
    Fifo,
    /// Point reads before scans; among scans the narrowest first when `narrow_first`, else
    /// the oldest.
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

/// A queued request and when it arrived.
#[derive(Debug)]
struct Queued<T> {
    class: ReadClass,
    arrived: Instant,
    item: T,
}

/// The queue: point reads in arrival order, scans by arrival and by size.
#[derive(Debug)]
pub struct ReadQueue<T> {
    ordering: Ordering,
    aging_bound: Duration,
    capacity: usize,
    next_sequence: u64,
    points: VecDeque<(u64, Queued<T>)>,
    /// Scans by arrival: sequence → their size key.
    scans_by_arrival: BTreeMap<u64, (u32, u64)>,
    /// Scans by size: (width, limit, sequence) → the scan.
    scans_by_size: BTreeMap<(u32, u64, u64), Queued<T>>,
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
            scans_by_size: BTreeMap::new(),
        }
    }

    /// How long a scan may be overtaken before it is served next.
    pub fn aging_bound(&self) -> Duration {
        self.aging_bound
    }

    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    pub fn len(&self) -> usize {
        self.points.len() + self.scans_by_size.len()
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
            ReadClass::Scan { width, limit } => {
                self.scans_by_arrival.insert(sequence, (width, limit));
                self.scans_by_size.insert((width, limit, sequence), queued);
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
            .map(|(s, k)| (*s, *k));
        // The oldest scan has waited the aging bound: it goes next, whatever the order.
        let aged = oldest_scan.is_some_and(|(sequence, (width, limit))| {
            self.scans_by_size
                .get(&(width, limit, sequence))
                .is_some_and(|queued| {
                    now.saturating_duration_since(queued.arrived) >= self.aging_bound
                })
        });
        let oldest_point = self.points.front().map(|(sequence, _)| *sequence);
        let take_scan = match (self.ordering, oldest_point, oldest_scan) {
            (_, None, None) => return None,
            (_, None, Some(_)) => true,
            (_, Some(_), None) => false,
            (Ordering::Fifo, Some(point), Some((scan, _))) => scan < point,
            (Ordering::PointFirst { .. }, Some(_), Some(_)) => aged,
        };
        if !take_scan {
            let (_, queued) = self.points.pop_front()?;
            return Some((queued.class, queued.arrived, queued.item));
        }
        let (sequence, (width, limit)) = oldest_scan?;
        let key = match self.ordering {
            Ordering::PointFirst { narrow_first: true } if !aged => {
                *self.scans_by_size.first_key_value()?.0
            }
            _ => (width, limit, sequence),
        };
        let queued = self.scans_by_size.remove(&key)?;
        self.scans_by_arrival.remove(&key.2);
        Some((queued.class, queued.arrived, queued.item))
    }

    /// The next point read, if one is queued (a scan running lets point reads through at
    /// its checkpoints).
    pub fn pop_point(&mut self) -> Option<(ReadClass, Instant, T)> {
        if self.ordering == Ordering::Fifo {
            return None;
        }
        let (_, queued) = self.points.pop_front()?;
        debug_assert!(queued.class.is_point());
        Some((queued.class, queued.arrived, queued.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ms(count: u64) -> Duration {
        Duration::from_millis(count)
    }

    fn scan(width: u32, limit: u64) -> ReadClass {
        ReadClass::Scan { width, limit }
    }

    /// Pushes `arrivals` (name, class, arrival in ms) and pops everything at `serve_at`
    /// ms after the first arrival, one request per `service` ms; returns the names in
    /// the order served.
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

    const ARRIVALS: &[(&str, ReadClass, u64)] = &[
        (
            "wide scan",
            ReadClass::Scan {
                width: 64,
                limit: 10_000,
            },
            0,
        ),
        ("get 1", ReadClass::LocalPoint, 1),
        (
            "narrow scan",
            ReadClass::Scan {
                width: 1,
                limit: 10,
            },
            2,
        ),
        ("get 2", ReadClass::RemotePoint, 3),
        (
            "medium scan",
            ReadClass::Scan {
                width: 1,
                limit: 5_000,
            },
            4,
        ),
        ("get 3", ReadClass::LocalPoint, 5),
    ];

    #[test]
    fn fifo_serves_in_arrival_order() {
        assert_eq!(
            serve(Ordering::Fifo, 1_000, ARRIVALS, 1),
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
    fn point_first_serves_every_point_read_then_scans_oldest_first() {
        let ordering = Ordering::PointFirst {
            narrow_first: false,
        };
        assert_eq!(
            serve(ordering, 1_000, ARRIVALS, 1),
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
    fn narrow_first_orders_scans_by_tablets_then_limit() {
        let ordering = Ordering::PointFirst { narrow_first: true };
        assert_eq!(
            serve(ordering, 1_000, ARRIVALS, 1),
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
    fn a_scan_that_waited_the_aging_bound_goes_next_whatever_is_queued() {
        // Serving starts 5 ms after the wide scan arrived, one request per millisecond,
        // with a 4 ms bound: each scan goes next once it has waited 4 ms.
        let ordering = Ordering::PointFirst { narrow_first: true };
        assert_eq!(
            serve(ordering, 4, ARRIVALS, 1),
            [
                "wide scan",
                "narrow scan",
                "get 1",
                "medium scan",
                "get 2",
                "get 3"
            ]
        );
    }

    #[test]
    fn no_request_is_overtaken_longer_than_the_aging_bound_under_a_stream_of_point_reads() {
        let ordering = Ordering::PointFirst { narrow_first: true };
        let bound = 10 * MS;
        let start = Instant::now();
        let mut queue = ReadQueue::new(ordering, bound, 1_000);
        queue.push(scan(8, 100), start, "scan").unwrap();
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

    #[test]
    fn a_full_queue_refuses_and_takes_requests_again_once_served() {
        let mut queue = ReadQueue::new(Ordering::Fifo, MS, 2);
        let now = Instant::now();
        queue.push(ReadClass::LocalPoint, now, 1).unwrap();
        queue.push(scan(1, 1), now, 2).unwrap();
        assert_eq!(queue.push(ReadClass::LocalPoint, now, 3), Err(Full));
        assert!(queue.pop(now).is_some());
        assert!(queue.push(ReadClass::LocalPoint, now, 3).is_ok());
    }

    #[test]
    fn scans_let_point_reads_through_at_checkpoints_except_in_fifo_order() {
        let now = Instant::now();
        let mut queue = ReadQueue::new(
            Ordering::PointFirst {
                narrow_first: false,
            },
            MS,
            10,
        );
        queue.push(scan(1, 1), now, "scan").unwrap();
        queue.push(ReadClass::RemotePoint, now, "get").unwrap();
        assert_eq!(queue.pop_point().map(|p| p.2), Some("get"));
        assert_eq!(queue.pop_point().map(|p| p.2), None);
        let mut fifo = ReadQueue::new(Ordering::Fifo, MS, 10);
        fifo.push(ReadClass::RemotePoint, now, "get").unwrap();
        assert_eq!(fifo.pop_point().map(|p| p.2), None);
    }
}
