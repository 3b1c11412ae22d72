//! `plugin_json`: a plugin's `config` string as the plugin SDK's JSON reader (`weft_plugin_sdk::json`) parses it
//! in `configure()`. weft hands over the YAML `config:` turned into JSON, or a YAML string as written, so the
//! operator controls every byte. Input: the string (non-UTF-8 is skipped: the WIT `string` is UTF-8).
//!
//! Invariant: the SDK's reader agrees with `serde_json` (RFC 8259): it accepts exactly what serde_json accepts
//! (up to the nesting limit both apply) and reads the same value (numbers as f64; objects compared when their keys
//! are unique). Every accessor is exercised.

use weft_plugin_sdk::json::Value;

fn same(sdk: &Value, reference: &serde_json::Value) -> bool {
    match (sdk, reference) {
        (Value::Null, serde_json::Value::Null) => true,
        (Value::Bool(a), serde_json::Value::Bool(b)) => a == b,
        (Value::Number(a), serde_json::Value::Number(b)) => b.as_f64().is_some_and(|b| b == *a),
        (Value::String(a), serde_json::Value::String(b)) => a == b,
        (Value::Array(a), serde_json::Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), serde_json::Value::Object(b)) => {
            let mut keys: Vec<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            keys.dedup();
            if keys.len() != a.len() {
                // Duplicate keys: RFC 8259 leaves their meaning open; only the key sets must match.
                return keys.len() == b.len() && keys.iter().all(|k| b.contains_key(*k));
            }
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        _ => false,
    }
}

fn touch(v: &Value) {
    let _ = (v.as_str(), v.as_f64(), v.as_u64(), v.as_bool(), v.get("a"));
    if let Some(n) = v.as_f64()
        && let Some(u) = v.as_u64()
    {
        // Exactly: 2^64 is not a u64 (and `as` would saturate it to u64::MAX).
        assert!(
            n < 18_446_744_073_709_551_616.0 && u as f64 == n,
            "as_u64 {u} of {n}"
        );
    }
    if let Some(items) = v.as_array() {
        items.iter().for_each(touch);
    }
    if let Some(members) = v.as_object() {
        members.iter().for_each(|(_, m)| touch(m));
    }
}

/// Feed one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let sdk = text.parse::<Value>();
    let reference = serde_json::from_str::<serde_json::Value>(text);
    match (&sdk, &reference) {
        (Ok(v), Ok(r)) => {
            assert!(same(v, r), "SDK reads {v:?}, serde_json {r:?}");
            touch(v);
        }
        (Err(_), Err(_)) => {}
        // Both stop at about 128 levels of nesting, not at the same one.
        (Ok(_), Err(e)) if e.to_string().starts_with("recursion limit exceeded") => {}
        (Ok(v), Err(e)) => panic!("SDK accepts what is not JSON ({e}): {v:?}"),
        (Err(e), Ok(_)) => panic!("SDK refuses JSON: {e}"),
    }
}
