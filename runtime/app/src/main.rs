//! The `weft` binary: parse the command line and hand over.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = weft::cli::Cli::parse();
    weft::dispatch(cli)
}
