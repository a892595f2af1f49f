//! The streaming lane's own runtime: one thread, at streaming's lower CPU priority, that
//! moves every streamed byte through the sockets.
//!
//! The reading and file-building threads of streaming were already niced, but the
//! megabytes of every chunk still crossed the node's runtime workers: the source's worker
//! copied each chunk into its socket (and, on loopback, ran the receiver's TCP work
//! too), the destination's copied it out. Those workers are the ones that serve client
//! requests, at normal priority — so under a client load, streaming's socket work took
//! the cores as readily as the requests did, and a request waited behind a chunk's copy.
//!
//! So the connections of the streaming lane run here instead, on a single-threaded Tokio
//! runtime whose thread has the niceness of streaming's other threads (`stream_nice`):
//! - the destination's jobs ([`super::incoming`]) are spawned on it, and with them the
//!   lane's outgoing connections they open (their reader and writer tasks);
//! - the source's side of those connections is handed over to it as soon as the
//!   connection names itself a streaming-lane connection
//!   ([`crate::internode::STREAMING_LANE_PREFACE`]).
//!
//! When client requests want the CPU, the kernel gives it to them first, and streaming
//! moves its bytes with what is left — the priority seed 004 asks for, set explicitly.
//! The sockets are registered with this runtime's own I/O driver too, so that their
//! readiness wakes this thread and no worker of the main runtime (an accepted socket is
//! moved here from the main runtime's driver; one inside a TLS session stays registered
//! there, and only its tasks run here).

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The runtime of the streaming lane, running until [`LaneRuntime::stop`] (or drop).
pub struct LaneRuntime {
    handle: Handle,
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

impl LaneRuntime {
    /// Starts the runtime on a thread of its own at niceness `nice`.
    pub fn start(nice: u8) -> std::io::Result<LaneRuntime> {
        let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("shoal-stream-io".into())
            .spawn(move || {
                shoal_coordinator::schedule::lower_thread_priority(nice);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = handle_tx.send(Err(error));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(runtime.handle().clone()));
                // Runs the lane's tasks until stopped; dropping the runtime then ends them.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        let handle = handle_rx.recv().map_err(|_| {
            std::io::Error::other("the streaming lane's thread ended before its runtime started")
        })??;
        Ok(LaneRuntime {
            handle,
            stop: Mutex::new(Some(stop)),
        })
    }

    /// Where the lane's tasks are spawned.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Ends the runtime: every task on it (jobs, connections) is dropped.
    pub fn stop(&self) {
        if let Some(stop) = self.stop.lock().take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for LaneRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_the_lane_thread_until_it_stops() {
        let lane = LaneRuntime::start(0).unwrap();
        let name = futures::executor::block_on(
            lane.handle()
                .spawn(async { std::thread::current().name().map(str::to_string) }),
        )
        .unwrap();
        assert_eq!(name.as_deref(), Some("shoal-stream-io"));
        let (_never, pending) = oneshot::channel::<()>();
        let waiting = lane.handle().spawn(async move {
            let _ = pending.await;
        });
        lane.stop();
        let ended = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(10), waiting).await
            });
        let joined = ended.expect("the task ended when the lane stopped");
        assert!(joined.unwrap_err().is_cancelled());
    }
}
