//! Log lines on stderr, coloured only where a person reads them.

use std::io::IsTerminal as _;

/// Whether log lines on stderr may carry ANSI colour codes: never under `NO_COLOR`, always under
/// `CLICOLOR_FORCE` (set by the `lockstep` launcher when its own stderr is a terminal, since
/// a task's stderr is a pipe to the launcher), else only when stderr is a terminal. A log
/// redirected to a file (`lockstep run … 2> log`) holds plain text.
pub fn colour_logs() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
    if set("NO_COLOR") {
        false
    } else {
        set("CLICOLOR_FORCE") || std::io::stderr().is_terminal()
    }
}

/// Logs `tracing` events at INFO and above to stderr, coloured only where [`colour_logs`]
/// says so.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(colour_logs())
        .init();
}
