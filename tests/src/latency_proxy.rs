//! A TCP proxy that adds network latency and counts round trips: what a client of PostgreSQL
//! meets in a deployment (Lambda → RDS Proxy → PostgreSQL Multi-AZ, 0.3 to 1 ms a round trip),
//! reproduced on loopback for benchmarks and for the tests that pin each path's round trips.
//!
//! - Latency: every byte crossing the proxy, either way, is delivered half the round-trip time
//!   after it arrived (order kept), so a request and its reply cost one round-trip time.
//! - Round trips: a *turn* is the client sending after it last heard from the server (or for
//!   the first time). Whatever a client sends at once counts once (statements pipelined in one
//!   write, a simple query of several statements), and each wait for the server's answer
//!   counts: a query, an extended-protocol `Sync`, a connection pool's ping alike.
//!
//! Threads, not tasks: a delay of a quarter of a millisecond needs a sleep finer than the
//! async runtime's timer, and it must not share the benchmark's runtime.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// A running proxy to one upstream address.
pub struct LatencyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: SocketAddr,
    one_way: Duration,
    turns: AtomicU64,
    stopped: AtomicBool,
}

impl LatencyProxy {
    /// Listens on a free loopback port and forwards to `upstream`, each way after `rtt / 2`.
    pub fn start(upstream: SocketAddr, rtt: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            upstream,
            one_way: rtt / 2,
            turns: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let shared = accepting.clone();
                thread::spawn(move || connect(client, shared));
            }
        });
        Self { addr, shared }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (`postgres://[user[:password]@]host[:port]/rest`) with its host and port replaced
    /// by this proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"));
        format!(
            "{scheme}://{}127.0.0.1:{}/{path}",
            user.unwrap_or_default(),
            self.addr.port()
        )
    }

    /// Round trips (client turns) on every connection so far.
    pub fn round_trips(&self) -> u64 {
        self.shared.turns.load(Ordering::Relaxed)
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Who spoke last on a connection: the round trips are the client's turns.
struct Turns {
    client_last: AtomicBool,
}

fn connect(client: TcpStream, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(shared.upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let turns = Arc::new(Turns {
        client_last: AtomicBool::new(false),
    });
    let (c_read, s_write) = (
        client.try_clone().expect("clone"),
        server.try_clone().expect("clone"),
    );
    let (up_shared, up_turns) = (shared.clone(), turns.clone());
    thread::spawn(move || {
        pump(c_read, s_write, up_shared.one_way, |_| {
            if !up_turns.client_last.swap(true, Ordering::Relaxed) {
                up_shared.turns.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    pump(server, client, shared.one_way, |_| {
        turns.client_last.store(false, Ordering::Relaxed)
    });
}

/// Copies `from` to `to`, each chunk `delay` after it was read; `seen` is told of each chunk as
/// it arrives. Ends both ways when either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, seen: impl Fn(&[u8])) {
    let mut buf = vec![0u8; 64 * 1024];
    if delay.is_zero() {
        while let Ok(n @ 1..) = from.read(&mut buf) {
            seen(&buf[..n]);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = (to.shutdown(Shutdown::Both), from.shutdown(Shutdown::Both));
        return;
    }
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut writer = to.try_clone().expect("clone");
    let delivering = thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = writer.shutdown(Shutdown::Both);
    });
    while let Ok(n @ 1..) = from.read(&mut buf) {
        seen(&buf[..n]);
        if tx
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = delivering.join();
    let _ = (to.shutdown(Shutdown::Both), from.shutdown(Shutdown::Both));
}
