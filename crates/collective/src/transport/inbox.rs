//! The queue between a network transport's reader (a thread or a task) and `recv`.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use crate::header::Message;

/// What a reader hands over: a message, or why its connection ended.
pub(crate) enum Inbound {
    Message(Message),
    Closed(String),
}

/// The next message from a reader's queue: `Ok(None)` past the deadline, `Err(reason)` once
/// the connection has ended.
pub(crate) fn receive(
    inbox: &Receiver<Inbound>,
    deadline: Instant,
) -> Result<Option<Message>, String> {
    match inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Inbound::Message(message)) => Ok(Some(message)),
        Ok(Inbound::Closed(reason)) => Err(reason),
        Err(RecvTimeoutError::Timeout) => Ok(None),
        Err(RecvTimeoutError::Disconnected) => Err("its reader stopped".into()),
    }
}
