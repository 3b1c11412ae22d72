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

/// Texts that are not JSON (RFC 8259) and that the reader accepted, each with what it made of them.
#[test]
fn refuses_what_is_not_json() {
    for bad in [
        // Numbers: the grammar is `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
        "-0-",
        "0-",
        "01",
        "-01",
        "1.",
        ".5",
        "-.5",
        "1.e5",
        "1e",
        "1e+",
        "+1",
        "1E5.0",
        "0x10",
        "--1",
        "1-1",
        // Out of range: JSON has no infinity.
        "1e400",
        "-1e400",
        "[1e309]",
        // `\u` takes exactly four hex digits.
        r#""\u+041""#,
        r#""\u-041""#,
        r#""\u 041""#,
        // A high surrogate must be followed by a low one.
        r#""\ud800\u0041""#,
        r#""\ud800\ud800""#,
        r#""\ud800""#,
        r#""\udc00""#,
        // Control characters must be escaped.
        "\"a\u{0}b\"",
        "\"tab\there\"",
        "\"line\nbreak\"",
        "\"\u{1f}\"",
    ] {
        assert!(
            bad.parse::<Value>().is_err(),
            "{bad:?} is not JSON but reads as {:?}",
            bad.parse::<Value>()
        );
    }
}

/// The same texts' JSON neighbours still read as before.
#[test]
fn reads_json_numbers_and_escapes() {
    assert_eq!(parse("-0").as_f64(), Some(0.0));
    assert_eq!(parse("0.5").as_f64(), Some(0.5));
    assert_eq!(parse("-1.25e+2").as_f64(), Some(-125.0));
    assert_eq!(parse("1E-2").as_f64(), Some(0.01));
    assert_eq!(parse("1e-400").as_f64(), Some(0.0));
    assert_eq!(parse("[0,10]").as_array().map(<[Value]>::len), Some(2));
    assert_eq!(parse(r#""\u0041\u00e9""#).as_str(), Some("Aé"));
    assert_eq!(parse(r#""\ud83d\ude00""#).as_str(), Some("😀"));
    assert_eq!(parse("\"\u{7f}\u{e9}\"").as_str(), Some("\u{7f}é"));
}
