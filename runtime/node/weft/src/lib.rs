//! The weft node proxy: command line, wiring of state, identity, data path and admin, runtimes, signals, drain.

pub mod admin;
pub mod cli;
pub mod config;
pub mod default_plugins;
pub mod inpod;
pub mod node;
pub mod plugin_xds;
pub mod run;
pub mod xds;

use cli::{CaCommand, Cli, Command};
pub use config::NodeConfig;
pub use node::{NodeHandle, start};

/// Run a parsed command line.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let config = config::load(*args, std::env::var("ISTIO_META_CLUSTER_ID").ok())?;
            run::run(config)
        }
        Command::Ca(CaCommand::Init {
            out,
            trust_domain,
            validity,
        }) => {
            weft_identity::ca::write_root(&out, &trust_domain, validity)?;
            println!(
                "wrote {}/root-cert.pem and root-key.pem (mode 0600; for a single machine or development only)",
                out.display()
            );
            Ok(())
        }
        Command::CompilePlugin { settings } => {
            let code = weft_plugin_host::compile_child_main(
                settings,
                std::io::stdin().lock(),
                std::io::stdout().lock(),
                std::io::stderr().lock(),
            );
            std::process::exit(code)
        }
    }
}
