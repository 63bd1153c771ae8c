//! Task output on the launcher's own standard output and error. Every task's lines arrive
//! whole, prefixed with their task. Where the launcher's stdout is a terminal, the chief's
//! stdout is a pseudo-terminal instead of a pipe, so a program that draws a live progress bar
//! on a terminal (as `fit` does) draws it: its unfinished line, redrawn after each `\r`, stays
//! at the bottom of the screen with its prefix, and every other line is printed above it.
//! Piped or redirected, the launcher shows no live line, and output is plain lines.

use std::io::{self, IsTerminal as _, Read, Write};
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::thread::{self, JoinHandle};

/// Clears the terminal's current line: carriage return, then erase the line (CSI 2 K).
const CLEAR_LINE: &[u8] = b"\r\x1b[2K";

/// The live line drawn at the bottom of the terminal, if any. Every write to stdout or
/// stderr goes through this lock, so lines from different tasks never mix.
static LIVE: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// Whether log lines on stderr may carry ANSI colour codes: never under `NO_COLOR`, always
/// under `CLICOLOR_FORCE`, else only when stderr is a terminal. The launcher passes its
/// answer to every task (whose stderr is a pipe) as one of the two variables; a task built
/// on `lockstep-task` reads them back with the same rule.
pub(crate) fn colour_logs() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
    if set("NO_COLOR") {
        false
    } else {
        set("CLICOLOR_FORCE") || io::stderr().is_terminal()
    }
}

/// Whether the chief's live line is shown: the launcher's stdout is a terminal.
pub(crate) fn shows_live_line() -> bool {
    io::stdout().is_terminal()
}

/// Where a task's line goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

/// Writes one whole line, above the live line if one is shown. Errors are ignored: output the
/// launcher cannot write (a closed pipe) must not stop it draining its tasks.
pub(crate) fn print_line(sink: Sink, line: &[u8]) {
    let live = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut stdout = io::stdout().lock();
    if live.is_some() {
        let _ = stdout.write_all(CLEAR_LINE);
        let _ = stdout.flush();
    }
    match sink {
        Sink::Stdout => {
            let _ = stdout.write_all(line);
            let _ = stdout.write_all(b"\n");
        }
        Sink::Stderr => {
            let mut stderr = io::stderr().lock();
            let _ = stderr.write_all(line);
            let _ = stderr.write_all(b"\n");
            let _ = stderr.flush();
        }
    }
    if let Some(text) = live.as_deref() {
        let _ = stdout.write_all(text);
    }
    let _ = stdout.flush();
}

/// One log event of the launcher's own (`tracing` makes one writer per event): its lines go
/// through [`print_line`] when it is dropped, so that they too are printed above the live
/// line instead of onto it.
#[derive(Debug, Default)]
pub(crate) struct LogEvent(Vec<u8>);

impl Write for LogEvent {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        let text = self.0.strip_suffix(b"\n").unwrap_or(&self.0);
        if !text.is_empty() {
            for line in text.split(|&b| b == b'\n') {
                print_line(Sink::Stderr, line);
            }
        }
    }
}

/// Replaces the live line (none: clears it).
fn show_live(line: Option<Vec<u8>>) {
    let mut live = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut stdout = io::stdout().lock();
    if live.is_some() || line.is_some() {
        let _ = stdout.write_all(CLEAR_LINE);
    }
    if let Some(text) = &line {
        let _ = stdout.write_all(text);
    }
    let _ = stdout.flush();
    *live = line;
}

/// A pseudo-terminal for a task's stdout: the task writes to `child`, the launcher reads
/// `parent`. Its width is the launcher's terminal's less the prefix, so a bar drawn to fit
/// the task's terminal fits once prefixed.
pub(crate) struct Pty {
    pub(crate) parent: OwnedFd,
    pub(crate) child: OwnedFd,
}

impl Pty {
    pub(crate) fn open(prefix_len: usize) -> io::Result<Self> {
        let size = console::Term::stdout()
            .size_checked()
            .map(|(rows, cols)| nix::pty::Winsize {
                ws_row: rows,
                ws_col: cols.saturating_sub(u16::try_from(prefix_len).unwrap_or(u16::MAX)),
                ws_xpixel: 0,
                ws_ypixel: 0,
            });
        let pty = nix::pty::openpty(size.as_ref(), None).map_err(io::Error::from)?;
        Ok(Self {
            parent: pty.master,
            child: pty.slave,
        })
    }
}

/// Copies `source` line by line through [`print_line`], each line prefixed `[task] `.
/// Invalid UTF-8 is shown with replacement characters rather than dropping the line.
pub(crate) fn forward_lines<R>(source: R, task: String, sink: Sink) -> JoinHandle<()>
where
    R: Read + Send + 'static,
{
    thread::spawn(move || {
        let mut reader = io::BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match io::BufRead::read_until(&mut reader, b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches(['\n', '\r']);
                    print_line(sink, &prefixed(&task, text.as_bytes()));
                }
            }
        }
    })
}

/// Copies what a task writes to its pseudo-terminal: whole lines through [`print_line`],
/// and the unfinished line as the live line, both prefixed `[task] `.
pub(crate) fn forward_terminal(parent: OwnedFd, task: String) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut source = std::fs::File::from(parent);
        let mut pending = Vec::new();
        let mut buffer = [0_u8; 4096];
        // Reading fails with EIO once the task and everything it started have closed the
        // terminal: that is its end of file.
        while let Ok(read) = source.read(&mut buffer) {
            if read == 0 {
                break;
            }
            pending.extend_from_slice(&buffer[..read]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                // The line ends: it is no longer live but printed, as the others are.
                let line: Vec<u8> = pending.drain(..=end).collect();
                show_live(None);
                print_line(Sink::Stdout, &prefixed(&task, &visible(&line[..end])));
            }
            let text = visible(&pending);
            show_live((!text.is_empty()).then(|| prefixed(&task, &text)));
        }
        show_live(None);
        if !pending.is_empty() {
            print_line(Sink::Stdout, &prefixed(&task, &visible(&pending)));
        }
    })
}

fn prefixed(task: &str, text: &[u8]) -> Vec<u8> {
    let mut line = format!("[{task}] ").into_bytes();
    line.extend_from_slice(text);
    line
}

/// What a terminal shows of a line's bytes: the text after its last carriage return (the
/// terminal's line discipline turns `\n` into `\r\n`, so a final `\r` is dropped first), with
/// every control sequence but colours (`CSI … m`) removed, since the launcher does its own
/// clearing and placing.
fn visible(line: &[u8]) -> Vec<u8> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let last = line
        .iter()
        .rposition(|&b| b == b'\r')
        .map_or(line, |at| &line[at + 1..]);
    let mut out = Vec::with_capacity(last.len());
    let mut rest = last;
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == 0x1b && tail.first() == Some(&b'[') {
            // CSI: parameters and intermediates, then one final byte in 0x40..=0x7e.
            let body = &tail[1..];
            let end = body.iter().position(|b| (0x40..=0x7e).contains(b));
            let Some(end) = end else { break };
            if body[end] == b'm' {
                out.extend_from_slice(&rest[..end + 3]);
            }
            rest = &body[end + 1..];
        } else {
            if byte != 0x1b && (byte >= 0x20 || byte == b'\t') {
                out.push(byte);
            }
            rest = tail;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrawn_line_shows_its_last_drawing() {
        assert_eq!(
            visible(b"\r\x1b[2KEpoch 1/3 1/4\r\x1b[2KEpoch 1/3 2/4"),
            b"Epoch 1/3 2/4"
        );
    }

    #[test]
    fn a_line_ended_by_the_terminal_keeps_its_text() {
        assert_eq!(visible(b"accuracy=0.97\r"), b"accuracy=0.97");
        assert_eq!(visible(b"\r\x1b[2K"), b"");
    }

    #[test]
    fn colours_stay_and_cursor_movements_go() {
        assert_eq!(
            visible(b"\x1b[?25l\x1b[1A\x1b[32mINFO\x1b[0m done\x07"),
            b"\x1b[32mINFO\x1b[0m done"
        );
    }

    #[test]
    fn a_cut_control_sequence_is_dropped() {
        assert_eq!(visible(b"text \x1b[12"), b"text ");
    }

    #[test]
    fn a_pseudo_terminal_carries_a_childs_output_as_a_terminal() {
        let pty = Pty::open(10).unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "test -t 1 && printf 'one\\ntwo'"])
            .stdout(std::process::Stdio::from(pty.child))
            .status()
            .unwrap();
        assert!(status.success());
        let mut read = Vec::new();
        let _ = std::fs::File::from(pty.parent).read_to_end(&mut read);
        assert_eq!(read, b"one\r\ntwo");
    }
}
