//! Reading files that other programs write: a poll can catch a file between its truncation and
//! its write. A change is acted on once two polls in a row read the same content, so a file
//! caught mid-write is never taken for what its writer meant (an empty proxies file would
//! otherwise read as "every Proxy was removed").

/// The last content acted on and a change waiting to be read again unchanged.
#[derive(Debug)]
pub struct Settle<T> {
    acted: Option<T>,
    pending: Option<T>,
}

impl<T> Default for Settle<T> {
    fn default() -> Self {
        Self {
            acted: None,
            pending: None,
        }
    }
}

impl<T: PartialEq + Clone> Settle<T> {
    /// Starts from content already acted on: only a change of it is acted on, once settled.
    pub fn acting_on(content: T) -> Self {
        Self {
            acted: Some(content),
            pending: None,
        }
    }

    /// Feeds one poll's read. Returns the content to act on: the first read ever (there is
    /// nothing older to keep serving), or a changed content read twice in a row.
    pub fn observe(&mut self, read: T) -> Option<T> {
        if self.acted.is_none() || self.pending.as_ref() == Some(&read) {
            self.pending = None;
            self.acted = Some(read.clone());
            return Some(read);
        }
        if self.acted.as_ref() == Some(&read) {
            // A change that reverted before it settled never happened.
            self.pending = None;
            return None;
        }
        self.pending = Some(read);
        None
    }

    /// Records content acted on without waiting (a first load, a reload asked for directly);
    /// a change pending until then is dropped.
    pub fn acted_on(&mut self, content: T) {
        self.pending = None;
        self.acted = Some(content);
    }

    /// The content last acted on.
    pub fn current(&self) -> Option<&T> {
        self.acted.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_read_is_acted_on_at_once() {
        let mut s = Settle::default();
        assert_eq!(s.observe("a"), Some("a"));
        assert_eq!(s.observe("a"), None, "unchanged");
    }

    #[test]
    fn a_change_is_acted_on_when_read_twice_in_a_row() {
        let mut s = Settle::default();
        s.observe("a");
        assert_eq!(s.observe("ab"), None, "first sight");
        assert_eq!(s.observe("ab"), Some("ab"), "settled");
        assert_eq!(s.observe("ab"), None, "acted on once");
    }

    #[test]
    fn a_file_caught_mid_write_is_never_acted_on() {
        let mut s = Settle::default();
        s.observe("a\nb\n");
        // Truncated, then written: the empty read is passed over.
        assert_eq!(s.observe(""), None);
        assert_eq!(s.observe("a\n"), None, "moved since the last poll");
        assert_eq!(s.observe("a\n"), Some("a\n"));
    }

    #[test]
    fn a_change_that_reverts_before_settling_is_dropped() {
        let mut s = Settle::default();
        s.observe("a");
        assert_eq!(s.observe(""), None);
        assert_eq!(s.observe("a"), None, "back to what is served");
        assert_eq!(s.observe(""), None, "first sight again, not settled");
    }

    #[test]
    fn content_acted_on_elsewhere_is_the_new_reference() {
        let mut s = Settle::acting_on("a");
        assert_eq!(s.observe("b"), None, "first sight");
        s.acted_on("b");
        assert_eq!(s.observe("b"), None, "already acted on");
        assert_eq!(s.current(), Some(&"b"));
    }
}
