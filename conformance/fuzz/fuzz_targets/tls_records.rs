#![no_main]
//! cargo-fuzz entry for `weft_fuzz::tls_records` (what it feeds and checks is documented there).

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft_fuzz::tls_records::run(data));
