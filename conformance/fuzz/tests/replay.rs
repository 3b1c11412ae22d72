//! Replays every committed seed (`seeds/<target>/`) and regression (`regressions/<target>/`) through its target
//! on the stable toolchain: `cargo test --manifest-path fuzz/Cargo.toml`. A crash the fuzzer found stays fixed.

use std::path::Path;

#[test]
fn seeds_and_regressions_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for (name, run) in weft_fuzz::TARGETS {
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                eprintln!("{name}: {}", path.display());
                run(&data);
                ran += 1;
            }
        }
    }
    for (name, _) in weft_fuzz::TARGETS {
        assert!(
            root.join("seeds")
                .join(name)
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some()),
            "no seed for {name}"
        );
    }
    assert!(ran > 0);
}
