//! `misbehave`: a deliberately malicious transport-policy plugin for the host's sandbox tests. Never ship it.
//!
//! The config names the misbehaviour; `authorize` misbehaves only for destination port 666 (so a test can mix good
//! and bad calls on one plugin) and allows everything else:
//! `loop` (endless loop), `bomb` (allocates until the memory cap), `trap` (wasm `unreachable`), `recursion`
//! (unbounded recursion), `big-reason` (a 10 MB deny reason), `panic` (a Rust panic = abort), `deny` (a plain deny),
//! `log-flood` (logs 10 000 lines per call), `metric-flood` (creates 10 000 series per call),
//! `configure-error` (`configure` fails), `configure-loop` (`configure` never returns), `state` (asks for the
//! authorization policies, refuses a set holding a policy named `reject-me`, and denies port 666 with a reason
//! listing the policy keys it holds), `workloads` (denies port 666 with `src=<name> dst=<name>`, read through the
//! workload handles the host lends, `-` for none).
//!
//! `trap-refill-spin` attacks the instance pool: `authorize` traps on every call (any port), and `configure`
//! spins until its deadline in every instance but the first one. Instances share nothing but the host, so an
//! instance learns it is not the first through the plugin's metric family cap: each `configure` first defines
//! a family under a name no other instance uses, then the first one fills the cap; every later instance's
//! first definition is refused.
//!
//! Host-API edges (port 666 again): `print` (`println!` and `eprintln!`, then allow), `panic-message` (panics with
//! a message naming the port), `random` (denies with 32 bytes of `wasi:random` in hex), `random-huge` (asks
//! `wasi:random` for 1 GiB in one call), `label-bomb` (one counter series per call with a 64 KiB label value),
//! `series` (series handles: the same labels twice must give one handle and the wrong number of values must be
//! refused, else it denies; then adds 1 + 2 through a handle and 5 through a handle it never got),
//! `series-flood` (registers a new series per call; denies with the host's refusal once there is one).
//!
//! Memory past the instance's own (port 666): `read-past-end` reads the first byte after the linear memory's
//! current end, `read-far` a byte near the top of the 32-bit address space, `write-past-end` writes the first byte
//! after the end; each must trap, however the engine enforces the bounds (explicit checks or guard pages).
//!
//! `authorize-scope` (the optional export): `scope-trap` traps, `scope-loop` never returns, `scope-nothing`
//! declares it needs to see no connection at all (while still denying port 666 if asked).

use weft_plugin_sdk::metrics::Counter;
use weft_plugin_sdk::{
    AuthorizationPolicy, Connection, ConnectionScope, Decision, DestinationScope, StateKinds,
    TransportPolicy, Workloads,
};

/// The configured misbehaviour.
pub struct Misbehave {
    mode: String,
    counter: Option<Counter>,
    sink: Vec<Vec<u8>>,
    policies: Vec<String>,
}

#[inline(never)]
fn recurse(depth: u64, pad: &mut [u64; 16]) -> u64 {
    pad[(depth % 16) as usize] = depth;
    let r = if depth < u64::MAX {
        recurse(depth + 1, pad)
    } else {
        0
    };
    r.wrapping_add(pad[(depth % 7) as usize])
}

/// `configure` of `trap-refill-spin`: returns in the plugin's first instance, spins in every later one.
fn not_first_instance_spins() {
    let own = format!(
        "misbehave_probe_{}",
        weft_plugin_sdk::metrics::monotonic_now_ns()
    );
    if Counter::define(&own, "Probe.", &[]).is_err() {
        // An earlier instance filled the family cap: this is not the first instance.
        loop {
            std::hint::black_box(&own);
        }
    }
    let mut i = 0u32;
    while i < 100_000 && Counter::define(&format!("misbehave_fill_{i}"), "Fill.", &[]).is_ok() {
        i += 1;
    }
}

impl TransportPolicy for Misbehave {
    fn configure(config: &str) -> Result<Self, String> {
        let mode = config.trim().trim_matches('"').to_string();
        match mode.as_str() {
            "configure-error" => return Err("misbehave: configure refuses this config".into()),
            "configure-loop" => loop {
                std::hint::black_box(&mode);
            },
            "trap-refill-spin" => not_first_instance_spins(),
            _ => {}
        }
        let counter = if mode == "metric-flood" {
            Some(Counter::define("misbehave_flood_total", "Flood.", &["n"])?)
        } else if mode == "series" || mode == "series-flood" {
            Some(Counter::define(
                "misbehave_series_total",
                "Series handles.",
                &["v"],
            )?)
        } else if mode == "label-bomb" {
            Some(Counter::define(
                "misbehave_label_bomb_total",
                "Huge label values.",
                &["v"],
            )?)
        } else {
            None
        };
        Ok(Misbehave {
            mode,
            counter,
            sink: Vec::new(),
            policies: Vec::new(),
        })
    }

    fn state_kinds(&self) -> StateKinds {
        if self.mode == "state" {
            StateKinds::AUTHORIZATION_POLICIES
        } else {
            StateKinds::empty()
        }
    }

    fn update_policies(&mut self, policies: Vec<AuthorizationPolicy>) -> Result<(), String> {
        if policies.iter().any(|p| p.name == "reject-me") {
            return Err("misbehave: refusing a policy named reject-me".into());
        }
        self.policies = policies
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        Ok(())
    }

    fn scope(&self) -> ConnectionScope {
        match self.mode.as_str() {
            "scope-trap" => core::arch::wasm32::unreachable(),
            "scope-loop" => loop {
                std::hint::black_box(&self.mode);
            },
            // Declares it needs to see nothing, though `authorize` denies port 666: the host trusts the
            // declaration, so port 666 is allowed.
            "scope-nothing" => ConnectionScope::Destinations(DestinationScope {
                namespaces: Vec::new(),
                policies: Vec::new(),
                unknown_destination: false,
            }),
            _ => ConnectionScope::All,
        }
    }

    fn authorize(&mut self, conn: &Connection, workloads: &Workloads<'_>) -> Decision {
        if self.mode == "trap-refill-spin" {
            core::arch::wasm32::unreachable();
        }
        if conn.destination.port != 666 {
            return Decision::Allow;
        }
        match self.mode.as_str() {
            "loop" => loop {
                std::hint::black_box(&self.mode);
            },
            "bomb" => loop {
                self.sink.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&self.sink);
            },
            "trap" => core::arch::wasm32::unreachable(),
            "read-past-end" | "read-far" | "write-past-end" => past_memory(&self.mode),
            "recursion" => {
                let mut pad = [0u64; 16];
                let n = recurse(0, &mut pad);
                Decision::Deny(format!("unreachable {n}"))
            }
            "big-reason" => Decision::Deny("x".repeat(10 * 1024 * 1024)),
            "panic" => panic!("misbehave panics"),
            "log-flood" => {
                for i in 0..10_000 {
                    weft_plugin_sdk::info!("flood line {i}");
                }
                Decision::Allow
            }
            "metric-flood" => {
                if let Some(c) = &self.counter {
                    for i in 0..10_000 {
                        c.inc(&[&i.to_string()]);
                    }
                }
                Decision::Allow
            }
            "state" => Decision::deny(format!("policies: [{}]", self.policies.join(","))),
            // What the host lends: the names behind both workload handles.
            "workloads" => {
                let name =
                    |w: Option<&weft_plugin_sdk::Workload>| w.map_or("-".to_string(), |w| w.name());
                Decision::deny(format!(
                    "src={} dst={}",
                    name(workloads.source),
                    name(workloads.destination)
                ))
            }
            "print" | "panic-message" | "random" | "random-huge" | "label-bomb" | "series"
            | "series-flood" => host_api_edge(&self.mode, self.counter.as_ref()),
            _ => Decision::deny("misbehave denies port 666"),
        }
    }
}

/// Touches memory the instance does not have (see the module documentation); returns only if the sandbox let it.
fn past_memory(mode: &str) -> Decision {
    let end = core::arch::wasm32::memory_size(0) * 65536;
    let addr = if mode == "read-far" { 0xffff_fff0 } else { end };
    // SAFETY: none, deliberately: the address is outside the linear memory, and the host must trap the access.
    unsafe {
        if mode == "write-past-end" {
            core::ptr::write_volatile(addr as *mut u8, 0x5a);
        } else {
            let b = core::ptr::read_volatile(addr as *const u8);
            return Decision::deny(format!(
                "read {b:#04x} at {addr:#x}, past the memory's end {end:#x}"
            ));
        }
    }
    Decision::deny(format!(
        "wrote at {addr:#x}, past the memory's end {end:#x}"
    ))
}

/// `wasi:random/random` imported directly (std reaches it only through small `getentropy` calls), to ask for
/// amounts std never would.
mod wasi_random {
    #[link(wasm_import_module = "wasi:random/random@0.2.0")]
    unsafe extern "C" {
        /// Canonical ABI: `get-random-bytes(len: u64) -> list<u8>`, the list written to `ret` as (ptr, len).
        #[link_name = "get-random-bytes"]
        fn get_random_bytes(len: i64, ret: *mut usize);
    }

    /// `len` random bytes from the host.
    pub fn bytes(len: u64) -> Vec<u8> {
        let mut ret = [0usize; 2];
        // SAFETY: the host writes a (ptr, len) pair into `ret`; the list was allocated with the module's
        // `cabi_realloc` (std's allocator), so the Vec owns it.
        unsafe {
            get_random_bytes(len as i64, ret.as_mut_ptr());
            Vec::from_raw_parts(ret[0] as *mut u8, ret[1], ret[1])
        }
    }
}

static LABEL_BOMB_CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn host_api_edge(mode: &str, counter: Option<&Counter>) -> Decision {
    match mode {
        "print" => {
            println!("misbehave println on port 666");
            eprintln!("misbehave eprintln on port 666");
            Decision::Allow
        }
        "panic-message" => panic!("misbehave panic message: port 666 is cursed"),
        "random" => {
            let bytes = wasi_random::bytes(32);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            Decision::deny(format!("random {hex}"))
        }
        "random-huge" => {
            let bytes = wasi_random::bytes(1 << 30);
            Decision::deny(format!("got {} random bytes", bytes.len()))
        }
        "series" => {
            let Some(c) = counter else {
                return Decision::deny("no counter");
            };
            let (Ok(a), Ok(again)) = (c.series(&["a"]), c.series(&["a"])) else {
                return Decision::deny("series refused");
            };
            if a != again {
                return Decision::deny(format!("two handles for one series: {a:?} {again:?}"));
            }
            if c.series(&["a", "b"]).is_ok() {
                return Decision::deny("a series with the wrong number of values was accepted");
            }
            a.inc();
            a.add(2);
            weft_plugin_sdk::bindings::weft::plugin::metrics::series_counter_add(u32::MAX, 5);
            Decision::Allow
        }
        "series-flood" => {
            let n = LABEL_BOMB_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match counter.map(|c| c.series(&[&n.to_string()])) {
                Some(Ok(s)) => {
                    s.inc();
                    Decision::Allow
                }
                Some(Err(e)) => Decision::deny(e),
                None => Decision::deny("no counter"),
            }
        }
        "label-bomb" => {
            let n = LABEL_BOMB_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(c) = counter {
                let mut value = format!("{n:08}-");
                value.push_str(&"x".repeat(64 * 1024 - value.len()));
                c.inc(&[&value]);
            }
            Decision::Allow
        }
        _ => Decision::Allow,
    }
}

weft_plugin_sdk::export_policy!(Misbehave);
