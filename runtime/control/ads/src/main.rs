//! `weft-control`: the same as `weft control` (see `weft_control::cli`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    weft_control::cli::main(weft_control::cli::ControlArgs::parse())
}
