//! Running one process per task: output prefixed with the task, and no process left behind.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use lockstep_cluster::TaskId;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::terminal::{self, Pty, Sink, forward_lines, forward_terminal};

/// How often the supervisor looks at its children.
const POLL: Duration = Duration::from_millis(20);

/// How a supervised cluster ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Every task exited with status 0.
    Succeeded,
    /// The first task to fail, and how; the others were stopped.
    Failed { task: TaskId, status: ExitStatus },
    /// Ctrl-C or SIGTERM reached the launcher; every task was stopped.
    Interrupted,
    /// The deadline passed; every task was stopped.
    TimedOut,
}

struct TaskProcess {
    task: TaskId,
    child: Child,
    status: Option<ExitStatus>,
    forwarders: Vec<JoinHandle<()>>,
}

/// The running tasks of a cluster.
pub(crate) struct Supervisor {
    processes: Vec<TaskProcess>,
    grace: Duration,
}

impl Supervisor {
    /// Starts every command, each in its own process group so that stopping a task also
    /// stops anything it started. If one fails to start, those already started are stopped.
    /// Where the launcher's stdout is a terminal, the first task (the chief) writes its stdout
    /// to a pseudo-terminal, so that its live progress bar is drawn.
    pub(crate) fn start(commands: Vec<(TaskId, Command)>, grace: Duration) -> io::Result<Self> {
        let mut supervisor = Self {
            processes: Vec::with_capacity(commands.len()),
            grace,
        };
        // A task's stderr is a pipe to this process: tell it whether the lines it logs end
        // up on a terminal (colour) or not (plain text).
        let colour = if terminal::colour_logs() {
            ("CLICOLOR_FORCE", "NO_COLOR")
        } else {
            ("NO_COLOR", "CLICOLOR_FORCE")
        };
        let mut live = terminal::shows_live_line();
        for (task, mut command) in commands {
            let prefix = format!("[{task}] ");
            let pty = if live {
                live = false;
                Some(Pty::open(prefix.len()).map_err(|e| {
                    io::Error::new(e.kind(), format!("opening a terminal for {task}: {e}"))
                })?)
            } else {
                None
            };
            command
                .env(colour.0, "1")
                .env_remove(colour.1)
                .process_group(0)
                .stdin(Stdio::null())
                .stderr(Stdio::piped());
            let terminal_parent = if let Some(Pty { parent, child }) = pty {
                command.stdout(Stdio::from(child));
                Some(parent)
            } else {
                command.stdout(Stdio::piped());
                None
            };
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(err) => {
                    supervisor.stop_all();
                    return Err(io::Error::new(
                        err.kind(),
                        format!("starting {task}: {err}"),
                    ));
                }
            };
            tracing::info!(task = %task, pid = child.id(), "started");
            // The command, dropped here, held the terminal's child side: with it closed, the
            // parent side reads end of file once the task is gone.
            drop(command);
            let mut forwarders = Vec::with_capacity(2);
            if let Some(parent) = terminal_parent {
                forwarders.push(forward_terminal(parent, task.to_string()));
            }
            if let Some(out) = child.stdout.take() {
                forwarders.push(forward_lines(out, task.to_string(), Sink::Stdout));
            }
            if let Some(err) = child.stderr.take() {
                forwarders.push(forward_lines(err, task.to_string(), Sink::Stderr));
            }
            supervisor.processes.push(TaskProcess {
                task,
                child,
                status: None,
                forwarders,
            });
        }
        Ok(supervisor)
    }

    /// Waits until every task has exited, a task fails (unless `keep_going`), `interrupted` is
    /// set or `deadline` passes; in the last three cases stops every task still running. With
    /// `keep_going` the first failure is reported once every task has exited.
    pub(crate) fn wait(
        mut self,
        interrupted: &AtomicBool,
        deadline: Option<Instant>,
        keep_going: bool,
    ) -> Outcome {
        let mut first_failure = None;
        let outcome = loop {
            if let Some(failure) = self.reap() {
                if !keep_going {
                    break failure;
                }
                first_failure.get_or_insert(failure);
            }
            if self.processes.iter().all(|p| p.status.is_some()) {
                break first_failure.take().unwrap_or(Outcome::Succeeded);
            }
            if interrupted.load(Ordering::SeqCst) {
                break Outcome::Interrupted;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Outcome::TimedOut;
            }
            thread::sleep(POLL);
        };
        self.stop_all();
        outcome
    }

    /// Records the exit of finished children; returns the first failure seen.
    fn reap(&mut self) -> Option<Outcome> {
        let mut failure = None;
        for process in self.processes.iter_mut().filter(|p| p.status.is_none()) {
            match process.child.try_wait() {
                Ok(Some(status)) => {
                    tracing::debug!(task = %process.task, %status, "exited");
                    process.status = Some(status);
                    if !status.success() && failure.is_none() {
                        failure = Some(Outcome::Failed {
                            task: process.task.clone(),
                            status,
                        });
                    }
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(task = %process.task, %err, "cannot poll the process"),
            }
        }
        failure
    }

    /// SIGTERM to every running task's process group, SIGKILL to those still running after the
    /// grace period, then reaps them all and drains their output.
    fn stop_all(&mut self) {
        self.signal_running(Signal::SIGTERM);
        let give_up = Instant::now() + self.grace;
        while self.processes.iter().any(|p| p.status.is_none()) && Instant::now() < give_up {
            self.reap();
            thread::sleep(POLL);
        }
        self.signal_running(Signal::SIGKILL);
        for process in &mut self.processes {
            if process.status.is_none() {
                process.status = process.child.wait().ok();
            }
            for forwarder in process.forwarders.drain(..) {
                // A forwarder only ends with its pipe; a panic there has already been printed.
                let _ = forwarder.join();
            }
        }
    }

    fn signal_running(&self, signal: Signal) {
        for process in self.processes.iter().filter(|p| p.status.is_none()) {
            let Ok(pid) = i32::try_from(process.child.id()) else {
                continue;
            };
            tracing::info!(task = %process.task, ?signal, "stopping");
            // ESRCH (already gone) is the only likely error, and it is what we want.
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.processes.iter().any(|p| p.status.is_none()) {
            self.stop_all();
        }
    }
}
