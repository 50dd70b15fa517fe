//! The SQL floors' connections: a fixed set checked out of the pool once
//! and lent to one cycle at a time, as a raw client keeps its
//! connections. Through the pool, every statement would also pay its
//! checkout and its return, which pings the connection (a round trip to
//! the database, in a task of its own): about a third of the floor's rate
//! on Postgres.

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::sync::{mpsc, Mutex};

use super::err;

/// Connections lent in turn, first asked first served.
pub struct Lent<DB: Database> {
    back: mpsc::UnboundedSender<PoolConnection<DB>>,
    out: Mutex<mpsc::UnboundedReceiver<PoolConnection<DB>>>,
}

impl<DB: Database> Lent<DB> {
    /// Checks `n` connections out of `pool`.
    ///
    /// # Errors
    /// The pool's errors, as text.
    pub async fn new(pool: &Pool<DB>, n: u32) -> Result<Self, String> {
        let (back, out) = mpsc::unbounded_channel();
        for _ in 0..n.max(1) {
            let conn = pool.acquire().await.map_err(err)?;
            back.send(conn).map_err(err)?;
        }
        Ok(Self {
            back,
            out: Mutex::new(out),
        })
    }

    /// The next free connection; give it back with [`give`](Self::give).
    ///
    /// # Errors
    /// When every connection is gone.
    pub async fn take(&self) -> Result<PoolConnection<DB>, String> {
        let mut out = self.out.lock().await;
        out.recv()
            .await
            .ok_or_else(|| "the floor's connections are gone".to_owned())
    }

    /// Lends `conn` again.
    pub fn give(&self, conn: PoolConnection<DB>) {
        let _ = self.back.send(conn);
    }
}
