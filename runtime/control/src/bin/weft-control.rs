//! `weft-control`: the same as `weft control` (see `weft_control::ads::cli`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    weft_control::ads::cli::main(weft_control::ads::cli::ControlArgs::parse())
}
