//! The threads client connections live on: each connection stays on one thread for its
//! whole life.
//!
//! A connection is one task ([`crate::connection`]): read the client's requests, run them,
//! send the answers, wait for more. On tokio's multi-thread runtime that task wanders. The
//! worker that sleeps in the I/O driver is the one the client's next bytes wake, and it
//! runs the task itself, while the worker that ran the last turn goes to sleep. So every
//! turn of a conversation moves the task to the other core, and costs a sleep and a
//! wake-up on both, with the connection's buffers and the memtable's hot nodes cold in
//! the new core's cache.
//!
//! Here each connection is placed, when it is accepted, on one of a few threads of its
//! own, each with its own current-thread runtime and so its own `epoll`: the thread that
//! waits for a client's next bytes is the thread that runs them. A new connection goes to
//! the thread serving the fewest. The cost is the one of any thread-per-core design:
//! connections on one thread share it even when another thread is idle. So what can take
//! long is not run there — requests run apart (scans, partition slices: see
//! [`crate::connection`]) go to the node's main runtime, whose workers share their tasks —
//! and nor are the node's own connections to its peers ([`crate::internode::Peers`]).
//!
//! Measured with `bench/thread-cpu` (one connection, 64 writes in flight), a node running
//! everything on one worker against two, five runs each, alternating: 92–104k writes/s
//! against 84–91k, 8.4–9.3 µs of the request thread's CPU per write against 9.6–10.5, and
//! 5.6–6.1 µs of the client's against 6.2–6.6 (its sends wake one thread, always the same).

use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long stopping waits for the blocking work a connection thread's requests started.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// One thread and the connections it serves.
struct ConnectionThread {
    runtime: Handle,
    connections: Arc<AtomicUsize>,
}

/// The connection threads of a node.
pub struct ConnectionThreads {
    threads: Vec<ConnectionThread>,
    /// Taken by [`ConnectionThreads::stop`].
    running: Mutex<Vec<RunningThread>>,
}

struct RunningThread {
    stop: oneshot::Sender<()>,
    join: std::thread::JoinHandle<()>,
}

impl ConnectionThreads {
    /// Starts `count` threads (at least one), named `shoal-conn-<n>`.
    pub fn start(count: usize) -> std::io::Result<ConnectionThreads> {
        let mut threads = Vec::new();
        let mut running = Vec::new();
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name(format!("shoal-conn-{index}"))
                .build()?;
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            threads.push(ConnectionThread {
                runtime: runtime.handle().clone(),
                connections: Arc::default(),
            });
            let join = std::thread::Builder::new()
                .name(format!("shoal-conn-{index}"))
                .spawn(move || {
                    let _ = runtime.block_on(stop_rx);
                    runtime.shutdown_timeout(STOP_WAIT);
                })?;
            running.push(RunningThread {
                stop: stop_tx,
                join,
            });
        }
        Ok(ConnectionThreads {
            threads,
            running: Mutex::new(running),
        })
    }

    /// Runs `connection` on the thread serving the fewest connections now, for its whole
    /// life. A socket it serves must be registered on that thread: hand it over as a
    /// `std::net::TcpStream` and make it a tokio one inside the future.
    pub fn place(&self, connection: impl Future<Output = ()> + Send + 'static) {
        let Some(thread) = self
            .threads
            .iter()
            .min_by_key(|thread| thread.connections.load(Ordering::Relaxed))
        else {
            return;
        };
        let open = OpenConnection::counted_in(&thread.connections);
        thread.runtime.spawn(async move {
            connection.await;
            drop(open);
        });
    }

    /// Stops every thread and waits for it to end: connections still open are dropped
    /// (closed). Blocks: call it off the async runtime.
    pub fn stop(&self) {
        let running = std::mem::take(&mut *self.running.lock());
        let joins: Vec<_> = running
            .into_iter()
            .map(|RunningThread { stop, join }| {
                let _ = stop.send(());
                join
            })
            .collect();
        for join in joins {
            let _ = join.join();
        }
    }
}

/// A connection counted on its thread until it ends (dropped with the connection's task,
/// also when its thread stops).
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn counted_in(connections: &Arc<AtomicUsize>) -> OpenConnection {
        connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(Arc::clone(connections))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }

    #[test]
    fn a_connection_runs_on_the_thread_serving_the_fewest() {
        let threads = ConnectionThreads::start(2).unwrap();
        let (release, held) = tokio::sync::watch::channel(false);
        let (names_tx, names_rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let names = names_tx.clone();
            let mut held = held.clone();
            threads.place(async move {
                names.send(thread_name()).unwrap();
                let _ = held.wait_for(|released| *released).await;
            });
        }
        let mut names: Vec<String> = (0..4).map(|_| names_rx.recv().unwrap()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "shoal-conn-0",
                "shoal-conn-0",
                "shoal-conn-1",
                "shoal-conn-1"
            ]
        );
        release.send(true).unwrap();
        threads.stop();
    }

    #[test]
    fn a_closed_connection_makes_room_on_its_thread() {
        let threads = ConnectionThreads::start(2).unwrap();
        let (names_tx, names_rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let names = names_tx.clone();
            threads.place(async move { names.send(thread_name()).unwrap() });
            // Each connection ends before the next is placed: all go to the first thread.
            let name = names_rx.recv().unwrap();
            while threads
                .threads
                .iter()
                .any(|t| t.connections.load(Ordering::Relaxed) > 0)
            {
                std::thread::yield_now();
            }
            assert_eq!(name, "shoal-conn-0");
        }
        threads.stop();
    }

    #[test]
    fn stopping_closes_the_connections_still_open() {
        let threads = ConnectionThreads::start(1).unwrap();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        threads.place(async move {
            let _closed_with_the_task = dropped_tx;
            std::future::pending::<()>().await;
        });
        threads.stop();
        // The sender went with the task: nothing more can arrive.
        assert!(dropped_rx.recv().is_err());
    }
}
