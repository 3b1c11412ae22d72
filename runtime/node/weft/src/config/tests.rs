//! The config as `weft run` reads it: flags, env vars, the config file under them, the checks and their errors.
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::time::Duration;

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

/// The command line `weft run --node n1 --config /dev/null <extra>`, read as the binary reads it.
fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
    let argv = ["weft", "run", "--node", "n1", "--config", "/dev/null"];
    let cli = Cli::try_parse_from(argv.iter().chain(extra))?;
    match cli.command {
        Command::Run(args) => Ok(*args),
        _ => panic!("not `weft run`"),
    }
}

/// The config `weft run --node n1 --config /dev/null <extra>` runs with, or the error it stops with.
pub(crate) fn parse(extra: &[&str]) -> Result<NodeConfig, String> {
    let args = run_args(extra).map_err(|e| e.to_string())?;
    load(args, None).map_err(|e| e.to_string())
}

fn with_file(yaml: &str, extra: &[&str]) -> Result<NodeConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.yaml");
    std::fs::write(&path, yaml).unwrap();
    let path = path.display().to_string();
    let mut args = vec!["--config-file", path.as_str()];
    args.extend(extra);
    parse(&args)
}

#[test]
fn worker_threads_default_to_a_quarter_of_the_cpus_and_at_least_two() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.worker_threads, WorkerThreads::Auto);
    let auto = WorkerThreads::Auto;
    assert_eq!(
        [1, 2, 4, 8, 9, 16, 64].map(|c| auto.count(c, 0)),
        [2, 2, 2, 2, 3, 4, 16]
    );
    // With shards the workers only keep the books: one.
    assert_eq!([1, 2, 64].map(|c| auto.count(c, 2)), [1, 1, 1]);
    let c = parse(&["--worker-threads", "1"]).unwrap();
    assert_eq!(c.worker_threads, WorkerThreads::Fixed(1));
    assert_eq!(c.worker_threads.count(64, 0), 1);
    let c = parse(&["--worker-threads", "3"]).unwrap();
    assert_eq!(c.worker_threads.count(8, 2), 3);
    for bad in ["0", "1.5", "1025", "all", ""] {
        let err = parse(&["--worker-threads", bad]).unwrap_err();
        assert!(err.contains("--worker-threads"), "{bad}: {err}");
    }
}

#[test]
fn shards_default_to_the_data_thread_count() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.shards, ShardCount::Auto);
    let auto = ShardCount::Auto;
    assert_eq!(
        [1, 2, 4, 8, 9, 16, 64].map(|c| auto.count(c)),
        [2, 2, 2, 2, 3, 4, 16]
    );
    for (flag, n) in [("0", 0), ("1", 1), ("3", 3)] {
        let c = parse(&["--shards", flag]).unwrap();
        assert_eq!(c.shards, ShardCount::Fixed(n));
        assert_eq!(c.shards.count(64), n);
    }
    for bad in [
        "--shards=-1",
        "--shards=1.5",
        "--shards=1025",
        "--shards=all",
        "--shards=",
    ] {
        let err = parse(&[bad]).unwrap_err();
        assert!(err.contains("--shards"), "{bad}: {err}");
    }
}

#[test]
fn plugin_timing_flags_default_and_parse() {
    let c = parse(&[]).unwrap();
    let defaults = weft_plugin_host::HostConfig::default();
    assert_eq!(c.tuning.plugin_telemetry_linger, defaults.telemetry_linger);
    assert_eq!(c.tuning.plugin_epoch_tick, defaults.epoch_tick);
    let c = parse(&[
        "--plugin-telemetry-linger",
        "50ms",
        "--plugin-epoch-tick",
        "2ms",
    ])
    .unwrap();
    assert_eq!(c.tuning.plugin_telemetry_linger, Duration::from_millis(50));
    assert_eq!(c.tuning.plugin_epoch_tick, Duration::from_millis(2));
}

#[test]
fn an_epoch_tick_outside_what_can_enforce_the_call_deadline_is_refused() {
    for bad in ["0s", "50us", "11ms", "1s", "soon"] {
        let err = parse(&["--plugin-epoch-tick", bad]).unwrap_err();
        assert!(err.contains("--plugin-epoch-tick"), "{bad}: {err}");
    }
    assert!(parse(&["--plugin-epoch-tick", "100us"]).is_ok());
    assert!(parse(&["--plugin-epoch-tick", "10ms"]).is_ok());
    // From the file too, named by its flag.
    let err = with_file("tuning:\n  pluginEpochTick: 1s\n", &[]).unwrap_err();
    assert!(err.starts_with("--plugin-epoch-tick: "), "{err}");
}

#[test]
fn the_shadow_report_interval_defaults_to_10s_and_zero_is_refused() {
    let c = parse(&[]).unwrap();
    assert_eq!(
        c.plugin_xds.plugin_shadow_report_interval,
        Duration::from_secs(10)
    );
    let c = parse(&["--plugin-shadow-report-interval", "1m"]).unwrap();
    assert_eq!(
        c.plugin_xds.plugin_shadow_report_interval,
        Duration::from_secs(60)
    );
    for bad in ["0s", "0", "soon"] {
        let err = parse(&["--plugin-shadow-report-interval", bad]).unwrap_err();
        assert!(
            err.contains("--plugin-shadow-report-interval"),
            "{bad}: {err}"
        );
    }
    let err = parse(&["--plugin-shadow-report-interval", "0s"]).unwrap_err();
    assert!(err.contains("must not be zero"), "{err}");
    // From the file too, named by its flag.
    let err = with_file("pluginXds:\n  pluginShadowReportInterval: 0s\n", &[]).unwrap_err();
    assert!(
        err.starts_with("--plugin-shadow-report-interval: must not be zero"),
        "{err}"
    );
    let c = with_file("pluginXds:\n  pluginShadowReportInterval: 30s\n", &[]).unwrap();
    assert_eq!(
        c.plugin_xds.plugin_shadow_report_interval,
        Duration::from_secs(30)
    );
}

#[test]
fn the_config_file_fills_what_no_flag_gave_and_flags_win() {
    let yaml = "node: from-file\ncaDir: /etc/ca\nsocks5: off\nworkerThreads: 3\n\
                ca:\n  caKind: istio\n  caTimeout: 30s\ntuning:\n  logLinger: 0s\n  pluginRolloutMinCalls: 7\n";
    // --node n1 is on the command line: it wins over the file's.
    let c = with_file(yaml, &["--worker-threads", "auto"]).unwrap();
    assert_eq!(c.node, "n1");
    assert_eq!(c.worker_threads, WorkerThreads::Auto);
    assert_eq!(c.ca_dir.as_deref(), Some(std::path::Path::new("/etc/ca")));
    assert_eq!(c.socks5, Listen::Off);
    assert_eq!(c.ca.ca_kind, CaKind::Istio);
    assert_eq!(c.ca.ca_timeout, Duration::from_secs(30));
    assert_eq!(c.tuning.log_linger, Duration::ZERO);
    assert_eq!(c.tuning.plugin_rollout_min_calls, 7);
    // What neither gave keeps its default.
    assert_eq!(c.cluster_domain, "cluster.local");
}

#[test]
fn the_file_may_give_the_settings_the_command_line_otherwise_requires() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.yaml");
    std::fs::write(
        &path,
        "node: n2\nxds:\n  xdsAddress: https://istiod:15012\n",
    )
    .unwrap();
    let cli =
        Cli::try_parse_from(["weft", "run", "--config-file", path.to_str().unwrap()]).unwrap();
    let Command::Run(args) = cli.command else {
        panic!("not `weft run`")
    };
    let c = load(*args, None).unwrap();
    assert_eq!(c.node, "n2");
    assert_eq!(c.xds.xds_address.as_deref(), Some("https://istiod:15012"));
    // Without the file clap still asks for them.
    assert!(Cli::try_parse_from(["weft", "run"]).is_err());
}

#[test]
fn file_errors_name_the_key_and_the_flag() {
    let err = with_file("sock5: off\n", &[]).unwrap_err();
    assert!(err.contains("unknown key `sock5`"), "{err}");
    let err = with_file("ca:\n  kind: istio\n", &[]).unwrap_err();
    assert!(err.contains("unknown key `ca.kind`"), "{err}");
    let err = with_file("inboundPlaintext: 15006\n", &[]).unwrap_err();
    assert!(
        err.starts_with("--inbound-plaintext: `inboundPlaintext` in --config-file"),
        "{err}"
    );
    let err = with_file("- a list\n", &[]).unwrap_err();
    assert!(err.starts_with("--config-file "), "{err}");
}

#[test]
fn checks_name_the_flag() {
    let err = with_file("node: ''\n", &["--node", ""]).unwrap_err();
    assert!(err.starts_with("--node: required"), "{err}");
    let err = with_file("tuning:\n  pluginRolloutMaxFailureRatio: 2\n", &[]).unwrap_err();
    assert!(
        err.starts_with("--plugin-rollout-max-failure-ratio: "),
        "{err}"
    );
}

#[test]
fn the_config_reads_back_from_what_it_shows() {
    let c = parse(&[
        "--mark",
        "0x539",
        "--dns-upstream",
        "10.0.0.10",
        "--hbone",
        "off",
    ])
    .unwrap();
    let shown = serde_json::to_value(&c).unwrap();
    assert_eq!(shown["mark"], 0x539);
    assert_eq!(shown["hbone"], "off");
    assert_eq!(shown["tuning"]["logLinger"], "10ms");
    assert_eq!(shown["ca"]["caKind"], "local");
    let back: NodeConfig = serde_json::from_value(shown.clone()).unwrap();
    assert_eq!(serde_json::to_value(&back).unwrap(), shown);
}

#[test]
fn the_istio_meta_cluster_id_wins() {
    let args = run_args(&["--cluster-id", "flag"]).unwrap();
    assert_eq!(load(args, Some("meta".into())).unwrap().cluster_id, "meta");
    let args = run_args(&["--cluster-id", "flag"]).unwrap();
    assert_eq!(load(args, Some(String::new())).unwrap().cluster_id, "flag");
}

#[test]
fn tuning_flags_are_hidden_from_help_and_every_flag_has_an_env_var() {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    let mut hidden = Vec::new();
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        assert!(arg.get_env().is_some(), "--{long} has no env var");
        if arg.is_hide_set() {
            hidden.push(long.to_owned());
        }
    }
    hidden.sort();
    assert_eq!(hidden.len(), 10, "{hidden:?}");
}
