//! `misbehave`: a deliberately malicious transport-policy plugin for the host's sandbox tests. Never ship it.
//!
//! The config names the misbehaviour; `authorize` misbehaves only for destination port 666 (so a test can mix good
//! and bad calls on one plugin) and allows everything else:
//! `loop` (endless loop), `bomb` (allocates until the memory cap), `trap` (wasm `unreachable`), `recursion`
//! (unbounded recursion), `big-reason` (a 10 MB deny reason), `panic` (a Rust panic = abort), `deny` (a plain deny),
//! `log-flood` (logs 10 000 lines per call), `metric-flood` (creates 10 000 series per call),
//! `configure-error` (`configure` fails), `configure-loop` (`configure` never returns), `state` (asks for the
//! authorization policies, refuses a set holding a policy named `reject-me`, and denies port 666 with a reason
//! listing the policy keys it holds).

use weft_plugin_sdk::metrics::Counter;
use weft_plugin_sdk::{
    AuthorizationPolicy, Connection, Decision, StateKinds, TransportPolicy, Workloads,
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

impl TransportPolicy for Misbehave {
    fn configure(config: &str) -> Result<Self, String> {
        let mode = config.trim().trim_matches('"').to_string();
        match mode.as_str() {
            "configure-error" => return Err("misbehave: configure refuses this config".into()),
            "configure-loop" => loop {
                std::hint::black_box(&mode);
            },
            _ => {}
        }
        let counter = if mode == "metric-flood" {
            Some(Counter::define("misbehave_flood_total", "Flood.", &["n"])?)
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

    fn authorize(&mut self, conn: &Connection, _workloads: &Workloads<'_>) -> Decision {
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
            _ => Decision::deny("misbehave denies port 666"),
        }
    }
}

weft_plugin_sdk::export_policy!(Misbehave);
