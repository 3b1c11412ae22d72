//! Pods on nodes, as on a Kubernetes node with Istio ambient's in-pod mode: each node is a network namespace with
//! a weft in it; each pod is a network namespace of its own, wired to its node by a veth pair (the node routes
//! between pods and to the other node), with the capture rules istio-cni installs inside a meshed pod. A test-side
//! CNI agent ([`crate::cni::Agent`]) hands the pods' namespaces to weft over ZDS. Needs root.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use weft_devmesh::netns::{Netns, ip};

/// The mark weft (and ztunnel) put on their sockets inside pods; the pod rules skip packets that carry it.
pub const INPOD_MARK: u32 = 0x539;

/// The rules istio-cni installs inside a meshed pod's network namespace (IPv4), in `iptables-restore` form.
///
/// Source: istio/istio `cni/pkg/iptables/testdata/default.golden` (the expected output of
/// `cni/pkg/iptables/iptables.go` `CreateInpodRules` with the default config), which says: inbound TCP not to
/// 15008 and not marked 0x539 is redirected to 15006 (`ISTIO_PRERT`); outbound TCP not marked and not to
/// loopback is redirected to 15001, DNS to 15053 (`ISTIO_OUTPUT`); packets weft sends marked 0x539 into the pod set
/// connmark 0x111 so replies to them skip the redirects; 169.254.7.127 is the kubelet probe address. The policy
/// route for 0x111 (`ip rule add fwmark 0x111/0xfff pref 32764 lookup 100` and a local default route in table
/// 100 on `lo`) is istio-cni's too (`AddInpodMarkIPRule`, `AddLoopbackRoutes` in `cni/pkg/iptables`).
pub const ISTIO_CNI_POD_RULES: &str = "\
*mangle
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

/// istio-cni's in-pod rules before it moved ambient to REDIRECT (istio/istio `cni/pkg/iptables/testdata/default.golden`
/// at 85cd183a25aa8987a8f5216484dd96cefbd6c78c, the parent of "Move ambient to REDIRECT mode instead of tproxy",
/// 4a49d35f5df): inbound TCP goes to 15008 and 15006 by the mangle table's TPROXY target with tproxy-mark 0x111, which
/// hands a packet only to a listener that has IP_TRANSPARENT (the connection keeps its original addresses: no NAT);
/// outbound is the same REDIRECT to 15001. The same policy route for 0x111 applies. Such rules are still installed
/// by istio-cni releases of that era.
pub const ISTIO_CNI_POD_RULES_TPROXY: &str = "\
*mangle
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -i lo -j ACCEPT
-A ISTIO_PRERT -p tcp -m tcp --dport 15008 -m mark ! --mark 0x539/0xfff -j TPROXY --on-port 15008 --tproxy-mark 0x111/0xfff
-A ISTIO_PRERT -p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j TPROXY --on-port 15006 --tproxy-mark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT ! -o lo -p udp -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

/// Which of istio-cni's rule sets a pod gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRules {
    /// Today's: nat REDIRECT ([`ISTIO_CNI_POD_RULES`]).
    Redirect,
    /// The earlier TPROXY rules ([`ISTIO_CNI_POD_RULES_TPROXY`]).
    Tproxy,
}

/// A pod: its namespace, address and identity.
#[derive(Debug)]
pub struct PodNs {
    /// The namespace.
    pub ns: Netns,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Kubernetes pod uid (what the agent sends).
    pub uid: String,
    /// Name.
    pub name: String,
    /// Service account.
    pub service_account: String,
}

impl PodNs {
    /// The agent's view of this pod.
    pub fn agent_pod(&self) -> crate::cni::Pod {
        crate::cni::Pod {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: "default".into(),
            service_account: self.service_account.clone(),
            netns: self.path(),
        }
    }

    /// `/var/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        format!("/var/run/netns/{}", self.ns.name).into()
    }

    /// Start an echo server on the pod's address, port 8080, on a thread inside the pod's namespace, and return its
    /// address once it listens (panics if it does not within 30 s: test support).
    pub fn spawn_echo(&self) -> std::net::SocketAddr {
        let addr = std::net::SocketAddr::from((self.ip, 8080));
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = self.ns.run(move || async move {
            let (_, serving) = weft_devmesh::workload::echo_server(addr)
                .await
                .unwrap_or_else(|e| panic!("echo server on {addr}: {e}"));
            let _ = tx.send(());
            let _ = serving.await;
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("echo server on {addr} did not start: {e}"));
        addr
    }
}

fn restore(ns: &Netns, rules: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name, "iptables-restore"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("iptables-restore: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(rules.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables-restore in {}: {}",
            ns.name,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two node namespaces joined by a link (`10.<net>.0.1` and `.2`); pods are added with [`Nodes::pod`].
#[derive(Debug)]
pub struct Nodes {
    /// Node A.
    pub a: Netns,
    /// Node B.
    pub b: Netns,
    net: u8,
    tag: String,
}

impl Nodes {
    /// Create the two node namespaces; `tag` keeps names unique, `net` picks the `10.<net>.0.0/16` addresses.
    pub fn create(tag: &str, net: u8) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let a = Netns::create(&format!("weft-{tag}na-{id}"))?;
        let b = Netns::create(&format!("weft-{tag}nb-{id}"))?;
        weft_devmesh::netns::link(
            &a,
            &format!("wn{tag}a"),
            &format!("10.{net}.0.1/24"),
            &b,
            &format!("wn{tag}b"),
            &format!("10.{net}.0.2/24"),
        )?;
        for (ns, other_subnet, via) in [(&a, 2, 2), (&b, 1, 1)] {
            ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
            ns.exec(
                "ip",
                &[
                    "route",
                    "add",
                    &format!("10.{net}.{other_subnet}.0/24"),
                    "via",
                    &format!("10.{net}.0.{via}"),
                ],
            )?;
        }
        Ok(Self {
            a,
            b,
            net,
            tag: tag.to_owned(),
        })
    }

    /// Node A's address on the link between the nodes.
    pub fn a_link_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 1)
    }

    /// The address pod number `n` on node A (`on_b` false) or B has, or will have: `10.<net>.<1|2>.<n+1>`.
    pub fn pod_ip(&self, on_b: bool, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, if on_b { 2 } else { 1 }, n.saturating_add(1))
    }

    /// A meshed pod on node A (`on_b` false) or B, number `n` (1..=200): address `10.<net>.<1|2>.<n+1>`, a veth to
    /// its node, a default route via the node, and istio-cni's pod rules (today's REDIRECT set).
    pub fn pod(
        &self,
        on_b: bool,
        n: u8,
        name: &str,
        service_account: &str,
    ) -> Result<PodNs, String> {
        self.pod_with(on_b, n, name, service_account, PodRules::Redirect)
    }

    /// [`Nodes::pod`] with the rule set `rules`.
    pub fn pod_with(
        &self,
        on_b: bool,
        n: u8,
        name: &str,
        service_account: &str,
        rules: PodRules,
    ) -> Result<PodNs, String> {
        let id = std::process::id() % 100_000;
        let node = if on_b { &self.b } else { &self.a };
        let subnet = if on_b { 2 } else { 1 };
        let ns = Netns::create(&format!("weft-{}p{subnet}{n}-{id}", self.tag))?;
        let pod_ip = self.pod_ip(on_b, n);
        let (pod_if, node_if) = (
            format!("wp{}{subnet}{n}", self.tag),
            format!("wq{}{subnet}{n}", self.tag),
        );
        ip(&[
            "link", "add", &pod_if, "netns", &ns.name, "type", "veth", "peer", "name", &node_if,
            "netns", &node.name,
        ])?;
        ns.exec(
            "ip",
            &["addr", "add", &format!("{pod_ip}/32"), "dev", &pod_if],
        )?;
        ns.exec("ip", &["link", "set", &pod_if, "up"])?;
        node.exec("ip", &["link", "set", &node_if, "up"])?;
        // Like a CNI's point-to-point setup: the pod reaches everything through its node.
        let gw = format!("10.{}.{subnet}.1", self.net);
        node.exec("ip", &["addr", "add", &format!("{gw}/32"), "dev", &node_if])?;
        node.exec(
            "ip",
            &["route", "add", &format!("{pod_ip}/32"), "dev", &node_if],
        )?;
        ns.exec("ip", &["route", "add", &format!("{gw}/32"), "dev", &pod_if])?;
        ns.exec(
            "ip",
            &["route", "add", "default", "via", &gw, "dev", &pod_if],
        )?;
        restore(
            &ns,
            match rules {
                PodRules::Redirect => ISTIO_CNI_POD_RULES,
                PodRules::Tproxy => ISTIO_CNI_POD_RULES_TPROXY,
            },
        )?;
        ns.exec(
            "ip",
            &[
                "rule",
                "add",
                "fwmark",
                "0x111/0xfff",
                "pref",
                "32764",
                "lookup",
                "100",
            ],
        )?;
        ns.exec(
            "ip",
            &[
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                "100",
            ],
        )?;
        Ok(PodNs {
            ns,
            ip: pod_ip,
            uid: format!("uid-{name}-{n}"),
            name: name.to_owned(),
            service_account: service_account.to_owned(),
        })
    }
}

/// A mesh file with `pods` as HBONE workloads; `(pod, node name)`.
pub fn mesh_yaml(pods: &[(&PodNs, &str)]) -> String {
    let mut s = String::from("workloads:\n");
    for (p, node) in pods {
        s.push_str(&workload_yaml(&p.name, &p.service_account, p.ip, node));
    }
    s
}

/// One HBONE workload of the mesh file's `workloads:` list (pod `name` in namespace `default`): for a pod that
/// exists, or one that will (declared before it is handed to the proxy).
pub fn workload_yaml(name: &str, service_account: &str, ip: Ipv4Addr, node: &str) -> String {
    format!(
        "- uid: Kubernetes//Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {service_account}\n  workloadIps: [{ip}]\n  protocol: HBONE\n  node: {node}\n  services: {{}}\n"
    )
}
