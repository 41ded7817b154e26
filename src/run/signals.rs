//! The signals that stop a run: SIGINT (Ctrl-C) and SIGTERM (`kill`, systemd, a container
//! runtime) are handled alike. The first asks the loops to stop after their call in flight;
//! the next one, of either kind, stops them at once. Either way the run record is completed
//! and the process exits with `128 + signal number` (130 or 143), the code a shell reports for
//! a process killed by that signal, so callers see the same code as before, only now with a
//! complete record.

use futures::FutureExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// A signal that asked the run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT: Ctrl-C in the terminal.
    Interrupt,
    /// SIGTERM: `kill PID`, a service manager or a container runtime stopping us.
    Terminate,
}

impl StopSignal {
    /// The exit code of a run stopped by this signal: 128 + the signal number.
    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Interrupt => 130,
            StopSignal::Terminate => 143,
        }
    }

    /// How the signal is named in messages.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Terminate => "SIGTERM",
        }
    }
}

/// Listeners for SIGINT and SIGTERM, installed together when this is made: from then on
/// neither signal kills the process with its default action (which would leave a run record
/// saying "running" forever); each arrives here instead.
pub struct StopSignals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl StopSignals {
    /// Installs both listeners. One that cannot be installed is logged and left out: the run
    /// goes on, and that signal keeps its default action.
    pub fn install() -> Self {
        StopSignals {
            interrupt: listen(SignalKind::interrupt(), StopSignal::Interrupt),
            terminate: listen(SignalKind::terminate(), StopSignal::Terminate),
        }
    }

    /// Waits for the next stop signal (forever when no listener could be installed).
    /// Cancel-safe: a signal that arrives while this is dropped is kept for the next call.
    pub async fn next(&mut self) -> StopSignal {
        tokio::select! {
            Some(()) = recv(&mut self.interrupt) => StopSignal::Interrupt,
            Some(()) = recv(&mut self.terminate) => StopSignal::Terminate,
            else => std::future::pending().await,
        }
    }

    /// A stop signal that has already arrived, without waiting.
    pub fn arrived(&mut self) -> Option<StopSignal> {
        self.next().now_or_never()
    }
}

fn listen(kind: SignalKind, which: StopSignal) -> Option<Signal> {
    match signal(kind) {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::warn!(
                "cannot listen for {} ({e}); it will not stop this run cleanly",
                which.name()
            );
            None
        }
    }
}

/// The next delivery of `listener`; `None` at once when there is no listener (or it ended),
/// so that `select!` moves on to the other one.
async fn recv(listener: &mut Option<Signal>) -> Option<()> {
    match listener {
        Some(l) => l.recv().await,
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_128_plus_the_signal_number() {
        assert_eq!(
            i32::from(StopSignal::Interrupt.exit_code()),
            128 + libc::SIGINT
        );
        assert_eq!(
            i32::from(StopSignal::Terminate.exit_code()),
            128 + libc::SIGTERM
        );
    }

    #[tokio::test]
    async fn no_listener_means_no_signal_ever() {
        let mut none = StopSignals {
            interrupt: None,
            terminate: None,
        };
        assert_eq!(none.arrived(), None);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), none.next()).await;
        assert!(waited.is_err());
    }
}
