//! Graceful shutdown: one broadcast that every listener and worker watches, and a
//! drain that waits (bounded) for in-flight work, as in mini-redis.

use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

/// Handed to every task. `recv` resolves once shutdown begins; dropping the
/// `Shutdown` (and its `_drain` sender) tells [`Coordinator::drain`] the task ended.
#[derive(Debug)]
pub struct Shutdown {
    is_shutdown: bool,
    notify: broadcast::Receiver<()>,
    _drain: mpsc::Sender<()>,
}

impl Shutdown {
    pub fn is_shutdown(&self) -> bool {
        self.is_shutdown
    }

    /// Wait for the shutdown signal.
    pub async fn recv(&mut self) {
        if self.is_shutdown {
            return;
        }
        let _ = self.notify.recv().await;
        self.is_shutdown = true;
    }

    /// Another handle to the same signal (for a spawned per-connection task).
    pub fn child(&self) -> Shutdown {
        Shutdown {
            is_shutdown: self.is_shutdown,
            notify: self.notify.resubscribe(),
            _drain: self._drain.clone(),
        }
    }
}

/// Owns the signal. `trigger` starts shutdown; `drain` waits for all handles to drop.
pub struct Coordinator {
    notify: broadcast::Sender<()>,
    drain_tx: Option<mpsc::Sender<()>>,
    drain_rx: mpsc::Receiver<()>,
}

impl Default for Coordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl Coordinator {
    pub fn new() -> Self {
        let (notify, _) = broadcast::channel(1);
        let (drain_tx, drain_rx) = mpsc::channel(1);
        Coordinator {
            notify,
            drain_tx: Some(drain_tx),
            drain_rx,
        }
    }

    pub fn handle(&self) -> Shutdown {
        Shutdown {
            is_shutdown: false,
            notify: self.notify.subscribe(),
            _drain: self.drain_tx.clone().expect("handle after drain"),
        }
    }

    pub fn trigger(&self) {
        let _ = self.notify.send(());
    }

    /// Trigger, then wait for every handle to be dropped or `timeout` to pass.
    /// Returns false on timeout.
    pub async fn drain(mut self, timeout: Duration) -> bool {
        self.trigger();
        drop(self.drain_tx.take());
        tokio::time::timeout(timeout, self.drain_rx.recv())
            .await
            .is_ok()
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment [`Signals::install`] returns: a
/// signal that arrives while the appliance is still starting is kept, and
/// [`Signals::recv`] returns at once when start-up is done (the drain or the reload
/// then runs as usual, instead of the default action killing the process half-started).
/// This is the process's one SIGHUP handler: whoever reloads on it is handed a
/// [`Reloads`] receiver.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// What [`Signals::recv`] caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    /// SIGINT or SIGTERM: drain and stop.
    Stop,
    /// SIGHUP: reload what can change safely.
    Reload,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves on the next signal (or one already caught).
    pub async fn recv(&mut self) -> Caught {
        tokio::select! {
            _ = self.term.recv() => {
                tracing::info!("SIGTERM received, shutting down");
                Caught::Stop
            }
            _ = self.int.recv() => {
                tracing::info!("SIGINT received, shutting down");
                Caught::Stop
            }
            _ = self.hup.recv() => {
                tracing::info!("SIGHUP received, reloading");
                Caught::Reload
            }
        }
    }
}

/// The SIGHUP fan-out: a generation number bumped at each reload; each reloading task
/// holds a receiver and reloads when it changes.
#[derive(Clone, Default)]
pub struct Reloads {
    tx: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl Reloads {
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// Tell every receiver to reload.
    pub fn notify(&self) {
        self.tx.send_modify(|g| *g += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_handles() {
        let c = Coordinator::new();
        let mut h = c.handle();
        let t = tokio::spawn(async move {
            h.recv().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(h);
        });
        assert!(c.drain(Duration::from_secs(5)).await);
        t.await.unwrap();
    }

    #[tokio::test]
    async fn drain_times_out_on_stuck_task() {
        let c = Coordinator::new();
        let h = c.handle();
        assert!(!c.drain(Duration::from_millis(30)).await);
        drop(h);
    }
}
