//! TCP keepalive on the connections that wait without a deadline (a coordinator waiting for a
//! step's outcome, a worker's connection to a parameter server between requests): a host that
//! dies or drops off the network sends no FIN or RST, and without keepalive such a wait would
//! never end. With it, the kernel probes an idle connection and ends it with an error when
//! the other host stops answering: after about [`IDLE`] + [`PROBES`] × [`INTERVAL`].

use std::net::TcpStream;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};

/// Idle time before the first probe.
pub const IDLE: Duration = Duration::from_secs(10);
/// Time between probes.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection fails.
pub const PROBES: u32 = 3;

/// Turns keepalive on for `stream` with [`IDLE`], [`INTERVAL`] and [`PROBES`].
///
/// # Errors
///
/// The system's refusal.
pub(crate) fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    let seconds = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    setsockopt(stream, sockopt::KeepAlive, &true)?;
    setsockopt(stream, sockopt::TcpKeepIdle, &seconds(IDLE))?;
    setsockopt(stream, sockopt::TcpKeepInterval, &seconds(INTERVAL))?;
    setsockopt(stream, sockopt::TcpKeepCount, &PROBES)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::getsockopt;

    #[test]
    fn a_connection_gets_keepalive_with_the_stated_timings() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        keep_alive(&stream).unwrap();
        assert!(getsockopt(&stream, sockopt::KeepAlive).unwrap());
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepIdle).unwrap(), 10);
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepInterval).unwrap(), 5);
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepCount).unwrap(), 3);
    }
}
