//! Ctrl-C and SIGTERM on `weir run`: a job with checkpointing stops with a savepoint (Flink's
//! `stop`), one without is cancelled; a second signal cancels at once.

use std::path::Path;

use anyhow::{bail, Result};
use weir_engine::api::{RunOptions, StopMode};

/// Blocks SIGINT and SIGTERM in this thread — and so in every thread it starts from now on —
/// and starts a thread that waits for them: the first stops job `job` with a savepoint when it
/// is `checkpointed` (cancels it otherwise), the next cancels it. Call it before the job's
/// threads start.
pub(crate) fn stop_on_signals(job: &str, checkpointed: bool, options: &RunOptions) -> Result<()> {
    // SAFETY: `set` is a local sigset_t, initialised by sigemptyset before it is read; the
    // calls only read and write it and this thread's signal mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let error = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if error != 0 {
            bail!(
                "cannot block SIGINT and SIGTERM to handle them: {}",
                std::io::Error::from_raw_os_error(error)
            );
        }
        set
    };
    let job = job.to_string();
    let cancel = options.cancel.clone();
    let savepoints = options.savepoints.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut received = 0;
            loop {
                let mut signal = 0;
                // SAFETY: `set` is an initialised sigset_t whose signals this thread has
                // blocked (it inherited the mask), as sigwait requires; `signal` is a local.
                if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                    return;
                }
                received += 1;
                if received == 1 && checkpointed {
                    eprintln!(
                        "weir: stopping job '{job}' with a savepoint (send the signal again to \
                         cancel it instead)"
                    );
                    let pending = savepoints.stop_with_savepoint(StopMode::Suspend);
                    let cancel = cancel.clone();
                    std::thread::spawn(move || {
                        if let Err(error) = pending.wait() {
                            eprintln!("weir: the savepoint failed: {error}; cancelling the job");
                            cancel.cancel();
                        }
                    });
                } else {
                    eprintln!("weir: cancelling job '{job}'");
                    cancel.cancel();
                }
            }
        })?;
    Ok(())
}

/// This process's command line, to resume from `savepoint`: without `--resume` or an earlier
/// `--from-savepoint`, with `--from-savepoint SAVEPOINT`.
pub(crate) fn resume_command(savepoint: &Path) -> String {
    let mut words = Vec::new();
    let mut args = std::env::args();
    while let Some(arg) = args.next() {
        if arg == "--from-savepoint" {
            args.next();
        } else if arg != "--resume" && !arg.starts_with("--from-savepoint=") {
            words.push(quote(&arg));
        }
    }
    words.push("--from-savepoint".into());
    words.push(quote(&savepoint.display().to_string()));
    words.join(" ")
}

/// `word` as a shell reads it back.
fn quote(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain && !word.is_empty() {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// SIGINT and SIGTERM, on the current tokio runtime, for the long-running processes (the
/// control plane, a worker): each is sent as it comes.
pub(crate) fn stop_signals() -> Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
