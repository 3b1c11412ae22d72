//! Regressions found by fuzzing the SDK's JSON reader (`fuzz/`, target `plugin_json`): each input here once
//! made the reader disagree with RFC 8259 (as `serde_json` reads it) or with its own documentation.

use weft_plugin_sdk::json::Value;

fn parse(text: &str) -> Value {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

/// `as_u64` is "the number as an unsigned integer, if it is one exactly": 2^64 is not a u64, yet it came back as
/// `u64::MAX` (`as` saturates). `18446744073709551615` is read as the f64 2^64 too.
#[test]
fn as_u64_is_none_at_two_to_the_64() {
    assert_eq!(parse("18446744073709551616").as_u64(), None);
    assert_eq!(parse("18446744073709551615").as_u64(), None);
    assert_eq!(parse("1e20").as_u64(), None);
    // The largest f64 below 2^64 is a u64.
    assert_eq!(
        parse("18446744073709549568").as_u64(),
        Some(18_446_744_073_709_549_568)
    );
    assert_eq!(parse("0").as_u64(), Some(0));
}
