//! The weft binary runs on jemalloc with the options `src/main.rs` bakes in: jemalloc's own statistics dump (asked
//! for through its environment variable) reports them, and it warns about none of them.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::process::Command;

#[test]
fn the_binary_runs_on_jemalloc_with_its_options_in_effect() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Where the CPUs this process may run on are not all the machine's (a restricted cpuset), jemalloc cannot map
    // CPUs to arenas and says so, falling back to its default arenas: the one warning allowed, with its outcome.
    const AMBIGUOUS_CPUS: &str =
        "<jemalloc>: Number of CPUs detected is not deterministic. Per-CPU arena disabled.";
    let percpu = if stderr.contains(AMBIGUOUS_CPUS) {
        "opt.percpu_arena: \"disabled\""
    } else {
        "opt.percpu_arena: \"percpu\""
    };
    let stderr = stderr.replace(AMBIGUOUS_CPUS, "");
    assert!(
        !stderr.contains("<jemalloc>:"),
        "jemalloc refused an option: {}",
        stderr
            .lines()
            .filter(|l| l.contains("<jemalloc>"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for want in [
        "opt.background_thread: true",
        "opt.dirty_decay_ms: 1000",
        "opt.muzzy_decay_ms: 0",
        "opt.thp: \"never\"",
        percpu,
    ] {
        assert!(
            stderr.contains(want),
            "{want:?} not in jemalloc's statistics (is the binary on jemalloc?):\n{}",
            stderr.lines().take(40).collect::<Vec<_>>().join("\n")
        );
    }
}
