//! Each part's own config, derived from the [`NodeConfig`] in one place: the data path's, the DNS proxy's, the
//! plugin host's, the CA client's and the certificate manager's, and the thread counts.

use std::time::Duration;

use weft_identity::ManagerConfig;
use weft_identity::select::CaSettings;
use weft_plugin_host::{Compiler, HostConfig, SubprocessCompiler};
use weft_proxy::{InboundBind, OriginalSource, ProxyConfig};

use super::{CaKind, HboneListen, Mode, NodeConfig, PluginCompiler};

impl NodeConfig {
    /// The data path's settings (the shards are added by whoever starts them).
    pub fn proxy_config(&self) -> ProxyConfig {
        let mut c = ProxyConfig::new(self.node.clone());
        c.cluster_id = self.cluster_id.clone();
        c.network = self.network.clone();
        c.outbound_addr = self.outbound.addr();
        c.socks5_addr = self.socks5.addr();
        c.inbound_plaintext_addr = self.inbound_plaintext.addr();
        c.inbound = match self.hbone {
            HboneListen::At(addr) => InboundBind::Addr(addr),
            HboneListen::Workloads => InboundBind::Workloads {
                port: self.hbone_port,
            },
            HboneListen::Off => InboundBind::Disabled,
        };
        c.hbone_port = self.hbone_port;
        c.mark = self.mark;
        c.bind_source_ip = self.bind_source_ip;
        c.original_source = match (self.original_source, self.inpod.mode) {
            (Some(true), _) => OriginalSource::Required,
            (Some(false), _) => OriginalSource::Off,
            (None, Mode::Inpod) => OriginalSource::BestEffort,
            (None, Mode::Node) => OriginalSource::Off,
        };
        c.response_baggage = self.response_baggage;
        c.tls_record_layer = self.tls_record_layer;
        c.idle_timeout = self.idle_timeout;
        c.drain_deadline = self.drain_deadline;
        c.max_connections_per_listener =
            (self.max_connections_per_listener > 0).then_some(self.max_connections_per_listener);
        c
    }

    /// How the DNS proxy answers.
    pub fn dns_config(&self) -> weft_dns::DnsConfig {
        weft_dns::DnsConfig {
            cluster_domain: self.cluster_domain.clone(),
            ..Default::default()
        }
    }

    /// The DNS proxy's forwarding: `--dns-upstream`, else the resolvers of `--dns-resolv-conf`. A resolv.conf
    /// that cannot be read, or names no server, is logged and leaves the proxy without upstreams (mesh names are
    /// still answered; forwarded questions get SERVFAIL), so a node is never kept down by its forwarding setup.
    pub fn dns_forwarding(&self) -> weft_dns::ForwarderConfig {
        let mut fwd = weft_dns::ForwarderConfig::default();
        if self.dns_upstream.is_empty() {
            match weft_dns::resolv::load(&self.dns_resolv_conf) {
                Ok(conf) => {
                    fwd.upstreams = conf.nameservers;
                    fwd.timeout = conf.timeout;
                    fwd.attempts = conf.attempts;
                }
                Err(e) => tracing::warn!(error = %e,
                    "DNS proxy has no upstream resolver: names outside the mesh will get SERVFAIL (set --dns-upstream)"),
            }
        } else {
            fwd.upstreams = self.dns_upstream.clone();
        }
        tracing::info!(upstreams = ?fwd.upstreams, "DNS proxy forwards to");
        fwd
    }

    /// The data path's worker threads on a machine where this process may use `cpus` CPUs.
    pub fn worker_threads(&self, cpus: usize) -> usize {
        self.worker_threads.count(cpus, self.shard_count(cpus))
    }

    /// The data path's shards on a machine where this process may use `cpus` CPUs (0: none).
    pub fn shard_count(&self, cpus: usize) -> usize {
        self.shards.count(cpus)
    }

    /// The plugin host's settings on a machine where this process may use `cpus` CPUs. A call never creates a
    /// plugin instance (it fails with `no_instance` when none is idle), so each policy plugin keeps one per
    /// thread that may call at once (the data-path workers, the shards and the thread re-checking live
    /// connections), twice over: a burst of trapping calls (each throws its instance away) then leaves
    /// instances for the plugin's healthy calls while the refill thread replaces the lost ones.
    pub fn plugin_host_config(&self, cpus: usize) -> HostConfig {
        let defaults = HostConfig::default();
        let t = &self.tuning;
        let callers = self.worker_threads(cpus) + self.shard_count(cpus) + 1;
        let instances = defaults.prewarm_instances.max(callers * 2 + 2);
        HostConfig {
            cache_dir: self.plugin_cache.clone(),
            release_memory: crate::node::memory::release_thread_memory(),
            compiler: match t.plugin_compiler {
                PluginCompiler::InProcess => Compiler::InProcess,
                PluginCompiler::Subprocess => Compiler::Subprocess(SubprocessCompiler {
                    // The running binary itself, even if its file was replaced since it started.
                    program: "/proc/self/exe".into(),
                    args: vec!["compile-plugin".into()],
                    timeout: t.plugin_compile_timeout,
                    address_space_limit: (t.plugin_compile_memory_mib > 0)
                        .then(|| t.plugin_compile_memory_mib.saturating_mul(1 << 20)),
                }),
            },
            rollout: weft_state::PluginRollout {
                window: t.plugin_rollout_window,
                max_failure_ppm: weft_state::PluginRollout::ppm(t.plugin_rollout_max_failure_ratio),
                min_calls: t.plugin_rollout_min_calls,
                disabled: t.plugin_rollout_window.is_zero(),
            },
            prewarm_instances: instances,
            telemetry_linger: t.plugin_telemetry_linger,
            epoch_tick: t.plugin_epoch_tick,
            max_idle_per_plugin: defaults.max_idle_per_plugin.max(instances),
            allow_unenforced_policies: self.allow_unenforced_policies,
            ..defaults
        }
    }

    /// The CA client's settings.
    pub fn ca_settings(&self) -> CaSettings {
        use weft_identity::select::CaKind as K;
        let ca = &self.ca;
        CaSettings {
            kind: match ca.ca_kind {
                CaKind::Local => K::Local,
                CaKind::Istio => K::Istio,
                CaKind::K8sCsr => K::K8sCsr,
            },
            ca_dir: self.ca_dir.clone(),
            address: ca.ca_address.clone(),
            root_cert: ca.ca_root_cert.clone(),
            token_file: ca.ca_token_file.clone(),
            cluster_id: self.cluster_id.clone(),
            server_name: ca.ca_server_name.clone(),
            kube_api: ca.kube_api.clone(),
            kube_ca_file: ca.kube_ca_file.clone(),
            signer_name: ca.csr_signer_name.clone(),
            timeout: ca.ca_timeout,
        }
    }

    /// The certificate manager's settings: a CA call gets five seconds beyond its own deadline.
    pub fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            validity: self.cert_validity,
            ca_timeout: self.ca.ca_timeout + Duration::from_secs(5),
            ..ManagerConfig::default()
        }
    }

    /// What the plugin fetcher needs beside the plugin source's own settings.
    pub fn fetch_paths(&self) -> crate::plugin_xds::FetchPaths {
        crate::plugin_xds::FetchPaths {
            cache_dir: self.plugin_fetch_cache.clone(),
            pull_secret: self.plugin_pull_secret.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::net::SocketAddr;

    use super::*;
    use crate::config::tests::parse;

    #[test]
    fn the_proxy_config_follows_the_listener_flags() {
        let c = parse(&[
            "--socks5",
            "off",
            "--hbone",
            "workloads",
            "--hbone-port",
            "15009",
        ])
        .unwrap();
        let p = c.proxy_config();
        assert_eq!(p.socks5_addr, None);
        assert_eq!(
            p.outbound_addr,
            Some("0.0.0.0:15001".parse::<SocketAddr>().unwrap())
        );
        assert!(matches!(p.inbound, InboundBind::Workloads { port: 15009 }));
        assert_eq!(p.hbone_port, 15009);
        assert_eq!(p.max_connections_per_listener, Some(65_536));
        assert!(matches!(p.original_source, OriginalSource::Off));
        let c = parse(&["--mode", "inpod", "--max-connections-per-listener", "0"]).unwrap();
        let p = c.proxy_config();
        assert!(matches!(p.original_source, OriginalSource::BestEffort));
        assert_eq!(p.max_connections_per_listener, None);
    }

    #[test]
    fn the_plugin_host_keeps_two_instances_per_calling_thread() {
        let c = parse(&[
            "--worker-threads",
            "3",
            "--shards",
            "0",
            "--plugin-compiler",
            "in-process",
        ])
        .unwrap();
        let h = c.plugin_host_config(8);
        assert_eq!(
            h.prewarm_instances,
            HostConfig::default().prewarm_instances.max((3 + 1) * 2 + 2)
        );
        assert!(matches!(h.compiler, Compiler::InProcess));
        let c = parse(&[
            "--plugin-compile-memory-mib",
            "0",
            "--plugin-rollout-window",
            "0s",
        ])
        .unwrap();
        let h = c.plugin_host_config(8);
        let Compiler::Subprocess(s) = h.compiler else {
            panic!("subprocess by default")
        };
        assert_eq!(s.address_space_limit, None);
        assert!(h.rollout.disabled);
    }

    #[test]
    fn the_ca_settings_carry_the_resolved_cluster_id_and_the_ca_flags() {
        let c = parse(&[
            "--ca-kind",
            "istio",
            "--ca-address",
            "https://ca:15012",
            "--cluster-id",
            "c2",
        ])
        .unwrap();
        let s = c.ca_settings();
        assert!(matches!(s.kind, weft_identity::select::CaKind::Istio));
        assert_eq!(s.address.as_deref(), Some("https://ca:15012"));
        assert_eq!(s.cluster_id, "c2");
        assert_eq!(c.manager_config().ca_timeout, Duration::from_secs(15));
        assert_eq!(c.manager_config().validity, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn dns_forwarding_takes_the_upstream_flag_over_resolv_conf() {
        let c = parse(&[
            "--dns-upstream",
            "10.0.0.10,10.0.0.11:5353",
            "--dns-resolv-conf",
            "/nonexistent",
        ])
        .unwrap();
        let f = c.dns_forwarding();
        assert_eq!(
            f.upstreams,
            [
                "10.0.0.10:53".parse::<SocketAddr>().unwrap(),
                "10.0.0.11:5353".parse().unwrap()
            ]
        );
        assert_eq!(c.dns_config().cluster_domain, "cluster.local");
    }
}
