//! A request body read whole, within a size and a deadline, and only when the caller asks for
//! it: a server reads it once the request's head has let its caller through, so a client
//! without a token never holds a connection open by sending a body slowly.

use hyper::body::{Bytes, Incoming};

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("a request body is at most {0} bytes")]
    TooLarge(usize),
    #[error("the request body did not arrive whole within {0:?}")]
    TooSlow(std::time::Duration),
    #[error("the request body could not be read: {0}")]
    Broken(String),
}

/// A request's body: read at most `max` bytes, within a deadline (without one, a client that
/// sends a head and then trickles its body holds its connection and its slot for as long as
/// it likes).
pub enum RequestBody {
    /// Already in hand.
    Read(Bytes),
    /// Still on the connection.
    Unread {
        body: Incoming,
        /// The most bytes read: past it the body is refused ([`BodyError::TooLarge`]).
        max: usize,
        deadline: std::time::Duration,
    },
}

impl RequestBody {
    /// A request that carries no body.
    pub fn none() -> Self {
        RequestBody::Read(Bytes::new())
    }

    /// The body, whole, or why it was not read.
    pub async fn read(self) -> Result<Bytes, BodyError> {
        let (body, max, deadline) = match self {
            RequestBody::Read(b) => return Ok(b),
            RequestBody::Unread {
                body,
                max,
                deadline,
            } => (body, max, deadline),
        };
        let collect = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max));
        match tokio::time::timeout(deadline, collect).await {
            Err(_) => Err(BodyError::TooSlow(deadline)),
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                Err(BodyError::TooLarge(max))
            }
            Ok(Err(e)) => Err(BodyError::Broken(e.to_string())),
        }
    }
}
