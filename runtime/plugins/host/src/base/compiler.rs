//! Where plugin components are compiled to machine code: in this process, or in a short-lived child process
//! that hands back the compiled artifact, so the node never pages in the compiler.
//!
//! Compiling runs Cranelift: several MiB of code and a heap high-water mark that a node proxy would otherwise
//! keep resident for its whole life, for a step that happens only when a plugin changes. With
//! [`Compiler::Subprocess`], the node runs its own executable (`/proc/self/exe`: the very binary it runs, even if
//! the file was replaced since) with a subcommand that calls [`compile_child_main`]: the component's bytes go in
//! on stdin, the compiled artifact comes out on stdout, and a reason on stderr with exit code 1 when the bytes are
//! not a valid component. The node then only loads the artifact.
//!
//! The child builds its engine from the same [`EngineSettings`] as the node's engine, so the artifact is compiled
//! for exactly the node's tunables; wasmtime checks that again when the node loads it. A child that cannot be
//! started, crashes, is killed, outlives its deadline or writes more than the size cap fails the load with
//! [`LoadError::Compiler`]: the plugin is rejected, its previous version keeps serving, and nothing falls back to
//! compiling in the node.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use wasmtime::{Config, Engine};

use crate::base::error::LoadError;

/// Largest artifact accepted from a compiler child (a compiled plugin is a few MiB).
pub(crate) const MAX_ARTIFACT_BYTES: u64 = 512 << 20;
/// Most bytes of a child's stderr kept for the error message.
const MAX_REASON_BYTES: u64 = 8 << 10;
/// Exit code of a child whose input is not a valid component (anything else is a compiler failure).
const EXIT_INVALID: i32 = 1;
/// Exit code of a child whose own setup failed (bad arguments, no engine).
const EXIT_SETUP: i32 = 2;

/// How plugins are compiled.
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process (library users, tests).
    #[default]
    InProcess,
    /// In a child process per compile.
    Subprocess(SubprocessCompiler),
}

/// A child process that compiles one component: `program args.. --max-wasm-stack N`, which must
/// call [`compile_child_main`] with those settings.
///
/// What the child writes is loaded as machine code: wasmtime checks only the artifact's header (version, target,
/// flags, tunables), not what the code does. `program` must therefore be weft itself (or a program as trusted);
/// `weft run` only ever uses its own executable, `/proc/self/exe`.
#[derive(Debug, Clone)]
pub struct SubprocessCompiler {
    /// The executable (`weft run` uses `/proc/self/exe`).
    pub program: PathBuf,
    /// Arguments before the engine settings (`weft run`: the hidden `compile-plugin` subcommand).
    pub args: Vec<OsString>,
    /// A child still running after this is killed and the load fails.
    pub timeout: Duration,
    /// The child's address-space cap in bytes (`RLIMIT_AS`), which the child sets on itself before it reads the
    /// component (passed as `--address-space-limit N`): a component that drives the compiler's memory past it
    /// fails that compile (the failed allocation is an error the child reports, or an abort the host reports with
    /// its signal) instead of growing without bound on the node. None: no cap.
    pub address_space_limit: Option<u64>,
}

/// `weft run`'s default for [`SubprocessCompiler::address_space_limit`]: far above what compiling the default
/// plugins takes (the executable's own mappings included), far below a node's memory.
pub const DEFAULT_COMPILE_ADDRESS_SPACE: u64 = 2 << 30;

/// Address space reserved per linear memory: all a 32-bit index can reach, so loads and stores need no bounds check.
const MEMORY_RESERVATION: u64 = 1 << 32;
/// Inaccessible space after each reservation: covers the static offsets a load or store adds to its index (an offset
/// beyond it, which compilers do not emit for ordinary code, keeps an explicit check).
const MEMORY_GUARD: u64 = 32 << 20;

/// Address space one pooled linear memory takes: its reservation and the guard behind it.
pub(crate) const fn memory_slot_bytes() -> u64 {
    MEMORY_RESERVATION + MEMORY_GUARD
}

/// The engine settings that decide what compiled code looks like; the node's engine and a compiler child's are
/// built from the same values. The linear-memory cap is not one of them: every memory reserves the same address
/// space whatever its cap, and the cap is enforced on growth by the node's pool and store limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSettings {
    /// Wasm stack cap per call.
    pub max_wasm_stack: usize,
}

impl EngineSettings {
    /// The wasmtime configuration these settings give, without an allocation strategy (the node adds its pool;
    /// the allocator does not change the compiled code).
    pub(crate) fn config(&self) -> Config {
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .wasm_component_model(true)
            .max_wasm_stack(self.max_wasm_stack)
            // Every memory reserves the whole 32-bit index space and a guard behind it, so the compiled code has
            // no bounds check on its loads and stores: an access past the pages an instance may use lands on an
            // inaccessible page and traps. This is address space only (slots × 4 GiB for the pool, never
            // resident); the memory cap is enforced on growth by the node's pool and store limiter.
            .memory_reservation(MEMORY_RESERVATION)
            .memory_reservation_for_growth(0)
            .memory_guard_size(MEMORY_GUARD);
        config
    }

    fn args(&self) -> [OsString; 2] {
        [
            "--max-wasm-stack".into(),
            self.max_wasm_stack.to_string().into(),
        ]
    }

    /// Parses the settings a parent passes its compile child (`--max-wasm-stack N`).
    pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Self, String> {
        let mut max_wasm_stack = None;
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let slot = match flag.as_str() {
                "--max-wasm-stack" => &mut max_wasm_stack,
                other => return Err(format!("unknown argument {other:?}")),
            };
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            *slot = Some(
                value
                    .parse::<usize>()
                    .map_err(|e| format!("{flag} {value:?}: {e}"))?,
            );
        }
        Ok(Self {
            max_wasm_stack: max_wasm_stack.ok_or("--max-wasm-stack is missing")?,
        })
    }
}

/// What a compile produced.
pub(crate) enum Compiled {
    /// Compiled and loaded in this process.
    Loaded(wasmtime::component::Component),
    /// The artifact from a compiler child, still to be loaded.
    Artifact(Vec<u8>),
}

impl Compiler {
    /// Compiles `bytes` (a component): in this process with `engine`, or in a child for an engine built from
    /// `settings` (the ones `engine` was built from).
    pub(crate) fn compile(
        &self,
        engine: &Engine,
        settings: EngineSettings,
        bytes: &[u8],
    ) -> Result<Compiled, LoadError> {
        match self {
            Self::InProcess => wasmtime::component::Component::new(engine, bytes)
                .map(Compiled::Loaded)
                .map_err(|e| LoadError::Compile(format!("{e:#}"))),
            Self::Subprocess(child) => child.compile(settings, bytes).map(Compiled::Artifact),
        }
    }

    /// `in-process` or `subprocess`, for logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::InProcess => "in-process",
            Self::Subprocess(_) => "subprocess",
        }
    }
}

impl SubprocessCompiler {
    fn compile(&self, settings: EngineSettings, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
        let failed =
            |what: String| LoadError::Compiler(format!("{}: {what}", self.program.display()));
        let mut command = Command::new(&self.program);
        command.args(&self.args).args(settings.args());
        if let Some(limit) = self.address_space_limit {
            command.arg(ADDRESS_SPACE_FLAG).arg(limit.to_string());
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("cannot start the compiler process: {e}")))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed("the compiler process has no pipes".into()));
        };
        // The three pipes are served at once (a child blocked writing a full stdout would never read the rest
        // of its input); the artifact reader reports when the child closed stdout, i.e. finished or died.
        let input = bytes.to_vec();
        let writer = std::thread::Builder::new()
            .name("weft-compile-in".into())
            .spawn(move || stdin.write_all(&input))
            .map_err(|e| failed(format!("cannot start a thread: {e}")))?;
        let errors = std::thread::Builder::new()
            .name("weft-compile-err".into())
            .spawn(move || {
                let mut text = Vec::new();
                let mut capped = stderr.take(MAX_REASON_BYTES);
                let _ = capped.read_to_end(&mut text);
                // Drain the rest so the child never blocks on a full pipe.
                let _ = std::io::copy(&mut capped.into_inner(), &mut std::io::sink());
                String::from_utf8_lossy(&text).trim().to_string()
            })
            .map_err(|e| failed(format!("cannot start a thread: {e}")))?;
        let (done, finished) = mpsc::channel();
        std::thread::Builder::new()
            .name("weft-compile-out".into())
            .spawn(move || {
                let mut artifact = Vec::new();
                let read = stdout
                    .take(MAX_ARTIFACT_BYTES + 1)
                    .read_to_end(&mut artifact)
                    .map(|_| artifact);
                let _ = done.send(read);
            })
            .map_err(|e| failed(format!("cannot start a thread: {e}")))?;
        let artifact = match finished.recv_timeout(self.timeout) {
            Ok(read) => read,
            Err(_) => {
                // Still running (or its stdout was handed on): not reaped yet, so the pid is still this child's.
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!(
                    "the compiler process did not finish within {:?} and was killed",
                    self.timeout
                )));
            }
        };
        let status = child
            .wait()
            .map_err(|e| failed(format!("cannot wait for the compiler process: {e}")))?;
        let reason = errors.join().unwrap_or_default();
        let _ = writer.join();
        match status.code() {
            Some(0) => {}
            Some(EXIT_INVALID) => return Err(LoadError::Compile(reason)),
            _ => {
                return Err(failed(format!(
                    "the compiler process failed ({status}){}",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {reason}")
                    }
                )));
            }
        }
        let artifact =
            artifact.map_err(|e| failed(format!("cannot read the compiled artifact: {e}")))?;
        if artifact.len() as u64 > MAX_ARTIFACT_BYTES {
            return Err(failed(format!(
                "the compiled artifact is larger than {MAX_ARTIFACT_BYTES} bytes"
            )));
        }
        if artifact.is_empty() {
            return Err(failed("the compiler process wrote no artifact".into()));
        }
        Ok(artifact)
    }
}

/// The child's flag for its own address-space cap ([`SubprocessCompiler::address_space_limit`]).
const ADDRESS_SPACE_FLAG: &str = "--address-space-limit";

/// Takes `--address-space-limit N` out of the child's arguments: the cap, if given, and the engine settings' part.
fn split_address_space_limit(args: Vec<String>) -> Result<(Option<u64>, Vec<String>), String> {
    let mut limit = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == ADDRESS_SPACE_FLAG {
            let value = it
                .next()
                .ok_or_else(|| format!("{ADDRESS_SPACE_FLAG} needs a value"))?;
            limit = Some(
                value
                    .parse::<u64>()
                    .map_err(|e| format!("{ADDRESS_SPACE_FLAG} {value:?}: {e}"))?,
            );
        } else {
            rest.push(arg);
        }
    }
    Ok((limit, rest))
}

/// Caps this process's address space (`RLIMIT_AS`, soft and hard: it cannot be raised again).
#[allow(unsafe_code)]
fn limit_address_space(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: `setrlimit` reads one `rlimit` through a valid pointer; it changes only this process's limits.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The compiler child's whole job: cap its own address space if asked (`--address-space-limit N`), read a
/// component from `input`, compile it for an engine built from the other arguments (see
/// [`EngineSettings::parse_args`]) and write the artifact to `output`. Returns the process exit code: 0, 1 (the
/// input is not a valid component; the reason is on `errors`) or 2 (bad arguments, I/O, or an allocation the cap
/// refused where it can be reported); an allocation refused elsewhere aborts the process, which the parent
/// reports with the signal.
pub fn compile_child_main<I, R, W, E>(args: I, mut input: R, mut output: W, mut errors: E) -> i32
where
    I: IntoIterator<Item = String>,
    R: Read,
    W: Write,
    E: Write,
{
    let mut fail = |code: i32, why: String| {
        let _ = writeln!(errors, "{why}");
        code
    };
    let (limit, args) = match split_address_space_limit(args.into_iter().collect()) {
        Ok(split) => split,
        Err(e) => return fail(EXIT_SETUP, format!("bad arguments: {e}")),
    };
    let settings = match EngineSettings::parse_args(args) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_SETUP, format!("bad arguments: {e}")),
    };
    if let Some(bytes) = limit
        && let Err(e) = limit_address_space(bytes)
    {
        return fail(
            EXIT_SETUP,
            format!("cannot cap the address space at {bytes} bytes: {e}"),
        );
    }
    let engine = match Engine::new(&settings.config()) {
        Ok(e) => e,
        Err(e) => return fail(EXIT_SETUP, format!("cannot create the wasm engine: {e:#}")),
    };
    let mut bytes = Vec::new();
    if let Err(e) = input.read_to_end(&mut bytes) {
        return fail(EXIT_SETUP, format!("cannot read the component: {e}"));
    }
    let artifact = match engine.precompile_component(&bytes) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_INVALID, format!("{e:#}")),
    };
    if let Err(e) = output.write_all(&artifact).and_then(|()| output.flush()) {
        return fail(EXIT_SETUP, format!("cannot write the artifact: {e}"));
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_the_child_arguments() {
        let s = EngineSettings {
            max_wasm_stack: 512 << 10,
        };
        let args = s.args().map(|a| a.into_string().unwrap_or_default());
        assert_eq!(EngineSettings::parse_args(args), Ok(s));
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(EngineSettings::parse_args(args(&["--max-wasm-stack"])).is_err());
        assert!(EngineSettings::parse_args(args(&["--max-wasm-stack", "big"])).is_err());
        assert!(EngineSettings::parse_args(args(&["--bogus", "1"])).is_err());
        // A parent from before the memory cap left the engine settings is refused, not half-understood.
        assert!(
            EngineSettings::parse_args(args(&["--memory-limit", "1", "--max-wasm-stack", "2"]))
                .is_err()
        );
        assert!(
            EngineSettings::parse_args(Vec::new()).is_err(),
            "the stack cap is required"
        );
    }

    #[test]
    fn the_address_space_limit_is_taken_out_of_the_child_arguments() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (limit, rest) = split_address_space_limit(args(&[
            "--address-space-limit",
            "4096",
            "--max-wasm-stack",
            "2",
        ]))
        .unwrap();
        assert_eq!(limit, Some(4096));
        assert_eq!(rest, args(&["--max-wasm-stack", "2"]));
        assert_eq!(
            split_address_space_limit(args(&["--max-wasm-stack", "2"])).unwrap(),
            (None, args(&["--max-wasm-stack", "2"]))
        );
        assert!(split_address_space_limit(args(&["--address-space-limit"])).is_err());
        assert!(split_address_space_limit(args(&["--address-space-limit", "lots"])).is_err());
        // Bad limits are refused before anything is read or compiled.
        let mut out = Vec::new();
        let mut err = Vec::new();
        let bad = args(&["--address-space-limit", "x", "--max-wasm-stack", "2"]);
        assert_eq!(
            compile_child_main(bad, &b""[..], &mut out, &mut err),
            EXIT_SETUP
        );
    }

    #[test]
    fn the_child_rejects_bytes_that_are_not_a_component_with_exit_1_and_a_reason() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let args = ["--max-wasm-stack", "65536"].map(String::from);
        let code = compile_child_main(args, &b"not wasm"[..], &mut out, &mut err);
        assert_eq!(code, EXIT_INVALID);
        assert!(out.is_empty());
        assert!(!err.is_empty(), "a reason is written");
    }
}
