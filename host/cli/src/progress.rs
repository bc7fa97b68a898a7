//! What a real `reconcile` is doing while it works, on stderr: the Proxies being stepped and
//! the provider call each is in, image transfers with bytes and rate, and the run's wait with
//! its deadline. On a terminal it draws live lines with `indicatif`; anywhere else it writes
//! a few plain lines (a call started or ended, a transfer every quarter, the run when its
//! counts change), so a CI log shows progress without escape codes or a line per tick.
//!
//! It is a `tracing` layer: it follows the spans and events the run emits anyway (the
//! `reconcile` span of each step, the `provider.<op>` spans, libvirt's `volume upload …`
//! events, and the run's own `egress_proxies::progress` event), so no code path knows about
//! terminals. It is written here rather than taken from `tracing-indicatif`, which draws a
//! bar for every span and needs the instrumented code to set lengths and positions on its
//! spans: the transfer lives in a library that has no business with progress bars.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The target of the run's own progress event.
pub const RUN_TARGET: &str = "egress_proxies::progress";

/// `--progress`: how a real run shows its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProgressMode {
    /// Live lines when stderr is a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Live lines, terminal or not.
    Live,
    /// Plain lines.
    Plain,
    /// Nothing beyond the logs.
    Off,
}

/// What `mode` comes to for a stderr that is (or is not) a terminal of type `term`.
pub fn resolve(mode: ProgressMode, stderr_is_terminal: bool, term: Option<&str>) -> View {
    let terminal = stderr_is_terminal && term.is_none_or(|t| t != "dumb");
    match mode {
        ProgressMode::Auto if terminal => View::Live,
        ProgressMode::Auto | ProgressMode::Plain => View::Plain,
        ProgressMode::Live => View::Live,
        ProgressMode::Off => View::Off,
    }
}

/// What is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Live,
    Plain,
    Off,
}

/// How often live lines are redrawn: elapsed times and countdowns move with it.
const TICK: Duration = Duration::from_millis(200);
/// A step gets a live line once it has run this long: most steps are one quick `get`, and a
/// line that appears and goes within a frame is flicker.
const STEP_SHOWN_AFTER: Duration = Duration::from_millis(400);
/// Plain lines about the run: when its counts change, at most this often, and at least this
/// often while it waits.
const PLAIN_RUN_MIN: Duration = Duration::from_secs(2);
const PLAIN_RUN_MAX: Duration = Duration::from_secs(30);
/// Plain lines about a transfer: every quarter of it, or this often when its size is unknown.
const PLAIN_TRANSFER_EVERY: Duration = Duration::from_secs(10);

/// The handle: installed as a layer and as the log writer by `telemetry::init`, switched on
/// by the command that does long work. Off until then: the layer ignores everything.
#[derive(Clone, Default)]
pub struct Progress {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    active: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    out: Option<Out>,
    steps: HashMap<u64, Step>,
    transfers: HashMap<String, Transfer>,
    run: Option<RunLine>,
    plain_run: Option<(Instant, RunCounts)>,
}

enum Out {
    Live {
        multi: MultiProgress,
        run: ProgressBar,
        stop: Arc<AtomicBool>,
        ticker: Option<std::thread::JoinHandle<()>>,
    },
    Plain(Box<dyn Write + Send>),
}

struct Step {
    proxy: String,
    provider: String,
    deleting: bool,
    started: Instant,
    call: Option<(String, Instant)>,
    bar: Option<ProgressBar>,
}

struct Transfer {
    total: Option<u64>,
    bytes: u64,
    started: Instant,
    /// Recent (time, bytes) points: the rate shown is over these, so a stalled transfer
    /// shows its rate falling to nothing rather than its last burst.
    recent: std::collections::VecDeque<(Instant, u64)>,
    bar: Option<ProgressBar>,
    plain_reported: (Instant, u64),
}

/// The window the live rate is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(3);

impl Transfer {
    /// Bytes per second over the last RATE_WINDOW, now: from the oldest point inside the
    /// window to now, so a transfer that stopped moving shows its rate falling, and one that
    /// has not moved for a whole window shows none.
    fn recent_rate(&mut self, now: Instant) -> f64 {
        while self.recent.len() > 1
            && self
                .recent
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
        let Some(&(at, bytes)) = self.recent.front() else {
            return 0.0;
        };
        let span = now.duration_since(at);
        if span > RATE_WINDOW {
            return 0.0;
        }
        let span = span.max(Duration::from_millis(100));
        self.bytes.saturating_sub(bytes) as f64 / span.as_secs_f64()
    }

    /// The live line after the bar: how far, of what, how fast, and how long to go.
    fn live_text(&mut self, now: Instant) -> String {
        let rate = self.recent_rate(now);
        let mut s = mib(self.bytes);
        if let Some(total) = self.total {
            let _ = write!(s, " of {}", mib(total));
        }
        let _ = write!(s, ", {}/s", mib(rate as u64));
        match self.total {
            Some(total) if rate >= 1.0 => {
                let left = total.saturating_sub(self.bytes) as f64 / rate;
                let _ = write!(s, ", {} left", human(Duration::from_secs_f64(left)));
            }
            Some(_) => s.push_str(", stalled"),
            None => {}
        }
        s
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct RunCounts {
    proxies: u64,
    steady: u64,
    in_flight: u64,
}

struct RunLine {
    counts: RunCounts,
    at: Instant,
    next_step_ms: Option<u64>,
    deadline_ms: u64,
    /// Unix milliseconds.
    deadline_wall_ms: u64,
}

impl Progress {
    /// Starts showing `view` on stderr. A second start replaces the first.
    pub fn start(&self, view: View) {
        let out = match view {
            View::Off => None,
            View::Plain => Some(Out::Plain(Box::new(std::io::stderr()))),
            View::Live => Some(self.live(ProgressDrawTarget::stderr())),
        };
        self.start_with(out);
    }

    /// Plain lines into `out` (tests).
    pub fn start_plain(&self, out: Box<dyn Write + Send>) {
        self.start_with(Some(Out::Plain(out)));
    }

    /// Start before the work it follows: starting rebuilds the callsites' interest, and a
    /// callsite first hit on another thread at that very moment may keep the interest it
    /// computed while the layer was off.
    fn start_with(&self, out: Option<Out>) {
        self.stop();
        let on = out.is_some();
        self.lock().out = out;
        self.shared.active.store(on, Ordering::SeqCst);
        if on {
            tracing::callsite::rebuild_interest_cache();
        }
    }

    fn live(&self, target: ProgressDrawTarget) -> Out {
        let multi = MultiProgress::with_draw_target(target);
        let run = multi.add(ProgressBar::new_spinner());
        run.set_style(style("{spinner:.cyan} {msg}"));
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (Arc::downgrade(&self.shared), stop.clone());
        // A thread, not a task: the layer may be started outside a runtime, and redrawing is
        // a few microseconds every tick.
        let ticker = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    std::thread::sleep(TICK);
                    let Some(shared) = weak.upgrade() else { return };
                    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                    state.redraw();
                }
            })
            .ok();
        Out::Live {
            multi,
            run,
            stop,
            ticker,
        }
    }

    /// Clears the live lines (the report comes next) and stops listening.
    pub fn stop(&self) {
        if self.shared.active.swap(false, Ordering::SeqCst) {
            tracing::callsite::rebuild_interest_cache();
        }
        let mut state = self.lock();
        let out = state.out.take();
        *state = State::default();
        drop(state);
        if let Some(Out::Live {
            multi,
            run,
            stop,
            ticker,
        }) = out
        {
            stop.store(true, Ordering::SeqCst);
            if let Some(t) = ticker {
                let _ = t.join();
            }
            run.finish_and_clear();
            let _ = multi.clear();
        }
    }

    /// Runs `f` (which writes to the terminal) with the live lines out of its way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.multi() {
            Some(m) => m.suspend(f),
            None => f(),
        }
    }

    fn multi(&self) -> Option<MultiProgress> {
        match &self.lock().out {
            Some(Out::Live { multi, .. }) => Some(multi.clone()),
            _ => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while drawing leaves nothing half-written that matters: go on.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The layer to install; it sees only what `wanted` names, and only while started.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        ProgressLayer {
            progress: self.clone(),
        }
        .with_filter(Gate {
            shared: self.shared.clone(),
        })
    }

    /// A log writer that keeps log lines from tearing through the live lines.
    pub fn log_writer(&self) -> LogWriter {
        LogWriter {
            progress: self.clone(),
        }
    }
}

/// The spans and events the layer follows.
fn wanted(meta: &Metadata<'_>) -> bool {
    let t = meta.target();
    (t == "egress_control::reconciler" && meta.name() == "reconcile")
        || (t == "egress_runtime::provider" && meta.name().starts_with("provider."))
        || (t.starts_with("libvirt_rpc::transfer") && meta.is_event())
        || t == RUN_TARGET
}

/// Lets through what the layer follows, only while it is started: per span or event an
/// atomic load, so a run without progress pays nothing else.
struct Gate {
    shared: Arc<Shared>,
}

impl<S> Filter<S> for Gate {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.shared.active.load(Ordering::Relaxed) && wanted(meta)
    }

    /// Never while stopped: a per-layer filter's `false` from `enabled` does not keep the
    /// span from being built (the registry builds it for the other layers, although none
    /// wants it), so a run without progress would build every provider call's span for
    /// nothing. Starting and stopping rebuild the callsites' interest.
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if wanted(meta) && self.shared.active.load(Ordering::Relaxed) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }
}

struct ProgressLayer {
    progress: Progress,
}

/// The fields the layer reads, from a span or an event.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    proxy: Option<String>,
    provider: Option<String>,
    deleting: bool,
    error_type: Option<String>,
    url: Option<String>,
    bytes: Option<u64>,
    total: Option<u64>,
    proxies: Option<u64>,
    steady: Option<u64>,
    in_flight: Option<u64>,
    next_step_ms: Option<u64>,
    deadline_ms: Option<u64>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let slot = match field.name() {
            "message" => &mut self.message,
            "proxy" => &mut self.proxy,
            "provider" => &mut self.provider,
            "error.type" => &mut self.error_type,
            "url" => &mut self.url,
            _ => return,
        };
        *slot = Some(value.to_owned());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let slot = match field.name() {
            "bytes" => &mut self.bytes,
            "total" => &mut self.total,
            "proxies" => &mut self.proxies,
            "steady" => &mut self.steady,
            "in_flight" => &mut self.in_flight,
            "next_step_ms" => &mut self.next_step_ms,
            "deadline_ms" => &mut self.deadline_ms,
            _ => return,
        };
        *slot = Some(value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if let Ok(v) = u64::try_from(value) {
            self.record_u64(field, v);
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "deleting" {
            self.deleting = value;
        }
    }
}

/// What a provider call's span carries for the layer.
struct Call {
    step: Option<u64>,
    op: String,
    started: Instant,
    error_type: Option<String>,
}

impl<S> tracing_subscriber::Layer<S> for ProgressLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        let name = attrs.metadata().name();
        let now = Instant::now();
        if name == "reconcile" {
            self.progress.lock().steps.insert(
                id.into_u64(),
                Step {
                    proxy: f.proxy.unwrap_or_default(),
                    provider: f.provider.unwrap_or_default(),
                    deleting: f.deleting,
                    started: now,
                    call: None,
                    bar: None,
                },
            );
        } else if let Some(op) = name.strip_prefix("provider.") {
            let Some(span) = ctx.span(id) else { return };
            let step = span
                .scope()
                .skip(1)
                .find(|s| s.name() == "reconcile")
                .map(|s| s.id().into_u64());
            let call = Call {
                step,
                op: op.to_owned(),
                started: now,
                error_type: None,
            };
            self.progress.lock().call_started(&call);
            span.extensions_mut().insert(call);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        values.record(&mut f);
        if let (Some(e), Some(span)) = (f.error_type, ctx.span(id))
            && let Some(call) = span.extensions_mut().get_mut::<Call>()
        {
            call.error_type = Some(e);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.name() == "reconcile" {
            self.progress.lock().step_ended(id.into_u64());
        } else if let Some(call) = span.extensions_mut().remove::<Call>() {
            self.progress.lock().call_ended(&call);
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let mut state = self.progress.lock();
        if event.metadata().target() == RUN_TARGET {
            state.run(&f);
        } else if let (Some(message), Some(url)) = (&f.message, &f.url) {
            state.transfer(message, url, f.bytes.unwrap_or(0), f.total);
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// "1m 05s", "12s", "1.2s": what a person reads at a glance.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else if s >= 10 {
        format!("{s}s")
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn rate(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", mib((bytes as f64 / secs) as u64))
}

/// The local wall-clock time of `at` as HH:MM:SS UTC, for a deadline a person compares with
/// a clock.
fn clock(at_ms: u64) -> String {
    let secs = at_ms / 1000;
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        (day % 3600) / 60,
        day % 60
    )
}

impl State {
    fn live(&self) -> Option<&MultiProgress> {
        match &self.out {
            Some(Out::Live { multi, .. }) => Some(multi),
            _ => None,
        }
    }

    fn plain(&mut self, line: &str) {
        if let Some(Out::Plain(w)) = &mut self.out {
            let _ = writeln!(w, "{line}");
            let _ = w.flush();
        }
    }

    fn call_started(&mut self, call: &Call) {
        let Some(step) = call.step.and_then(|id| self.steps.get_mut(&id)) else {
            return;
        };
        step.call = Some((call.op.clone(), call.started));
        // Creates and deletes are the long calls worth a line of their own; gets and checks
        // are many and quick.
        if matches!(call.op.as_str(), "create" | "delete") {
            let line = format!("{}: {} on {}", step.proxy, call.op, step.provider);
            self.plain(&line);
        }
    }

    fn call_ended(&mut self, call: &Call) {
        let Some(step) = call.step.and_then(|id| self.steps.get_mut(&id)) else {
            return;
        };
        step.call = None;
        if matches!(call.op.as_str(), "create" | "delete") {
            let took = human(call.started.elapsed());
            let line = match &call.error_type {
                Some(e) => format!("{}: {} failed ({e}) after {took}", step.proxy, call.op),
                None => format!("{}: {} done in {took}", step.proxy, call.op),
            };
            self.plain(&line);
        }
    }

    fn step_ended(&mut self, id: u64) {
        if let Some(Step { bar: Some(bar), .. }) = self.steps.remove(&id) {
            bar.finish_and_clear();
            if let Some(m) = self.live() {
                m.remove(&bar);
            }
        }
    }

    fn transfer(&mut self, message: &str, url: &str, bytes: u64, total: Option<u64>) {
        let now = Instant::now();
        match message {
            "volume upload started" => {
                let bar = self.live().map(|m| {
                    let bar = match total {
                        Some(t) => {
                            let b = ProgressBar::new(t);
                            b.set_style(style("  image {prefix} [{bar:24}] {msg}"));
                            b
                        }
                        None => {
                            let b = ProgressBar::new_spinner();
                            b.set_style(style("  image {prefix} {spinner} {msg}"));
                            b
                        }
                    };
                    bar.set_prefix(url.to_owned());
                    m.add(bar)
                });
                self.transfers.insert(
                    url.to_owned(),
                    Transfer {
                        total,
                        bytes,
                        started: now,
                        recent: std::collections::VecDeque::from([(now, bytes)]),
                        bar,
                        plain_reported: (now, 0),
                    },
                );
                let size = total.map_or_else(|| "of unknown size".into(), mib);
                self.plain(&format!("image {url}: transfer of {size} started"));
            }
            "volume upload progress" => {
                let Some(t) = self.transfers.get_mut(url) else {
                    return;
                };
                t.bytes = bytes;
                t.recent.push_back((now, bytes));
                if let Some(bar) = &t.bar {
                    bar.set_position(bytes);
                }
                let (at, done) = t.plain_reported;
                let due = match t.total {
                    Some(total) if total > 0 => bytes.saturating_mul(4) / total > done,
                    _ => now.duration_since(at) >= PLAIN_TRANSFER_EVERY,
                };
                if due {
                    let quarter = t
                        .total
                        .filter(|&x| x > 0)
                        .map_or(done + 1, |total| bytes.saturating_mul(4) / total);
                    t.plain_reported = (now, quarter);
                    let of = t
                        .total
                        .map(|x| format!(" of {}", mib(x)))
                        .unwrap_or_default();
                    let line = format!(
                        "image {url}: {}{of}, {}",
                        mib(bytes),
                        rate(bytes, t.started.elapsed())
                    );
                    self.plain(&line);
                }
            }
            "volume upload done" | "volume upload failed" => {
                let Some(t) = self.transfers.remove(url) else {
                    return;
                };
                if let Some(bar) = t.bar {
                    bar.finish_and_clear();
                    if let Some(m) = self.live() {
                        m.remove(&bar);
                    }
                }
                let took = t.started.elapsed();
                let line = if message.ends_with("done") {
                    format!(
                        "image {url}: {} in {}, {}",
                        mib(bytes),
                        human(took),
                        rate(bytes, took)
                    )
                } else {
                    format!("image {url}: transfer failed after {}", mib(bytes))
                };
                self.plain(&line);
            }
            _ => {}
        }
    }

    fn run(&mut self, f: &Fields) {
        let counts = RunCounts {
            proxies: f.proxies.unwrap_or(0),
            steady: f.steady.unwrap_or(0),
            in_flight: f.in_flight.unwrap_or(0),
        };
        let deadline_ms = f.deadline_ms.unwrap_or(0);
        let line = RunLine {
            counts,
            at: Instant::now(),
            next_step_ms: f.next_step_ms,
            deadline_ms,
            deadline_wall_ms: egress_time::now::unix_now_millis().saturating_add(deadline_ms),
        };
        if matches!(self.out, Some(Out::Plain(_))) {
            let due = match self.plain_run {
                None => true,
                Some((at, last)) => {
                    let since = at.elapsed();
                    (last != counts && since >= PLAIN_RUN_MIN) || since >= PLAIN_RUN_MAX
                }
            };
            if due {
                self.plain_run = Some((Instant::now(), counts));
                let text = line.text();
                self.plain(&text);
            }
        }
        self.run = Some(line);
    }

    /// Brings the live lines up to date: the run's line, a line for each step that has run a
    /// while, with the call it is in and for how long.
    fn redraw(&mut self) {
        let Some(Out::Live { multi, run, .. }) = &self.out else {
            return;
        };
        if let Some(line) = &self.run {
            run.set_message(line.text());
        }
        run.tick();
        let now = Instant::now();
        for t in self.transfers.values_mut() {
            let text = t.live_text(now);
            if let Some(bar) = &t.bar {
                bar.set_message(text);
            }
        }
        for step in self.steps.values_mut() {
            if step.bar.is_none() && step.started.elapsed() >= STEP_SHOWN_AFTER {
                let bar = multi.insert_after(run, ProgressBar::new_spinner());
                bar.set_style(style("  {spinner} {msg}"));
                step.bar = Some(bar);
            }
            if let Some(bar) = &step.bar {
                let mut msg = format!("{} ({})", step.proxy, step.provider);
                if step.deleting {
                    msg.push_str(" deleting");
                }
                match &step.call {
                    Some((op, at)) => {
                        let _ = write!(msg, ": {op} {}", human(at.elapsed()));
                    }
                    None => {
                        let _ = write!(msg, ": reconciling {}", human(step.started.elapsed()));
                    }
                }
                bar.set_message(msg);
                bar.tick();
            }
        }
    }
}

impl RunLine {
    fn text(&self) -> String {
        let since = self.at.elapsed().as_millis() as u64;
        let c = self.counts;
        let mut s = format!("{} of {} Proxies steady", c.steady, c.proxies);
        if c.in_flight > 0 {
            let _ = write!(s, ", {} in flight", c.in_flight);
        }
        if let Some(next) = self.next_step_ms {
            let left = next.saturating_sub(since);
            if left > 0 {
                let _ = write!(s, ", next step in {}", human(Duration::from_millis(left)));
            }
        }
        let left = self.deadline_ms.saturating_sub(since);
        let _ = write!(
            s,
            "; deadline {} (in {})",
            clock(self.deadline_wall_ms),
            human(Duration::from_millis(left))
        );
        s
    }
}

/// `MakeWriter` for the log layer: a log line is written whole, with the live lines
/// suspended around it, so neither tears the other.
#[derive(Clone)]
pub struct LogWriter {
    progress: Progress,
}

pub struct LogLine {
    progress: Progress,
    buf: Vec<u8>,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine {
            progress: self.progress.clone(),
            buf: Vec::new(),
        }
    }
}

impl Write for LogLine {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        self.progress.suspend(|| {
            let _ = std::io::stderr().write_all(&buf);
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Held by each test that installs the layer. The callsites' interest is global:
    /// tracing-core computes a callsite's interest from every live subscriber's answer when
    /// the callsite is first hit and when interest is rebuilt, and two such computations on
    /// two threads may land in either order. A test's first hit of `step`'s spans, made while
    /// another test's gate is still closed, could land after that test's start had opened it
    /// and leave the spans at "never" for it. In a process there is one subscriber, started
    /// before the work it follows.
    static LAYER_TESTS: Mutex<()> = Mutex::new(());

    fn one_at_a_time() -> MutexGuard<'static, ()> {
        LAYER_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` under a subscriber holding only the progress layer, in plain mode.
    fn plain(f: impl FnOnce()) -> String {
        let _one = one_at_a_time();
        let progress = Progress::default();
        let out = Captured::default();
        let subscriber = tracing_subscriber::registry().with(progress.layer());
        tracing::subscriber::with_default(subscriber, || {
            progress.start_plain(Box::new(out.clone()));
            f();
            progress.stop();
        });
        out.text()
    }

    /// What the runtime's spans look like, by target and name.
    fn step(proxy: &str, op: &str, fail: Option<&str>) {
        let step = tracing::info_span!(target: "egress_control::reconciler", "reconcile", proxy, provider = "kvm", deleting = false);
        let _in = step.enter();
        let call = tracing::info_span!(target: "egress_runtime::provider", "provider.create", provider = "kvm", error.type = tracing::field::Empty);
        if op == "create" {
            let _c = call.enter();
            if let Some(e) = fail {
                call.record("error.type", e);
            }
        }
        drop(call);
        let get = tracing::info_span!(target: "egress_runtime::provider", "provider.get", provider = "kvm");
        drop(get);
    }

    #[test]
    fn plain_lines_say_creates_and_their_outcome_and_not_every_get() {
        let text = plain(|| {
            step("ns/a", "create", None);
            step("ns/b", "create", Some("ImageNotFound"));
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "ns/a: create on kvm");
        assert!(lines[1].starts_with("ns/a: create done in "), "{text}");
        assert_eq!(lines[2], "ns/b: create on kvm");
        assert!(
            lines[3].starts_with("ns/b: create failed (ImageNotFound) after "),
            "{text}"
        );
        assert!(!text.contains("get"), "{text}");
        assert!(!text.contains('\u{1b}'), "no escape codes: {text:?}");
    }

    #[test]
    fn plain_lines_report_a_transfer_by_quarters_with_its_rate() {
        let url = "http://127.0.0.1:1/a.qcow2";
        let total = 100u64 << 20;
        let text = plain(|| {
            tracing::trace!(target: "libvirt_rpc::transfer", url, bytes = 0u64, total, "volume upload started");
            for mib in 1..=100u64 {
                tracing::trace!(target: "libvirt_rpc::transfer", url, bytes = mib << 20, total, "volume upload progress");
            }
            tracing::info!(target: "libvirt_rpc::transfer", url, bytes = total, "volume upload done");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!("image {url}: transfer of 100.0 MiB started")
        );
        let progress: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains(" of 100.0 MiB, "))
            .collect();
        assert_eq!(progress.len(), 4, "one line per quarter: {text}");
        assert!(progress[0].contains(": 25.0 MiB of 100.0 MiB, "), "{text}");
        assert!(progress[0].ends_with("MiB/s"), "{text}");
        assert!(
            lines
                .last()
                .unwrap()
                .starts_with(&format!("image {url}: 100.0 MiB in ")),
            "{text}"
        );
    }

    #[test]
    fn the_run_line_names_counts_and_the_deadline_and_repeats_only_on_change() {
        let text = plain(|| {
            for _ in 0..50 {
                tracing::trace!(target: RUN_TARGET, proxies = 3u64, steady = 1u64, in_flight = 2u64, next_step_ms = 5_000u64, deadline_ms = 600_000u64, "run");
            }
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(
            lines[0]
                .starts_with("1 of 3 Proxies steady, 2 in flight, next step in 5.0s; deadline "),
            "{text}"
        );
        assert!(lines[0].ends_with("UTC (in 10m 00s)"), "{text}");
    }

    #[test]
    fn nothing_is_seen_before_start_or_after_stop() {
        let _one = one_at_a_time();
        let progress = Progress::default();
        let subscriber = tracing_subscriber::registry().with(progress.layer());
        tracing::subscriber::with_default(subscriber, || {
            step("ns/a", "create", None);
            assert!(progress.lock().steps.is_empty());
        });
    }

    #[test]
    fn auto_is_live_only_on_a_terminal_that_is_not_dumb() {
        assert_eq!(resolve(ProgressMode::Auto, true, Some("xterm")), View::Live);
        assert_eq!(resolve(ProgressMode::Auto, true, None), View::Live);
        assert_eq!(resolve(ProgressMode::Auto, true, Some("dumb")), View::Plain);
        assert_eq!(
            resolve(ProgressMode::Auto, false, Some("xterm")),
            View::Plain
        );
        assert_eq!(resolve(ProgressMode::Live, false, None), View::Live);
        assert_eq!(resolve(ProgressMode::Off, true, None), View::Off);
        assert_eq!(resolve(ProgressMode::Plain, true, None), View::Plain);
    }

    #[test]
    fn a_stalled_transfer_shows_its_rate_fall_to_nothing() {
        let t0 = Instant::now();
        let mut t = Transfer {
            total: Some(4 << 20),
            bytes: 0,
            started: t0,
            recent: std::collections::VecDeque::from([(t0, 0)]),
            bar: None,
            plain_reported: (t0, 0),
        };
        for (ms, bytes) in [(500, 1u64 << 20), (1_000, 2 << 20)] {
            t.bytes = bytes;
            t.recent.push_back((t0 + Duration::from_millis(ms), bytes));
        }
        let moving = t.recent_rate(t0 + Duration::from_millis(1_000));
        assert!((moving - 2.0 * 1_048_576.0).abs() < 1.0, "{moving}");
        assert!(
            t.live_text(t0 + Duration::from_millis(1_000))
                .contains("2.0 MiB of 4.0 MiB, 2.0 MiB/s, 1.0s left")
        );
        let slowing = t.recent_rate(t0 + Duration::from_millis(2_000));
        assert!(slowing < moving, "{slowing} < {moving}");
        assert_eq!(t.recent_rate(t0 + Duration::from_millis(4_500)), 0.0);
        assert!(
            t.live_text(t0 + Duration::from_millis(4_500))
                .ends_with(", 0.0 MiB/s, stalled")
        );
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(human(Duration::from_millis(1_234)), "1.2s");
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(65)), "1m 05s");
        assert_eq!(human(Duration::from_secs(3_720)), "1h 02m");
    }
}
