//! Writes started together, applied together: while a thread has a [`WriteDeferral`]
//! open, the batches its requests submit are collected, and applying the deferral writes
//! them as one RocksDB write per engine (see the writer's module documentation).

use super::{Entries, Inline, Operation, Writer};
use crate::{Result, StorageError};
use futures::future::{BoxFuture, FutureExt};
use std::cell::RefCell;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A batch collected by an open [`WriteDeferral`], and where its outcome goes.
struct Deferred {
    writer: Arc<Writer>,
    entries: Entries,
    done: oneshot::Sender<DeferredOutcome>,
}

/// What became of a deferred batch.
enum DeferredOutcome {
    Applied(Result<()>),
    /// The group could not be applied at once (the writer was busy, or RocksDB would have
    /// stalled): the submitter queues its batch for the writer thread.
    Declined(Entries),
}

thread_local! {
    /// The batches collected on this thread while a [`WriteDeferral`] is open.
    static DEFERRED: RefCell<Option<Vec<Deferred>>> = const { RefCell::new(None) };
}

/// Collects `entries` when this thread has a [`WriteDeferral`] open; hands them back
/// otherwise.
pub(super) fn defer(
    writer: &Arc<Writer>,
    entries: Entries,
) -> std::result::Result<BoxFuture<'static, Result<()>>, Entries> {
    DEFERRED.with(|deferred| {
        let mut deferred = deferred.borrow_mut();
        let Some(collected) = deferred.as_mut() else {
            return Err(entries);
        };
        let (done, outcome) = oneshot::channel();
        collected.push(Deferred {
            writer: Arc::clone(writer),
            entries,
            done,
        });
        let writer = Arc::clone(writer);
        Ok(async move {
            match outcome.await {
                Ok(DeferredOutcome::Applied(result)) => result,
                Ok(DeferredOutcome::Declined(entries)) => {
                    writer.submit_queued(Operation::Cells(entries)).await
                }
                Err(_) => Err(StorageError::Io("a deferred write was dropped".into())),
            }
        }
        .boxed())
    })
}

/// While open, [`crate::Engine::write_async`] calls on this thread collect their batches
/// instead of applying them; [`WriteDeferral::apply`] applies everything collected as one
/// write per engine. Open it around a synchronous stretch of code (never across an
/// `.await`: the task may move to another thread), and apply before waiting for any of the
/// writes it collected. Dropping it applies too.
pub struct WriteDeferral {
    /// Not `Send`: the deferral belongs to the thread that opened it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl WriteDeferral {
    /// Starts collecting this thread's writes. Deferrals do not nest: applying or dropping
    /// any one of them applies everything collected so far and ends the collecting.
    pub fn begin() -> WriteDeferral {
        DEFERRED.with(|deferred| {
            deferred.borrow_mut().get_or_insert_with(Vec::new);
        });
        WriteDeferral {
            _thread: std::marker::PhantomData,
        }
    }

    /// Stops collecting and applies what was collected; returns how many batches that
    /// was (their futures are ready or queued for the writer thread).
    pub fn apply(self) -> usize {
        let collected = DEFERRED.with(|deferred| deferred.borrow_mut().take());
        apply_deferred(collected.unwrap_or_default())
    }
}

impl Drop for WriteDeferral {
    fn drop(&mut self) {
        let collected = DEFERRED.with(|deferred| deferred.borrow_mut().take());
        apply_deferred(collected.unwrap_or_default());
    }
}

/// Applies collected batches: one RocksDB write per engine when its writer is free, each
/// batch declined back to its submitter (who queues it) otherwise.
fn apply_deferred(mut collected: Vec<Deferred>) -> usize {
    let count = collected.len();
    while let Some(first) = collected.first() {
        let writer = Arc::clone(&first.writer);
        let (group, rest): (Vec<Deferred>, Vec<Deferred>) = collected
            .into_iter()
            .partition(|deferred| Arc::ptr_eq(&deferred.writer, &writer));
        collected = rest;
        match writer.try_apply_inline(group.iter().flat_map(|deferred| deferred.entries.iter())) {
            Inline::Applied(result) => {
                for deferred in group {
                    let _ = deferred.done.send(DeferredOutcome::Applied(result.clone()));
                }
            }
            Inline::Declined => {
                for deferred in group {
                    let _ = deferred
                        .done
                        .send(DeferredOutcome::Declined(deferred.entries));
                }
            }
        }
    }
    count
}
