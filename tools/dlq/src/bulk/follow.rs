//! Following a running operation: its progress polled about once a second and shown as a bar
//! with its rate and the time left (or a line per move, for logs), until it ends or the
//! operator stops following. Following only reads: the operation goes on either way.

use super::summary::{clipped, counts};
use crate::args::Progress;
use crate::client::{ApiError, Client, Operation};
use crate::terminal::{Newlines, shown};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often the operation is read while followed: well within the API's throttle.
pub const POLL: Duration = Duration::from_secs(1);
/// The window the rate is measured over: a chunk commits many letters at once, so a shorter
/// one would jump between zero and thousands per second.
const RATE_WINDOW: Duration = Duration::from_secs(30);

/// How following ended.
#[derive(Debug)]
pub enum Followed {
    /// The operation ended (done or cancelled): as it ended.
    Ended(Operation),
    /// The operator stopped following (Ctrl-C): the operation as last read, still running.
    Interrupted(Operation),
}

/// Ctrl-C, caught: once caught, it no longer kills the process, so a bulk command can say what
/// it left running. Caught only from [`Interrupt::on_ctrl_c`] on (a prompt before it is still
/// interrupted the usual way).
#[derive(Debug, Clone)]
pub struct Interrupt {
    caught: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Interrupt {
    /// Catches Ctrl-C from now on.
    pub fn on_ctrl_c() -> Self {
        let interrupt = Self {
            caught: Arc::new(AtomicBool::new(false)),
            notify: Arc::new(Notify::new()),
        };
        let (caught, notify) = (interrupt.caught.clone(), interrupt.notify.clone());
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                caught.store(true, Ordering::SeqCst);
                notify.notify_one();
            }
        });
        interrupt
    }

    /// Whether Ctrl-C was pressed.
    pub fn caught(&self) -> bool {
        self.caught.load(Ordering::SeqCst)
    }

    /// Waits for Ctrl-C.
    async fn wait(&self) {
        if !self.caught() {
            self.notify.notified().await;
        }
    }
}

/// Follows `op` until it ends or Ctrl-C, showing its progress as `progress` says. An error
/// only for an answer that will not change by waiting (the token refused or expired, the
/// operation gone); an unreachable API is said and tried again.
pub async fn follow(
    client: &Client,
    mut op: Operation,
    progress: Progress,
    interrupt: &Interrupt,
) -> Result<Followed, String> {
    let started = Instant::now();
    let mut view = View::new(progress, &op);
    let mut meter = Meter::default();
    let mut trouble: Option<String> = None;
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        meter.observe(Instant::now(), op.progress.worked());
        view.show(&op, &meter, trouble.as_deref(), started.elapsed());
        if !op.running() {
            view.finish();
            return Ok(Followed::Ended(op));
        }
        let read = tokio::select! {
            _ = interrupt.wait() => None,
            _ = ticker.tick() => tokio::select! {
                _ = interrupt.wait() => None,
                read = client.operation(op.id) => Some(read),
            },
        };
        match read {
            None => {
                view.finish();
                return Ok(Followed::Interrupted(op));
            }
            Some(Ok(now)) => {
                op = now;
                trouble = None;
            }
            Some(Err(e)) if worth_waiting(&e) => {
                trouble = Some(format!("cannot read the operation ({e}); trying again"));
            }
            Some(Err(e)) => {
                view.finish();
                return Err(format!(
                    "cannot read operation {id} any more ({e}). It goes on server-side: follow \
                     it again with `dlq operation {id} --follow` (with a new token if it \
                     expired)",
                    id = op.id
                ));
            }
        }
    }
}

/// An error that waiting may cure: no answer, throttling, the API or its database unavailable.
fn worth_waiting(e: &ApiError) -> bool {
    match e {
        ApiError::Unreachable(_) => true,
        ApiError::Refused { status, .. } => matches!(status, 429 | 500 | 502 | 503 | 504),
    }
}

/// How the progress shows: a bar on a terminal, a line per move for logs, or nothing.
struct View {
    bar: Option<ProgressBar>,
    lines: bool,
    said: String,
}

impl View {
    fn new(progress: Progress, op: &Operation) -> Self {
        let bar = (progress == Progress::Auto && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(length(op)),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            bar.set_style(
                // Two lines, so an 80-column terminal shows the pace and the counts whole.
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {pos}/{len} {prefix}\n         {wide_msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar
        });
        Self {
            bar,
            lines: progress == Progress::Lines,
            said: String::new(),
        }
    }

    fn show(&mut self, op: &Operation, meter: &Meter, trouble: Option<&str>, elapsed: Duration) {
        let (pace, detail) = status(op, meter, trouble);
        if let Some(bar) = &self.bar {
            bar.set_prefix(pace.clone());
            bar.set_message(detail.clone());
            bar.set_length(length(op));
            bar.set_position(op.progress.worked().max(0) as u64);
        }
        let line = format!(
            "{}/{} {}",
            op.progress.worked(),
            op.planned,
            [pace, detail]
                .into_iter()
                .filter(|part| !part.is_empty())
                .collect::<Vec<_>>()
                .join(" · ")
        );
        if self.lines && line != self.said {
            eprintln!("[{:>6}] {line}", duration(elapsed));
            self.said = line;
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The bar's length: the letters planned, or more if more were worked (a letter whose writer
/// committed after the plan was counted).
fn length(op: &Operation) -> u64 {
    op.planned.max(op.progress.worked()).max(0) as u64
}

/// What the bar (or a log line) says of the operation: its pace (how fast, how long it has
/// left; or that it waits for its worker) and what it did (and a failure it retries after, or
/// an API that does not answer).
pub fn status(op: &Operation, meter: &Meter, trouble: Option<&str>) -> (String, String) {
    let waiting = op.progress.worked() == 0 && op.failures == 0 && op.running();
    let pace = if waiting {
        "waiting for the scheduled worker (it starts within a minute)".to_owned()
    } else if !op.running() {
        String::new()
    } else {
        let left = (op.planned - op.progress.worked()).max(0);
        match meter.rate() {
            Some(rate) if rate > 0.0 => {
                let eta = Duration::from_secs_f64((left as f64 / rate).min(1e7));
                format!(
                    "{} letters/s · about {} left",
                    rate_text(rate),
                    duration(eta)
                )
            }
            _ => "measuring the rate".to_owned(),
        }
    };
    let mut detail = Vec::new();
    if !waiting {
        detail.push(counts(&op.action, &op.progress));
    }
    if op.failures > 0 {
        let error = op.last_error.as_deref().unwrap_or("?");
        detail.push(format!(
            "retrying after {} failure(s): {}",
            op.failures,
            clipped(&shown(error, Newlines::Escape), 120)
        ));
    }
    if let Some(trouble) = trouble {
        detail.push(trouble.to_owned());
    }
    (pace, detail.join(" · "))
}

fn rate_text(rate: f64) -> String {
    if rate < 10.0 {
        format!("{rate:.1}")
    } else {
        format!("{rate:.0}")
    }
}

/// A duration as an operator reads it: `45 s`, `3 min 05 s`, `2 h 10 min`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, (s % 3600) / 60),
    }
}

/// The rate an operation works at: letters worked over the last [`RATE_WINDOW`] of readings.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    readings: VecDeque<(Instant, i64)>,
}

impl Meter {
    /// Records that `worked` letters were worked at `at`.
    pub fn observe(&mut self, at: Instant, worked: i64) {
        self.readings.push_back((at, worked));
        while self.readings.len() > 2
            && self
                .readings
                .get(1)
                .is_some_and(|(t, _)| at.duration_since(*t) >= RATE_WINDOW)
        {
            self.readings.pop_front();
        }
    }

    /// Letters per second over the window; `None` before two readings a moment apart, or while
    /// nothing has moved since the first reading (the worker not started yet).
    pub fn rate(&self) -> Option<f64> {
        let (first, last) = (self.readings.front()?, self.readings.back()?);
        let seconds = last.0.duration_since(first.0).as_secs_f64();
        if seconds < 0.5 || last.1 <= self.started_at()? {
            return None;
        }
        Some((last.1 - first.1).max(0) as f64 / seconds)
    }

    /// The first count the window saw.
    fn started_at(&self) -> Option<i64> {
        self.readings.front().map(|(_, worked)| *worked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_measured_over_the_last_thirty_seconds_once_letters_move() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut meter = Meter::default();
        meter.observe(at(0), 0);
        assert_eq!(meter.rate(), None, "one reading");
        meter.observe(at(1), 0);
        assert_eq!(meter.rate(), None, "nothing moved yet: no rate, no ETA");
        meter.observe(at(2), 1000);
        assert_eq!(meter.rate(), Some(500.0));
        for s in 3..=40 {
            meter.observe(at(s), 1000 + (s as i64 - 2) * 100);
        }
        let rate = meter.rate().unwrap();
        assert!(
            (rate - 100.0).abs() < 1e-9,
            "{rate}: the burst left the window"
        );
    }

    #[test]
    fn durations_read_as_an_operator_says_them() {
        assert_eq!(duration(Duration::from_secs(45)), "45 s");
        assert_eq!(duration(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(duration(Duration::from_secs(7800)), "2 h 10 min");
    }
}
