//! `local_config`: the local config file (ztunnel's local-config YAML plus weft's `plugins`), as `weft run
//! --config` and `weft-ca --mesh-config` read it, parsed with `weft_state::local::parse` and turned into a
//! `MeshState` snapshot. Input: the file's bytes (non-UTF-8 is skipped: the file is read as a string).
//!
//! Invariants: parsing is deterministic; a refused file has a message and a line within the text; an accepted
//! one builds a snapshot in which every workload is found by each of its IPs (the parser refuses duplicate uids
//! and IPs, so none may be silently shadowed) and by its uid, every service by its key, every service VIP and
//! workload IP resolves without panicking; the model serializes to JSON (as `/config_dump` does); every plugin's
//! `config` that was not written as a YAML string is JSON that the plugin SDK's reader accepts (it is what
//! `configure()` receives).

use std::net::SocketAddr;
use std::path::Path;

use weft_plugin_sdk::json::Value;

/// Feed one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = weft_state::local::parse(text, Path::new("/fuzz"));
    let again = weft_state::local::parse(text, Path::new("/fuzz"));
    match (&parsed, &again) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "parse is not deterministic"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "parse is not deterministic"),
        _ => panic!("parse is not deterministic"),
    }
    let cfg = match parsed {
        Ok(cfg) => cfg,
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            if let Some(line) = e.line() {
                // YAML breaks lines at `\r\n`, `\n` and a lone `\r`.
                let lines = text.replace("\r\n", "\n").matches(['\n', '\r']).count() + 1;
                assert!(
                    (1..=lines + 1).contains(&line),
                    "error at line {line} of a {lines}-line file: {msg}"
                );
            }
            return;
        }
    };
    // What `/config_dump` does.
    for w in &cfg.workloads {
        serde_json::to_string(w)
            .map(drop)
            .unwrap_or_else(|e| panic!("workload does not serialize: {e}"));
    }
    for s in &cfg.services {
        serde_json::to_string(s)
            .map(drop)
            .unwrap_or_else(|e| panic!("service does not serialize: {e}"));
    }
    for p in &cfg.policies {
        serde_json::to_string(p)
            .map(drop)
            .unwrap_or_else(|e| panic!("policy does not serialize: {e}"));
    }
    for p in &cfg.plugins {
        serde_json::to_string(p)
            .map(drop)
            .unwrap_or_else(|e| panic!("plugin does not serialize: {e}"));
    }
    check_plugin_configs(text, &cfg);

    let state = cfg.clone().into_state(1);
    for w in &cfg.workloads {
        assert!(
            state.workloads.contains_key(&w.uid),
            "workload {} lost",
            w.uid
        );
        for ip in &w.addresses {
            let found = state.workload_by_ip(*ip).map(|f| f.uid.as_str());
            assert_eq!(found, Some(w.uid.as_str()), "{ip} of {} shadowed", w.uid);
            let _ = state.resolve(SocketAddr::new(*ip, 80));
        }
        let _ = w.spiffe_id();
    }
    for s in &cfg.services {
        assert!(
            state.services.contains_key(&s.key()),
            "service {} lost",
            s.key()
        );
        for (_, vip) in &s.vips {
            for port in s.ports.keys().copied().chain([0, 1, u16::MAX]) {
                let _ = state.resolve(SocketAddr::new(*vip, port));
            }
        }
    }
    for n in cfg.workloads.iter().map(|w| w.node.as_str()) {
        let _ = state.local_workloads(n).count();
    }
}

/// A plugin `config:` other than a YAML string is handed to `configure()` as JSON; the SDK's reader must take it.
fn check_plugin_configs(text: &str, cfg: &weft_state::LocalConfig) {
    if cfg.plugins.is_empty() {
        return;
    }
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(text) else {
        return;
    };
    let Some(list) = doc.get("plugins").and_then(|p| p.as_sequence()) else {
        return;
    };
    for (item, spec) in list.iter().zip(&cfg.plugins) {
        if matches!(item.get("config"), Some(serde_yaml::Value::String(_))) {
            continue;
        }
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&spec.config) {
            panic!(
                "plugin {:?}: config {:?} is not JSON: {e}",
                spec.name, spec.config
            );
        }
        if let Err(e) = spec.config.parse::<Value>() {
            panic!(
                "plugin {:?}: the SDK cannot read its config {:?}: {e}",
                spec.name, spec.config
            );
        }
    }
}
