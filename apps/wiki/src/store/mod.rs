//! Where the wiki keeps its pages: one trait, two stores — Shoal ([`shoal`]) and MariaDB
//! ([`mariadb`]) — so the web layer and the benchmark run the very same wiki on either.
//!
//! A page's text lives in its current version and in its full history of revisions; a
//! revision is named by a time-based UUID (a Cassandra `timeuuid`), which orders the
//! history and says when it was saved. Saving names the revision the editor started from
//! (`base`): if the page has moved on since, nothing is written and the caller gets the
//! current page back ([`SaveOutcome::Conflict`]). Saving an empty text deletes the page
//! (its history stays).

pub mod mariadb;
pub mod shoal;

use anyhow::{bail, Result};
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A page as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub title: String,
    pub text: String,
    pub revision: Uuid,
}

/// One entry of a page's history.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionInfo {
    pub revision: Uuid,
    /// The text's length in bytes; 0 for a deletion.
    pub size: usize,
    pub deleted: bool,
}

/// A page as it was at one revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Revision {
    pub title: String,
    pub revision: Uuid,
    pub text: String,
    pub deleted: bool,
}

/// One line of RecentChanges.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub title: String,
    pub revision: Uuid,
    pub deleted: bool,
}

/// An edit to save: the new text of `title`, made from revision `base` (`None` when the
/// editor started from a page that did not exist).
#[derive(Debug, Clone)]
pub struct Edit {
    pub title: String,
    pub text: String,
    pub base: Option<Uuid>,
}

/// What saving an edit did.
#[derive(Debug, Clone, PartialEq)]
pub enum SaveOutcome {
    /// The new revision was written (a deletion when the text was empty).
    Saved(Uuid),
    /// The text was empty and there was no page: nothing to do.
    NothingToDelete,
    /// The page changed since `base`: nothing was written. The page as it is now (`None`
    /// when it was deleted meanwhile).
    Conflict(Option<Page>),
}

/// The wiki's storage.
#[async_trait]
pub trait WikiStore: Send + Sync {
    /// The store's name, as shown on pages and in the benchmark.
    fn name(&self) -> &'static str;
    /// The current version of a page.
    async fn page(&self, title: &str) -> Result<Option<Page>>;
    /// Which of `titles` are pages now.
    async fn existing(&self, titles: &[String]) -> Result<BTreeSet<String>>;
    /// Saves an edit, unless the page moved on since the edit's base.
    async fn save(&self, edit: &Edit) -> Result<SaveOutcome>;
    /// A page's history, newest first.
    async fn history(&self, title: &str) -> Result<Vec<RevisionInfo>>;
    /// One revision of a page.
    async fn revision(&self, title: &str, revision: Uuid) -> Result<Option<Revision>>;
    /// The latest changes to any page, newest first, at most `limit`.
    async fn recent_changes(&self, limit: usize) -> Result<Vec<Change>>;
    /// Every page's title, sorted.
    async fn titles(&self) -> Result<Vec<String>>;
    /// The titles of the pages that have every one of `terms`, sorted.
    async fn search(&self, terms: &BTreeSet<String>) -> Result<Vec<String>>;
}

/// The longest title accepted, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// The longest text accepted, in bytes.
pub const MAX_TEXT_BYTES: usize = 512 * 1024;

/// Checks a title a user typed: not empty, not too long, no control characters, no
/// spaces at either end.
pub fn check_title(title: &str) -> Result<()> {
    if title.is_empty() {
        bail!("a page needs a title");
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        bail!("a title has at most {MAX_TITLE_CHARS} characters");
    }
    if title.chars().any(char::is_control) {
        bail!("a title cannot contain control characters");
    }
    if title.trim() != title {
        bail!("a title cannot start or end with a space");
    }
    Ok(())
}

/// The node id of this process's time-based UUIDs (random, with the multicast bit set as
/// RFC 4122 asks of ids that are not a MAC address).
static NODE_ID: LazyLock<[u8; 6]> = LazyLock::new(|| {
    let mut id: [u8; 6] = rand::random();
    id[0] |= 0x01;
    id
});

/// A new revision id: a version-1 (time-based) UUID, as Cassandra's `now()`.
pub fn new_revision() -> Uuid {
    Uuid::now_v1(&NODE_ID)
}

/// When a revision was saved.
pub fn revision_time(revision: Uuid) -> SystemTime {
    match revision.get_timestamp() {
        Some(timestamp) => {
            let (seconds, nanos) = timestamp.to_unix();
            UNIX_EPOCH + Duration::new(seconds, nanos)
        }
        None => UNIX_EPOCH,
    }
}

/// A revision's time in 100 ns units since 1582 (a timeuuid's own clock): sorts
/// revisions in the order they were made.
pub fn revision_ticks(revision: Uuid) -> u64 {
    revision
        .get_timestamp()
        .map(|timestamp| timestamp.to_gregorian().0)
        .unwrap_or(0)
}

/// The search-index changes of replacing `old` text by `new`: terms to add, terms to
/// remove.
pub fn term_changes(
    title: &str,
    old: Option<&str>,
    new: Option<&str>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let old = old.map_or_else(BTreeSet::new, |text| crate::search::page_terms(title, text));
    let new = new.map_or_else(BTreeSet::new, |text| crate::search::page_terms(title, text));
    let added = new.difference(&old).cloned().collect();
    let removed = old.difference(&new).cloned().collect();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_sort_by_the_time_they_were_made() {
        let first = new_revision();
        let second = new_revision();
        assert!(revision_ticks(first) < revision_ticks(second));
        let age = SystemTime::now()
            .duration_since(revision_time(second))
            .unwrap();
        assert!(age < Duration::from_secs(5), "{age:?}");
    }

    #[test]
    fn titles_are_checked() {
        assert!(check_title("FrontPage").is_ok());
        assert!(check_title("日本語のページ").is_ok());
        assert!(check_title("").is_err());
        assert!(check_title(" padded").is_err());
        assert!(check_title("line\nbreak").is_err());
        assert!(check_title(&"x".repeat(MAX_TITLE_CHARS + 1)).is_err());
    }

    #[test]
    fn term_changes_add_new_terms_and_remove_gone_ones() {
        let (added, removed) = term_changes("Page", Some("old shared"), Some("new shared"));
        assert_eq!(added.into_iter().collect::<Vec<_>>(), ["new"]);
        assert_eq!(removed.into_iter().collect::<Vec<_>>(), ["old"]);
        let (added, removed) = term_changes("Page", Some("gone"), None);
        assert!(added.is_empty());
        assert_eq!(removed.into_iter().collect::<Vec<_>>(), ["gone", "page"]);
    }
}
