//! A listening socket handed over by the process that started this one, in systemd's
//! socket-activation protocol (`LISTEN_FDS=1`, the socket as file descriptor 3), which
//! the `lockstep` launcher speaks: the launcher binds every task's port and passes the bound
//! socket on, so no other program can take the port between the launcher choosing it and the
//! task listening on it.

use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};

use lockstep_cluster::Address;

use crate::error::CollectiveError;

/// The handed-over socket, taken from the environment once per process: a descriptor must have
/// one owner, however many communicators the process creates.
fn handed_over() -> &'static Mutex<Option<TcpListener>> {
    static LISTENER: OnceLock<Mutex<Option<TcpListener>>> = OnceLock::new();
    LISTENER.get_or_init(|| {
        let listener = listenfd::ListenFd::from_env()
            .take_tcp_listener(0)
            .unwrap_or_else(|e| {
                tracing::warn!(%e, "LISTEN_FDS names no TCP listener; binding the address instead");
                None
            });
        Mutex::new(listener)
    })
}

/// The listener handed to this process for `address`, if there is one and it is not taken.
///
/// # Errors
///
/// [`CollectiveError::Setup`] when the handed-over socket listens on another port than
/// `address` names: the launcher and the cluster spec disagree.
pub(crate) fn take_listener(address: &str) -> Result<Option<TcpListener>, CollectiveError> {
    let taken = handed_over()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let Some(listener) = taken else {
        return Ok(None);
    };
    let bound = listener
        .local_addr()
        .map_err(|e| CollectiveError::Setup(format!("reading the handed-over socket: {e}")))?;
    let wanted = address
        .parse::<Address>()
        .map_err(|e| CollectiveError::Setup(format!("this task's address {address:?}: {e}")))?;
    if bound.port() != wanted.port() {
        return Err(CollectiveError::Setup(format!(
            "the listening socket handed over (LISTEN_FDS) is bound to {bound}, but this task's address is {address}"
        )));
    }
    tracing::debug!(%bound, "listening on the socket the launcher handed over");
    Ok(Some(listener))
}

/// The listening socket of a task whose address in the cluster spec is `address`: the one
/// the launcher handed over (`LISTEN_FDS`), else a new one on that address's port on every
/// interface. For services beside the collectives (a parameter server's, a worker's step
/// service), which listen where the cluster spec says the task is.
///
/// # Errors
///
/// [`CollectiveError::Setup`] when `address` is not `host:port`, the handed-over socket is
/// on another port, or the port cannot be bound.
pub fn task_listener(address: &str) -> Result<TcpListener, CollectiveError> {
    match take_listener(address)? {
        Some(listener) => Ok(listener),
        None => super::tcp::bind_address(address, None),
    }
}
