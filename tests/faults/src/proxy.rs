//! A loopback TCP proxy between workers and a store, whose traffic the test
//! can drop, stall or delay.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// Close every open connection and every new one at once.
    Drop,
    /// Keep connections open but forward nothing (buffered until the mode
    /// changes).
    Stall,
    /// Forward everything, each chunk delayed this long (each way).
    Delay(Duration),
}

/// A running proxy on `127.0.0.1:port` to an upstream `host:port`.
pub struct Proxy {
    /// The port workers connect to.
    pub port: u16,
    mode: watch::Sender<Mode>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream`, on the
    /// current tokio runtime.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream: String, mode: Mode) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the proxy: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let (tx, rx) = watch::channel(mode);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *rx.borrow() == Mode::Drop {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(connection(inbound, upstream.clone(), rx.clone()));
            }
        });
        Ok(Self { port, mode: tx })
    }

    /// Changes what the proxy does, for open and new connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

async fn connection(inbound: TcpStream, upstream: String, mode: watch::Receiver<Mode>) {
    let Ok(outbound) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ir, iw) = inbound.into_split();
    let (or, ow) = outbound.into_split();
    let up = pump(ir, ow, mode.clone());
    let down = pump(or, iw, mode);
    tokio::join!(up, down);
}

/// Resolves once the mode is `Drop` (or the proxy is gone).
async fn dropped(mode: &mut watch::Receiver<Mode>) {
    loop {
        if *mode.borrow_and_update() == Mode::Drop {
            return;
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
}

/// Forwards one direction: a reader task queues chunks with the instant
/// they may be delivered, a writer delivers them in order.
async fn pump(mut from: OwnedReadHalf, to: OwnedWriteHalf, mode: watch::Receiver<Mode>) {
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let mut m = read_mode.clone();
            let n = tokio::select! {
                r = from.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                _ = dropped(&mut m) => return,
            };
            let delay = match *read_mode.borrow_and_update() {
                Mode::Delay(d) => d,
                _ => Duration::ZERO,
            };
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::join!(reader, deliver(rx, to, mode));
}

async fn deliver(
    mut rx: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    loop {
        let mut m = mode.clone();
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = dropped(&mut m) => return,
        };
        let Some((at, bytes)) = item else {
            let _ = to.shutdown().await;
            return;
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Drop => return,
                Mode::Stall => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::Pass | Mode::Delay(_) => break,
            }
        }
        tokio::time::sleep_until(at).await;
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
}
