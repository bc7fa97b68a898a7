//! One request's tries of members, as [`crate::wake`] and the listeners share them.

use crate::forward::HopError;
use crate::members::MemberKey;

/// One request's tries of members: at most `attempts` (one when pinned), each member tried
/// once, and one hold again once every member went down under it.
#[derive(Debug)]
pub(crate) struct Tries {
    pub(crate) attempts: usize,
    pub(crate) made: usize,
    pub(crate) reheld: bool,
    pub(crate) tried: Vec<MemberKey>,
    pub(crate) last: Option<HopError>,
}

impl Tries {
    pub(crate) fn new(attempts: usize) -> Self {
        Self {
            attempts,
            made: 0,
            reheld: false,
            tried: Vec::new(),
            last: None,
        }
    }
}
