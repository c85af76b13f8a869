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
//! async runtime's timer, and it must not share the benchmark's runtime. Each delivering thread
//! asks the kernel for a timer slack of 1 µs (50 µs by default); a chunk is still delivered
//! some tens of microseconds after its due time (a thread's wake-up), more on a loaded machine,
//! for the client of every side alike: `bench-latency` measures the round trip it gets.

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
    /// Half the round-trip time, in nanoseconds.
    one_way: AtomicU64,
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
            one_way: AtomicU64::new(nanos(rtt / 2)),
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

    /// From now on, every byte is delayed by `rtt / 2` each way (bytes already on their way
    /// keep their delay).
    pub fn set_rtt(&self, rtt: Duration) {
        self.shared.one_way.store(nanos(rtt / 2), Ordering::Relaxed);
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (`postgres://[user[:password]@]host[:port]/rest`) with its host and port replaced
    /// by this proxy's.
    pub fn url(&self, url: &str) -> String {
        on_local_port(url, self.addr.port())
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

/// Sleeps until `due`.
fn wait_until(due: Instant) {
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
        pump(c_read, s_write, &up_shared.one_way, |_| {
            if !up_turns.client_last.swap(true, Ordering::Relaxed) {
                up_shared.turns.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    pump(server, client, &shared.one_way, |_| {
        turns.client_last.store(false, Ordering::Relaxed)
    });
}

/// Copies `from` to `to`, each chunk `one_way` (nanoseconds, read as it arrives) after it was
/// read; `seen` is told of each chunk as it arrives. Ends both ways when either side closes.
fn pump(mut from: TcpStream, to: TcpStream, one_way: &AtomicU64, seen: impl Fn(&[u8])) {
    let mut buf = vec![0u8; 64 * 1024];
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut writer = to.try_clone().expect("clone");
    let delivering = thread::spawn(move || {
        // SAFETY: prctl(PR_SET_TIMERSLACK) only sets this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
        for (due, chunk) in rx {
            wait_until(due);
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = writer.shutdown(Shutdown::Both);
    });
    while let Ok(n @ 1..) = from.read(&mut buf) {
        seen(&buf[..n]);
        let due = Instant::now() + Duration::from_nanos(one_way.load(Ordering::Relaxed));
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = delivering.join();
    let _ = (to.shutdown(Shutdown::Both), from.shutdown(Shutdown::Both));
}

/// `url` (`postgres://[user[:password]@]host[:port]/rest`) with its host and port replaced by
/// 127.0.0.1 and `port`: the same user, password, database and parameters, through a local
/// stand-in (this proxy, a pooler).
pub fn on_local_port(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"));
    format!(
        "{scheme}://{}127.0.0.1:{port}/{path}",
        user.unwrap_or_default()
    )
}

/// The password of `url` (`postgres://user:password@…`) as written there, or none.
pub fn password_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    authority
        .rsplit_once('@')
        .and_then(|(credentials, _)| credentials.split_once(':'))
        .map_or("", |(_, password)| password)
}
