//! Free TCP ports on the loopback interface.

use std::io;
use std::net::{Ipv4Addr, TcpListener};

/// Ports the kernel reports free, all distinct, held until [`ReservedPorts::release`] so that
/// asking for several at once cannot return the same port twice.
///
/// Another program may still take a port between `release` and the moment a task binds it;
/// the window is the few milliseconds it takes to spawn the tasks.
#[derive(Debug)]
pub(crate) struct ReservedPorts {
    listeners: Vec<TcpListener>,
}

impl ReservedPorts {
    /// Binds `count` ephemeral ports on 127.0.0.1.
    pub(crate) fn reserve(count: usize) -> io::Result<Self> {
        let listeners = (0..count)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { listeners })
    }

    /// The reserved port numbers.
    pub(crate) fn ports(&self) -> io::Result<Vec<u16>> {
        self.listeners
            .iter()
            .map(|l| Ok(l.local_addr()?.port()))
            .collect()
    }

    /// Frees the ports for the tasks to bind.
    pub(crate) fn release(self) {
        drop(self.listeners);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_distinct_and_bindable_after_release() {
        let reserved = ReservedPorts::reserve(8).unwrap();
        let mut ports = reserved.ports().unwrap();
        reserved.release();
        for &port in &ports {
            assert_ne!(port, 0);
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
    }
}
