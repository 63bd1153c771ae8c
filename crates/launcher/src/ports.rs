//! The tasks' listening sockets, bound by the launcher and handed to each task.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;
use std::process::Command;

use command_fds::{CommandFdExt, FdMapping};

/// Where a socket handed over in systemd's socket-activation protocol sits in the child
/// (`SD_LISTEN_FDS_START`).
const LISTEN_FD: i32 = 3;

/// Listening sockets on ports the kernel chose, all distinct. Each task receives its socket
/// already bound and listening, so no other program (a parallel test's cluster, say) can take
/// the port between the launcher choosing it and the task using it.
#[derive(Debug)]
pub(crate) struct TaskListeners {
    listeners: Vec<TcpListener>,
}

impl TaskListeners {
    /// Binds `count` ephemeral ports on 127.0.0.1.
    pub(crate) fn bind(count: usize) -> io::Result<Self> {
        let listeners = (0..count)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { listeners })
    }

    /// Binds `ports` on 127.0.0.1 again, to restart a cluster on the addresses its tasks
    /// were given.
    pub(crate) fn rebind(ports: &[u16]) -> io::Result<Self> {
        let listeners = ports
            .iter()
            .map(|&port| {
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|e| {
                    io::Error::new(e.kind(), format!("port {port} (taken meanwhile?): {e}"))
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { listeners })
    }

    /// The bound port numbers, in task order.
    pub(crate) fn ports(&self) -> io::Result<Vec<u16>> {
        self.listeners
            .iter()
            .map(|l| Ok(l.local_addr()?.port()))
            .collect()
    }

    /// Gives each command its task's socket as file descriptor 3 with `LISTEN_FDS=1`, in
    /// task order. The command owns the socket from here; the launcher keeps no copy.
    pub(crate) fn hand_over<'a>(
        self,
        commands: impl IntoIterator<Item = &'a mut Command>,
    ) -> anyhow::Result<()> {
        for (listener, command) in self.listeners.into_iter().zip(commands) {
            command
                .fd_mappings(vec![FdMapping {
                    parent_fd: OwnedFd::from(listener),
                    child_fd: LISTEN_FD,
                }])
                .map_err(|e| anyhow::anyhow!("handing a listening socket to a task: {e}"))?
                .env("LISTEN_FDS", "1")
                .env_remove("LISTEN_PID")
                .env_remove("LISTEN_FDNAMES");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_ports_are_distinct_and_stay_taken_until_handed_over() {
        let bound = TaskListeners::bind(8).unwrap();
        let mut ports = bound.ports().unwrap();
        for &port in &ports {
            assert_ne!(port, 0);
            assert!(
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err(),
                "port {port} is free for anyone to take"
            );
        }
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
    }

    #[test]
    fn ports_given_up_can_be_bound_again_for_a_restart() {
        // A port given up is free for anyone, and the other tests here bind ephemeral ports
        // in parallel, so the kernel may hand one of ours to them in between (it did, in CI).
        // A fresh set is tried then, a bounded number of times.
        const ATTEMPTS: usize = 20;
        let (ports, again) = (0..ATTEMPTS)
            .find_map(|_| {
                let bound = TaskListeners::bind(3).unwrap();
                let ports = bound.ports().unwrap();
                drop(bound);
                match TaskListeners::rebind(&ports) {
                    Ok(again) => Some((ports, again)),
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse => None,
                    Err(e) => panic!("rebinding {ports:?}: {e}"),
                }
            })
            .expect("some set of ports given up could be bound again");
        assert_eq!(again.ports().unwrap(), ports);
        let err = TaskListeners::rebind(&ports[..1]).unwrap_err();
        assert!(err.to_string().contains(&ports[0].to_string()), "{err}");
    }

    #[test]
    fn a_handed_over_socket_is_descriptor_three_in_the_child() {
        // Once the command is dropped its port is free for anyone: a parallel test may take it
        // before we bind it again, so a fresh socket is tried then, a bounded number of times.
        const ATTEMPTS: usize = 20;
        let freed = (0..ATTEMPTS).any(|_| {
            let bound = TaskListeners::bind(1).unwrap();
            let port = bound.ports().unwrap()[0];
            let mut command = Command::new("sh");
            command.args([
                "-c",
                "test \"$LISTEN_FDS\" = 1 && readlink /proc/self/fd/3 | grep -q '^socket:'",
            ]);
            bound.hand_over([&mut command]).unwrap();
            assert!(command.status().unwrap().success());
            // The command still owns the socket: the port stays taken until it is dropped.
            assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err());
            drop(command);
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        });
        assert!(freed, "the port stayed taken after the command was dropped");
    }
}
