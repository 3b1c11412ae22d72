//! Log output off the data path: formatted lines are appended to a buffer in memory, and one writer thread hands
//! what has gathered to stderr a few milliseconds after the first line of a batch arrived (sooner once 64 KiB
//! wait). A connection's access log line then costs a copy under a lock, not a `write` system call on a data-path
//! thread, and a slow reader at the other end of stderr (a container runtime's pipe) stalls no connection until
//! the buffer holds [`LogBuffer::CAP`] bytes; past that, the thread logging writes the buffer out itself (nothing
//! is dropped, and lines keep their order).
//!
//! An idle node's writer thread sleeps until a line arrives: no periodic wake-ups. With no linger (`--log-linger 0`)
//! there is no thread and every line is written as it is logged. The lines gathered are written
//! when the [`LogFlush`] guard drops (the end of `weft run`), and before a panic's message, so a crash report
//! follows the lines that led to it.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// The buffer shared by the threads that log and the writer thread.
pub struct LogBuffer<W> {
    state: Mutex<State>,
    wake: Condvar,
    /// Held while writing, so buffers taken one after the other are written in that order.
    out: Mutex<W>,
    linger: Duration,
}

#[derive(Default)]
struct State {
    bytes: Vec<u8>,
    /// A line arrived since the writer last looked.
    pending: bool,
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<W: Write + Send + 'static> LogBuffer<W> {
    /// Bytes gathered that make the writer write at once, before the linger is over.
    pub const SOON: usize = 64 * 1024;
    /// Bytes gathered past which the thread that logs writes them out itself (back-pressure on a stuck stderr).
    pub const CAP: usize = 4 * 1024 * 1024;

    /// Starts the writer thread for `out`. Dropping the returned guard writes what is left and stops it. A zero
    /// `linger` starts no thread: each line is written by the thread that logs it, as it is logged.
    pub fn start(out: W, linger: Duration) -> io::Result<(Arc<Self>, LogFlush)> {
        let buf = Arc::new(Self {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            out: Mutex::new(out),
            linger,
        });
        if linger.is_zero() {
            let me = buf.clone();
            let flush: Arc<dyn Fn() + Send + Sync> = Arc::new(move || me.try_write_out());
            return Ok((
                buf,
                LogFlush {
                    flush,
                    close: None,
                    thread: None,
                },
            ));
        }
        let worker = buf.clone();
        let thread = std::thread::Builder::new()
            .name("weft-log".into())
            .spawn(move || worker.run())?;
        let me = buf.clone();
        let flush: Arc<dyn Fn() + Send + Sync> = Arc::new(move || me.try_write_out());
        let me = buf.clone();
        let close: Box<dyn FnOnce() + Send> = Box::new(move || {
            lock(&me.state).closed = true;
            me.wake.notify_one();
        });
        Ok((
            buf,
            LogFlush {
                flush,
                close: Some(close),
                thread: Some(thread),
            },
        ))
    }

    fn append(&self, line: &[u8]) {
        if self.linger.is_zero() {
            let mut out = lock(&self.out);
            let _ = out.write_all(line).and_then(|()| out.flush());
            return;
        }
        let mut st = lock(&self.state);
        if st.closed {
            // The writer has stopped (the end of the run): nothing would write this line later. Whatever still
            // waits goes first, so the order holds.
            drop(st);
            let mut out = lock(&self.out);
            let waiting = std::mem::take(&mut lock(&self.state).bytes);
            let _ = out
                .write_all(&waiting)
                .and_then(|()| out.write_all(line))
                .and_then(|()| out.flush());
            return;
        }
        let before = st.bytes.len();
        st.bytes.extend_from_slice(line);
        let after = st.bytes.len();
        if after >= Self::CAP {
            drop(st);
            self.write_out();
        } else if before == 0 || (before < Self::SOON && after >= Self::SOON) {
            st.pending = true;
            drop(st);
            self.wake.notify_one();
        }
    }

    /// Writes everything gathered so far (in order with any write in progress).
    pub fn write_out(&self) {
        let mut out = lock(&self.out);
        let bytes = std::mem::take(&mut lock(&self.state).bytes);
        if bytes.is_empty() {
            return;
        }
        // Nowhere left to report a failure to write the log itself: the lines are gone either way.
        let _ = out.write_all(&bytes).and_then(|()| out.flush());
    }

    /// [`write_out`](Self::write_out) unless a lock is held (for a panic hook: the panicking thread may be the
    /// one holding it, and a panic must never wait on the log).
    fn try_write_out(&self) {
        use std::sync::TryLockError;
        let mut out = match self.out.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let bytes = match self.state.try_lock() {
            Ok(mut g) => std::mem::take(&mut g.bytes),
            Err(TryLockError::Poisoned(p)) => std::mem::take(&mut p.into_inner().bytes),
            Err(TryLockError::WouldBlock) => return,
        };
        if !bytes.is_empty() {
            let _ = out.write_all(&bytes).and_then(|()| out.flush());
        }
    }

    fn run(&self) {
        loop {
            let mut st = lock(&self.state);
            while !st.pending && !st.closed {
                st = self.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            st.pending = false;
            // Let the batch gather: until the linger is over, enough bytes wait, or the node stops.
            let deadline = Instant::now() + self.linger;
            while !st.closed && st.bytes.len() < Self::SOON {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self
                    .wake
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            let closed = st.closed;
            drop(st);
            self.write_out();
            if closed {
                return;
            }
        }
    }
}

/// One event's writer: appends the line the formatter hands it in one `write_all`.
pub struct LineWriter<'a, W>(&'a LogBuffer<W>);

impl<W: Write + Send + 'static> Write for LineWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The [`MakeWriter`] tracing's formatter writes through.
pub struct BufferedWriter<W>(pub Arc<LogBuffer<W>>);

impl<'a, W: Write + Send + 'static> MakeWriter<'a> for BufferedWriter<W> {
    type Writer = LineWriter<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(&self.0)
    }
}

/// Writes what is left and stops the writer thread when dropped.
pub struct LogFlush {
    flush: Arc<dyn Fn() + Send + Sync>,
    close: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for LogFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFlush").finish_non_exhaustive()
    }
}

impl LogFlush {
    /// A handle that writes what has gathered, for a panic hook (runs on any thread; skips the write rather than
    /// wait if a log lock is held).
    pub fn flusher(&self) -> Arc<dyn Fn() + Send + Sync> {
        self.flush.clone()
    }
}

impl Drop for LogFlush {
    fn drop(&mut self) {
        if let Some(close) = self.close.take() {
            close();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (self.flush)();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    /// A sink recording each write separately.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            lock(&self.0).push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn writes(&self) -> Vec<Vec<u8>> {
            lock(&self.0).clone()
        }
        fn text(&self) -> String {
            String::from_utf8(self.writes().concat()).unwrap()
        }
        /// Waits (on the writer thread's progress, not a fixed time) until `n` writes happened.
        fn wait_writes(&self, n: usize) {
            let give_up = Instant::now() + Duration::from_secs(30);
            while self.writes().len() < n {
                assert!(
                    Instant::now() < give_up,
                    "{} writes, expected {n}",
                    self.writes().len()
                );
                std::thread::yield_now();
            }
        }
    }

    fn line(w: &BufferedWriter<Sink>, s: &str) {
        w.make_writer().write_all(s.as_bytes()).unwrap();
    }

    /// Lines logged while the writer is busy go out together in one write, in order, without anything asking for
    /// a flush; the next line starts a new batch.
    #[test]
    fn lines_of_a_batch_go_out_together_in_order() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_millis(1)).unwrap();
        let w = BufferedWriter(buf.clone());
        {
            // The writer is busy (it cannot take the buffer) while these lines arrive.
            let _busy = lock(&buf.out);
            for i in 0..100 {
                line(&w, &format!("line {i}\n"));
            }
        }
        sink.wait_writes(1);
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), expected);
        assert_eq!(sink.writes().len(), 1, "one write for the batch");
        line(&w, "later\n");
        sink.wait_writes(2);
        assert_eq!(sink.writes()[1], b"later\n");
        drop(flush);
        assert_eq!(sink.writes().len(), 2);
    }

    /// Dropping the guard writes what is left at once, however long the linger.
    #[test]
    fn the_guard_writes_what_is_left() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_secs(3600)).unwrap();
        let w = BufferedWriter(buf);
        line(&w, "a\n");
        line(&w, "b\n");
        drop(flush);
        assert_eq!(sink.text(), "a\nb\n");
    }

    /// A line logged after the guard dropped (the writer has stopped) is written at once, not left behind.
    #[test]
    fn lines_after_the_end_are_written_at_once() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_secs(3600)).unwrap();
        let w = BufferedWriter(buf);
        line(&w, "last of the run\n");
        drop(flush);
        line(&w, "after the end\n");
        assert_eq!(sink.text(), "last of the run\nafter the end\n");
    }

    /// The flusher (the panic hook's) writes what has gathered without stopping the writer.
    #[test]
    fn the_flusher_writes_now_and_logging_goes_on() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_secs(3600)).unwrap();
        let w = BufferedWriter(buf);
        line(&w, "before the panic\n");
        (flush.flusher())();
        assert_eq!(sink.text(), "before the panic\n");
        line(&w, "after\n");
        drop(flush);
        assert_eq!(sink.text(), "before the panic\nafter\n");
    }

    /// Past the cap (the writer stuck, say on a full pipe), the thread that logs writes the buffer out itself once
    /// the writer lets go: nothing is dropped and the order holds.
    #[test]
    fn past_the_cap_nothing_is_dropped() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_secs(3600)).unwrap();
        let w = BufferedWriter(buf.clone());
        let n = LogBuffer::<Sink>::CAP / 1024 + 8;
        let lines: Vec<String> = (0..n).map(|i| format!("{i:>1023}\n")).collect();
        let busy = lock(&buf.out);
        let logger = std::thread::spawn({
            let lines = lines.clone();
            move || {
                for l in &lines {
                    line(&w, l);
                }
            }
        });
        // The logging thread crosses the cap and waits for the writer's lock: it has not written, and nothing is
        // out yet. (Checked once it is blocked: the buffer has stopped growing at the cap.)
        let give_up = Instant::now() + Duration::from_secs(30);
        while lock(&buf.state).bytes.len() < LogBuffer::<Sink>::CAP {
            assert!(Instant::now() < give_up, "the buffer never reached the cap");
            std::thread::yield_now();
        }
        assert!(sink.writes().is_empty());
        drop(busy);
        logger.join().unwrap();
        drop(flush);
        assert_eq!(sink.text(), lines.concat());
    }

    /// Without a linger, each line is written as it is logged, by the thread that logs it.
    #[test]
    fn no_linger_writes_each_line_at_once() {
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::ZERO).unwrap();
        let w = BufferedWriter(buf);
        line(&w, "one\n");
        assert_eq!(sink.writes(), vec![b"one\n".to_vec()]);
        line(&w, "two\n");
        assert_eq!(sink.writes().len(), 2);
        drop(flush);
        assert_eq!(sink.text(), "one\ntwo\n");
    }

    /// Tracing's formatter writes through it: one event, one line.
    #[test]
    fn tracing_events_arrive_through_the_buffer() {
        use tracing_subscriber::layer::SubscriberExt;
        let sink = Sink::default();
        let (buf, flush) = LogBuffer::start(sink.clone(), Duration::from_millis(1)).unwrap();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(BufferedWriter(buf)),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(conn = 7, "connection complete");
        });
        drop(flush);
        let text = sink.text();
        assert!(text.contains("connection complete conn=7"), "{text}");
        assert_eq!(text.lines().count(), 1);
    }
}
