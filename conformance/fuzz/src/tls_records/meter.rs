//! Metering the victim's reads: `poll_read` calls, transport reads and the thread's CPU time, bounded linearly in
//! what the attacker sent.

use super::*;

/// CPU time this thread has used, in nanoseconds.
pub(super) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the C library knows.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The victim's reads: how many, and the CPU time spent inside them.
#[derive(Default)]
pub(super) struct Meter {
    pub(super) polls: u64,
    pub(super) cpu_ns: u64,
    /// `read` calls the script made (each at least one poll).
    pub(super) reads: u64,
}

/// The CPU bound's constants (see [`Meter::check`]). An unoptimised build (the CI smoke, with AddressSanitizer; the
/// stable seed replay) runs the same Rust code 10 to 45 times slower, so its bound is 40 times wider.
pub(super) const CPU_SCALE: u64 = match env!("WEFT_FUZZ_OPT_LEVEL").as_bytes() {
    b"0" => 40,
    _ => 1,
};
pub(super) const CPU_BASE_NS: u64 = 20_000_000;
/// Per byte on the wire, per record opened, per key update derived, per `poll_read`.
pub(super) const CPU_PER_BYTE_NS: u64 = 20;
pub(super) const CPU_PER_RECORD_NS: u64 = 2_000;
pub(super) const CPU_PER_KEY_UPDATE_NS: u64 = 100_000;
pub(super) const CPU_PER_POLL_NS: u64 = 20_000;
/// Runs of one input before a CPU time over the bound fails it: the time is measured, and a cold start or a
/// neighbour on the machine can inflate one run's; a path that is too slow is slow every time.
pub(super) const CPU_ATTEMPTS: usize = 3;

/// The CPU time the victim's reads took, and what the bound allows.
#[derive(Debug)]
pub(super) struct CpuUse {
    pub(super) ns: u64,
    pub(super) bound_ns: u64,
}

impl Meter {
    /// The victim's work, bounded linearly in what the attacker made it do. Deterministic counts:
    ///
    /// - `poll_read` calls ≤ 4 + 3 × reads + records / 8: a read returns when it has data, when the transport has
    ///   nothing, or after 16 records that deliver nothing (it wakes itself first); one read the script makes
    ///   polls until nothing has arrived, so once more than what delivered something. (And, checked after each
    ///   read, at least one poll per 16 records that delivered nothing: no read keeps the worker longer.)
    /// - reads from the transport ≤ 4 + 2 × polls + wire bytes / 1024 (a poll reads until a record is whole; a
    ///   read brings at least a byte, and at least 32 KiB while the peer sent that much).
    ///
    /// And the CPU time of the thread inside the victim's `poll_read` (returned, checked by [`run`] over up to 3
    /// runs): ≤ 20 ms + 20 ns × wire bytes + 2 µs × records + 100 µs × key updates + 20 µs × polls, all × 40 in an
    /// unoptimised build. Measured in the optimised fuzz build (AddressSanitizer and coverage on): about 0.25 ns
    /// per byte of bulk data, 0.5 µs per small record, 10 µs per key update with its data record, 3 µs per poll;
    /// the seeds' floods stay 6 to 15 times under the bound, and in a 60 s fuzz run no input used more than a fifth
    /// of its bound. A quadratic path injected to try the bound (a scan of the buffered handshake bytes per
    /// handshake record; of the read buffer per record) took 2 and 8 times the bound on the 64 KiB-message seed.
    /// A path quadratic in the bytes one read buffers (256 KiB) or in a handshake message (64 KiB) costs more than
    /// the bound allows on the large inputs the script can make (1 MiB on the wire, 10,000 steps).
    pub(super) fn check(&self, transport_reads: u64, model: &Model) -> CpuUse {
        let wire = model.wire_len as u64;
        let records = model.records_opened;
        let polls_bound = 4 + 3 * self.reads + records / 8;
        assert!(
            self.polls <= polls_bound,
            "the victim was polled {} times to read {} records over {} reads (bound {polls_bound})",
            self.polls,
            records,
            self.reads
        );
        let reads_bound = 4 + 2 * self.polls + wire / 1024;
        assert!(
            transport_reads <= reads_bound,
            "the victim read its transport {transport_reads} times for {wire} bytes and {} polls (bound \
             {reads_bound})",
            self.polls
        );
        let bound_ns = CPU_SCALE
            * (CPU_BASE_NS
                + CPU_PER_BYTE_NS * wire
                + CPU_PER_RECORD_NS * records
                + CPU_PER_KEY_UPDATE_NS * model.key_updates
                + CPU_PER_POLL_NS * self.polls);
        if std::env::var_os("TLS_RECORDS_STATS").is_some() {
            eprintln!(
                "tls_records: victim {}, read {:?}; {wire} bytes, {records} records, {} key updates, {} reads, {} \
                 polls, {transport_reads} transport reads, {} µs CPU (bound {} µs)",
                if model.victim_is_client {
                    "client"
                } else {
                    "server"
                },
                model.read,
                model.key_updates,
                self.reads,
                self.polls,
                self.cpu_ns / 1000,
                bound_ns / 1000
            );
        }
        CpuUse {
            ns: self.cpu_ns,
            bound_ns,
        }
    }
}

/// A victim's `poll_read`, metered.
pub(super) struct Metered<'a> {
    pub(super) s: &'a mut TlsStream<Tap>,
    pub(super) meter: &'a mut Meter,
}

impl AsyncRead for Metered<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let start = thread_cpu_ns();
        let r = Pin::new(&mut *this.s).poll_read(cx, buf);
        this.meter.cpu_ns += thread_cpu_ns().saturating_sub(start);
        this.meter.polls += 1;
        r
    }
}
