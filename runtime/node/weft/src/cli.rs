//! Command line and environment: `weft run` (the node proxy) and `weft ca init` (a development root). The control
//! plane is its own binary (`weft-control`), as is the demo (`weft-demo`).
//! `weft run`'s flags are [`crate::config::NodeConfig`]'s.
// The doc comments of the argument structs are clap's `--help` text, written for a terminal: addresses such as
// `[::1]` and URLs stay plain there, not rustdoc links.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::bare_urls)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// weft: a node proxy for sidecar-less service meshes.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node proxy.
    ///
    /// Two modes (--mode, env WEFT_MODE). node (the default): weft's listeners (15001 outbound capture, 15006
    /// inbound plaintext, 15008 HBONE, 15080 SOCKS5) live in weft's own network namespace and the node's capture
    /// rules send workload traffic to them (a dev mesh, a VM, the demo). inpod (Istio ambient's model, a drop-in
    /// for ztunnel next to istio-cni): the CNI node agent installs capture rules inside each meshed pod and hands
    /// the pod's network namespace to weft over the ZDS socket (--inpod-uds); weft opens 15001, 15006 and 15008
    /// inside the pod (with SO_REUSEPORT unless --inpod-port-reuse false, so an upgrade can overlap), dials out
    /// from the pod's own address, and drains a pod when the agent deletes it.
    Run(Box<crate::config::RunArgs>),
    /// Certificate authority helpers.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Compile one plugin component (stdin) to an artifact (stdout) for `weft run`'s plugin host, which runs this
    /// in a child process so the node never pages in the compiler. Not for direct use.
    #[command(hide = true)]
    CompilePlugin {
        /// The engine settings (`--max-wasm-stack N`), from the parent.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        settings: Vec<String>,
    },
}

/// `weft ca ...`
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Write a development root (root-cert.pem, root-key.pem) into a directory.
    Init {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Trust domain recorded in the root's subject.
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
        /// Root lifetime.
        #[arg(long, default_value = "3650d", value_parser = humantime::parse_duration)]
        validity: Duration,
    },
}
