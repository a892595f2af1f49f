//! [`DirectedCursor`]: the engine's [`Cursor`] over any RocksDB iterator, forward or
//! reverse.
//!
//! The engine reads through two kinds of iterator: rust-rocksdb's
//! [`DBRawIteratorWithThreadMode`] (scans and streaming, one iterator per read) and the
//! pooled iterators partition reads reuse ([`super::iterator_pool`]), which are driven
//! through the C API directly. Both move the same way, so what a cursor's direction means
//! — which way `advance` goes, where `skip_to` lands in reverse — is written once, here,
//! over the handful of moves [`RawIterator`] names.

use crate::{Cursor, Result};
use rocksdb::{DBRawIteratorWithThreadMode, DB};

/// The moves of a RocksDB iterator a [`DirectedCursor`] is made of.
pub(crate) trait RawIterator {
    /// True while the iterator is on an entry.
    fn valid(&self) -> bool;
    /// The entry the iterator is on, or `None` when it is not on one (exhausted, out of
    /// bounds, or failed: see [`RawIterator::status`]).
    fn entry(&self) -> Option<(&[u8], &[u8])>;
    fn seek_to_first(&mut self);
    fn seek_to_last(&mut self);
    /// To the first key `>= key`.
    fn seek(&mut self, key: &[u8]);
    /// To the last key `<= key`.
    fn seek_for_prev(&mut self, key: &[u8]);
    /// To the next key; only called while on an entry.
    fn next(&mut self);
    /// To the previous key; only called while on an entry.
    fn prev(&mut self);
    /// The I/O or corruption error the iterator stopped on, if any.
    fn status(&self) -> Result<()>;
}

/// A [`Cursor`] walking an iterator's range forward or in reverse.
pub(crate) struct DirectedCursor<I> {
    iterator: I,
    reverse: bool,
}

impl<I: RawIterator> DirectedCursor<I> {
    /// A cursor on the first entry of `iterator`'s range in its direction (the last one
    /// when `reverse`).
    pub(crate) fn start(mut iterator: I, reverse: bool) -> DirectedCursor<I> {
        if reverse {
            iterator.seek_to_last();
        } else {
            iterator.seek_to_first();
        }
        DirectedCursor { iterator, reverse }
    }

    /// The iterator back, wherever the cursor left it.
    pub(crate) fn into_iterator(self) -> I {
        self.iterator
    }
}

impl<I: RawIterator> Cursor for DirectedCursor<I> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.iterator.entry()
    }

    fn advance(&mut self) {
        if !self.iterator.valid() {
            return;
        }
        if self.reverse {
            self.iterator.prev();
        } else {
            self.iterator.next();
        }
    }

    fn skip_to(&mut self, key: &[u8]) {
        if self.reverse {
            // Last key < `key`: seek_for_prev finds the last key <= key.
            self.iterator.seek_for_prev(key);
            if self.iterator.entry().is_some_and(|(found, _)| found == key) {
                self.iterator.prev();
            }
        } else {
            self.iterator.seek(key);
        }
    }

    fn status(&self) -> Result<()> {
        self.iterator.status()
    }
}

impl RawIterator for DBRawIteratorWithThreadMode<'_, DB> {
    fn valid(&self) -> bool {
        DBRawIteratorWithThreadMode::valid(self)
    }

    fn entry(&self) -> Option<(&[u8], &[u8])> {
        self.item()
    }

    fn seek_to_first(&mut self) {
        DBRawIteratorWithThreadMode::seek_to_first(self);
    }

    fn seek_to_last(&mut self) {
        DBRawIteratorWithThreadMode::seek_to_last(self);
    }

    fn seek(&mut self, key: &[u8]) {
        DBRawIteratorWithThreadMode::seek(self, key);
    }

    fn seek_for_prev(&mut self, key: &[u8]) {
        DBRawIteratorWithThreadMode::seek_for_prev(self, key);
    }

    fn next(&mut self) {
        DBRawIteratorWithThreadMode::next(self);
    }

    fn prev(&mut self) {
        DBRawIteratorWithThreadMode::prev(self);
    }

    fn status(&self) -> Result<()> {
        DBRawIteratorWithThreadMode::status(self).map_err(super::io_error)
    }
}
