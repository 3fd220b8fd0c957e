//! The signals that ask a launcher to stop (`SIGTERM`, `SIGINT`, `SIGHUP`): while a launch is
//! watched they are recorded, so the launcher can stop its ranks and remove its directory;
//! otherwise they keep their default action (the process ends).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The handlers, installed on the first launch of the process.
struct Handlers {
    /// True while no launch is watched: a signal then takes its default action.
    idle: Arc<AtomicBool>,
    /// The last signal received while a launch was watched (0: none).
    received: Arc<AtomicUsize>,
    /// Launches being watched.
    watching: Mutex<usize>,
}

#[cfg(unix)]
const SIGNALS: [(i32, &str); 3] = [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")];
#[cfg(not(unix))]
const SIGNALS: [(i32, &str); 0] = [];

fn handlers() -> Option<&'static Handlers> {
    static HANDLERS: OnceLock<Option<Handlers>> = OnceLock::new();
    HANDLERS
        .get_or_init(|| {
            let h = Handlers {
                idle: Arc::new(AtomicBool::new(true)),
                received: Arc::new(AtomicUsize::new(0)),
                watching: Mutex::new(0),
            };
            for (signal, _) in SIGNALS {
                // The default action first, so an idle process ends as it would without these.
                signal_hook::flag::register_conditional_default(signal, Arc::clone(&h.idle)).ok()?;
                signal_hook::flag::register_usize(signal, Arc::clone(&h.received), signal as usize).ok()?;
            }
            Some(h)
        })
        .as_ref()
}

/// Records the stop signals while it lives.
pub(super) struct Watch(Option<&'static Handlers>);

impl Watch {
    /// Starts recording (and forgets a signal recorded during an earlier launch).
    pub(super) fn start() -> Watch {
        let h = handlers();
        if let Some(h) = h {
            let mut n = h.watching.lock().unwrap_or_else(|p| p.into_inner());
            if *n == 0 {
                h.received.store(0, Ordering::SeqCst);
            }
            *n += 1;
            h.idle.store(false, Ordering::SeqCst);
        }
        Watch(h)
    }

    /// The name of the stop signal received since the watch started, if one was.
    pub(super) fn received(&self) -> Option<&'static str> {
        let got = self.0?.received.load(Ordering::SeqCst);
        SIGNALS.iter().find(|(s, _)| *s as usize == got).map(|(_, name)| *name)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            let mut n = h.watching.lock().unwrap_or_else(|p| p.into_inner());
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.idle.store(true, Ordering::SeqCst);
            }
        }
    }
}
