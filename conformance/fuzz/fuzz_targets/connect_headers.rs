#![no_main]
//! cargo-fuzz entry for `weft_fuzz::connect_headers` (what it feeds and checks is documented there).

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft_fuzz::connect_headers::run(data));
