use super::*;
use futures::FutureExt;

/// Keeps the one read thread of `stage` busy (with the chunk of a scan begun first)
/// until the sender is dropped or sent to; returns once the chunk is running.
///
/// On a loaded machine the read thread may come to the chunk only after a short scan
/// deadline, and then refuses it unread; the chunk is then offered again, so that the
/// caller always gets a busy thread, however slow the machine.
fn occupy(
    stage: &Arc<dyn ScanStage>,
) -> (
    std::sync::mpsc::Sender<()>,
    BoxFuture<'static, ReplicaResponse>,
) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        let busy = stage.run(
            ticket(0),
            Box::new(move || {
                let _ = started.send(());
                let _ = released.recv_timeout(Duration::from_secs(10));
                ReplicaResponse::Applied
            }),
        );
        let remaining = give_up.saturating_duration_since(Instant::now());
        match running.recv_timeout(remaining) {
            Ok(()) => return (release, busy),
            // Refused unread (the closure was dropped): it waited past the deadline.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) if Instant::now() < give_up => {}
            Err(error) => panic!("the read thread never took the chunk: {error}"),
        }
    }
}

/// A ticket for a scan begun `began_ms` after some moment.
fn ticket(began_ms: u64) -> ScanTicket {
    ScanTicket {
        started_micros: 1_800_000_000_000_000 + began_ms * 1000,
        id: began_ms,
        width: 1,
        limit: 100,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_queued_behind_a_busy_read_thread_are_served_by_their_scans_tickets() {
    for ordering in [
        Ordering::PointFirst { narrow_first: true },
        Ordering::PointFirst {
            narrow_first: false,
        },
        Ordering::Fifo,
    ] {
        let scheduler = ReadScheduler::new(ordering, 1);
        assert_eq!(scheduler.point_read_inline(), ordering != Ordering::Fifo);
        // The one read thread is busy until released: everything after it queues.
        let stage = scheduler.chunk_stage();
        let (release, busy) = occupy(&stage);
        let served = Arc::new(Mutex::new(Vec::new()));
        let chunk = |name: &'static str, began_ms: u64| {
            let served = Arc::clone(&served);
            stage.run(
                ticket(began_ms),
                Box::new(move || {
                    served.lock().push(name);
                    ReplicaResponse::Applied
                }),
            )
        };
        // The later scan's chunk arrives first.
        let later = chunk("later scan", 20);
        let earlier = chunk("earlier scan", 10);
        let _ = release.send(());
        let (busy, later, earlier) = futures::join!(busy, later, earlier);
        assert!(matches!(busy, ReplicaResponse::Applied));
        assert!(matches!(later, ReplicaResponse::Applied));
        assert!(matches!(earlier, ReplicaResponse::Applied));
        let expected = match ordering {
            Ordering::Fifo => ["later scan", "earlier scan"],
            Ordering::PointFirst { .. } => ["earlier scan", "later scan"],
        };
        assert_eq!(*served.lock(), expected, "{ordering:?}");
        let statistics = scheduler.statistics();
        assert_eq!(statistics[2].class, "scan");
        assert_eq!(statistics[2].served, 3);
        assert!(statistics.iter().all(|s| s.queued == 0));
    }
}

/// A point read queued in a point-first order is one that needs the disk: it goes to a
/// point thread and never waits for the scan work busy on the read threads. In arrival
/// order it takes its turn behind that work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_point_read_waits_for_scan_work_only_in_arrival_order() {
    for ordering in [Ordering::PointFirst { narrow_first: true }, Ordering::Fifo] {
        let scheduler = ReadScheduler::new(ordering, 1);
        let stage = scheduler.chunk_stage();
        let (release, busy) = occupy(&stage);
        let mut point = Box::pin(scheduler.run(ReadClass::LocalPoint, || 7));
        match ordering {
            Ordering::PointFirst { .. } => {
                let answer = tokio::time::timeout(Duration::from_secs(10), &mut point)
                    .await
                    .expect("the point read is served while the read thread is busy");
                assert_eq!(answer.expect("read"), 7);
                let _ = release.send(());
            }
            Ordering::Fifo => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert!(
                    (&mut point).now_or_never().is_none(),
                    "the point read waits for the chunk before it"
                );
                let _ = release.send(());
                assert_eq!(point.await.expect("read"), 7);
            }
        }
        assert!(matches!(busy.await, ReplicaResponse::Applied));
        let statistics = scheduler.statistics();
        assert_eq!(statistics[0].class, "local_point");
        assert_eq!(statistics[0].served, 1, "{ordering:?}");
    }
}

/// Reads of data not in memory stay on their task while they find their blocks in
/// the page cache, move to the point threads after one reads from a disk, and come
/// back once a few in a row found their blocks cached again.
#[test]
fn misses_move_off_the_task_while_they_read_from_a_disk() {
    let misses = DiskMisses::default();
    assert!(!misses.waits_for_disk(), "nothing counted yet");
    for _ in 0..100 {
        misses.record(false);
    }
    assert!(!misses.waits_for_disk());
    misses.record(true);
    assert!(misses.waits_for_disk(), "one read from a disk is enough");
    let mut cached_reads = 0;
    while misses.waits_for_disk() {
        misses.record(false);
        cached_reads += 1;
    }
    assert!(
        (3..=16).contains(&cached_reads),
        "back on the task after a few cached reads, not {cached_reads}"
    );
    // Where most reads go to the disk, they stay off the task.
    for read in 0..100 {
        misses.record(read % 4 != 0);
        if read >= 8 {
            assert!(misses.waits_for_disk(), "read {read}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_queued_past_its_deadline_is_refused_unread() {
    let deadline = Duration::from_millis(50);
    let scheduler = ReadScheduler::new(Ordering::PointFirst { narrow_first: true }, 1)
        .with_scan_deadline(deadline);
    let stage = scheduler.chunk_stage();
    let (release, busy) = occupy(&stage);
    let ran = Arc::new(AtomicBool::new(false));
    let scan = {
        let ran = Arc::clone(&ran);
        scheduler.run(ReadClass::Scan(ticket(1)), move || {
            ran.store(true, Atomic::SeqCst)
        })
    };
    let chunk = {
        let ran = Arc::clone(&ran);
        stage.run(
            ticket(2),
            Box::new(move || {
                ran.store(true, Atomic::SeqCst);
                ReplicaResponse::Applied
            }),
        )
    };
    // Both are queued (submitted on their first poll) before the read thread frees up,
    // which happens only after their deadline.
    let released = async {
        tokio::time::sleep(deadline * 3).await;
        let _ = release.send(());
    };
    let (scan, chunk, ()) = futures::join!(scan, chunk, released);
    let refused = scan.expect_err("a scan queued past its deadline is refused");
    assert_eq!(
        refused.code,
        shoal_cql::ErrorCode::Overloaded,
        "{refused:?}"
    );
    assert!(
        refused.message.contains("busy with other scans"),
        "{refused:?}"
    );
    assert!(matches!(chunk, ReplicaResponse::Error(ref m) if m.contains("for its turn")));
    assert!(!ran.load(Atomic::SeqCst), "neither was read");
    assert!(matches!(busy.await, ReplicaResponse::Applied));
    // A point read has no deadline: queued as long, it is still served (FIFO queues it).
    let fifo = ReadScheduler::new(Ordering::Fifo, 1).with_scan_deadline(deadline);
    let (release, busy) = occupy(&fifo.chunk_stage());
    let point = fifo.run(ReadClass::LocalPoint, || 5);
    let released = async {
        tokio::time::sleep(deadline * 3).await;
        let _ = release.send(());
    };
    let (point, ()) = futures::join!(point, released);
    assert_eq!(point.unwrap(), 5);
    assert!(matches!(busy.await, ReplicaResponse::Applied));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_read_whose_requester_went_away_is_not_run() {
    let scheduler = ReadScheduler::new(Ordering::PointFirst { narrow_first: true }, 1);
    let (release, busy) = occupy(&scheduler.chunk_stage());
    let ran = Arc::new(AtomicBool::new(false));
    let abandoned = {
        let ran = Arc::clone(&ran);
        scheduler.run(ReadClass::Scan(ticket(1)), move || {
            ran.store(true, Atomic::SeqCst)
        })
    };
    // Polled once (so queued), then dropped, as when the client's connection closes.
    assert!(abandoned.now_or_never().is_none());
    // A read queued after it is served after it: by then the abandoned one had its turn.
    let after = scheduler.run(ReadClass::Scan(ticket(2)), || 9);
    let _ = release.send(());
    assert_eq!(after.await.unwrap(), 9);
    assert!(!ran.load(Atomic::SeqCst), "the abandoned read was not run");
    assert!(matches!(busy.await, ReplicaResponse::Applied));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinated_scan_runs_on_a_scan_thread_while_the_read_threads_are_busy() {
    let scheduler = ReadScheduler::new(Ordering::PointFirst { narrow_first: true }, 1);
    let (release, busy) = occupy(&scheduler.chunk_stage());
    // A coordinated scan waits for chunks; it must not need the read thread.
    let scan = scheduler.run_coordinated_scan(ticket(1), || 7);
    let answer = tokio::time::timeout(Duration::from_secs(10), scan).await;
    let _ = release.send(());
    assert_eq!(answer.expect("the scan ran at once").unwrap(), 7);
    assert!(matches!(busy.await, ReplicaResponse::Applied));
    assert_eq!(scheduler.statistics()[3].class, "coordinated_scan");
    assert_eq!(scheduler.statistics()[3].served, 1);
}
