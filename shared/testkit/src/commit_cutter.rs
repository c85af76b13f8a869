//! A TCP proxy in front of PostgreSQL that can cut one connection at its `COMMIT`, for the
//! lost-reply and lost-request cases of a commit (the harness must settle either through the
//! fences).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where to cut the next `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cut {
    /// Pass everything.
    Off = 0,
    /// Forward the `COMMIT` to the server, then drop the connection before its reply: the
    /// job committed, and the client cannot know.
    AfterCommitSent = 1,
    /// Drop the connection instead of forwarding the `COMMIT`: the server rolls back.
    BeforeCommitSent = 2,
}

/// The running proxy; each cut fires once.
pub struct CommitCutter {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    cut: Arc<AtomicU8>,
}

impl CommitCutter {
    /// Listens on a free port, forwarding to `upstream_port` on 127.0.0.1.
    pub async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicU8::new(Cut::Off as u8));
        let shared = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let cut = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await {
                        relay(client, server, cut).await;
                    }
                });
            }
        });
        Self { port, cut }
    }

    /// Arms the next cut.
    pub fn arm(&self, cut: Cut) {
        self.cut.store(cut as u8, Ordering::SeqCst);
    }

    /// Whether the armed cut has fired.
    pub fn fired(&self) -> bool {
        self.cut.load(Ordering::SeqCst) == Cut::Off as u8
    }
}

/// The test's own pool on `connect`, a cutter in front of its server, and a pool of the
/// same options whose connections go through the cutter.
pub async fn pools_through(
    pool_opts: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) -> (sqlx::PgPool, CommitCutter, sqlx::PgPool) {
    let pool = pool_opts
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    let cutter = CommitCutter::start(connect.get_port()).await;
    let through = pool_opts
        .connect_with(
            connect
                .host("127.0.0.1")
                .port(cutter.port)
                .ssl_mode(sqlx::postgres::PgSslMode::Disable),
        )
        .await
        .unwrap();
    (pool, cutter, through)
}

async fn relay(client: TcpStream, server: TcpStream, cut: Arc<AtomicU8>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        // A `COMMIT` alone, or the harness's `…; COMMIT; <session reset>` query.
        let is_commit = chunk.windows(7).any(|w| w == b"COMMIT\0")
            || chunk.windows(9).any(|w| w == b"; COMMIT;");
        let armed = cut.load(Ordering::SeqCst);
        if is_commit && armed != Cut::Off as u8 {
            cut.store(Cut::Off as u8, Ordering::SeqCst);
            // Nothing the server says from here on reaches the client.
            down.abort();
            if armed == Cut::AfterCommitSent as u8 {
                let _ = server_write.write_all(chunk).await;
                // Let the server commit; then the reply has nowhere to go.
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            down.abort();
            return; // both halves drop: the client sees the connection die
        }
        if server_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    down.abort();
}
