//! `dig` (Debian's dnsutils) as the tests' DNS client: run from an address, or inside a network namespace, and its
//! output read back (status, flags, answers).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

/// What dig printed: the status, the header flags and the answer records (name, ttl, type, data).
#[derive(Debug)]
pub struct Dig {
    /// `NOERROR`, `NXDOMAIN`, ...
    pub status: String,
    /// Header flags (`qr`, `aa`, ...).
    pub flags: Vec<String>,
    /// Answer records: name, TTL, type, data.
    pub answers: Vec<(String, u32, String, String)>,
}

/// `dig` at `server` from `src` with `args`; one try, a generous timeout (an answer ends the wait).
pub fn dig(server: SocketAddr, src: Ipv4Addr, args: &[&str]) -> Dig {
    dig_from(None, server, Some(src), args)
}

/// `dig` at `server` run inside network namespace `netns` (`ip netns exec`), from `src` when given.
pub fn dig_from(
    netns: Option<&str>,
    server: SocketAddr,
    src: Option<Ipv4Addr>,
    args: &[&str],
) -> Dig {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "dig"]);
            c
        }
        None => Command::new("dig"),
    };
    if let Some(src) = src {
        cmd.args(["-b", &src.to_string()]);
    }
    let out = cmd
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["+tries=1", "+time=30", "+noall", "+comments", "+answer"])
        .args(args)
        .output()
        .expect("dig (Debian's dnsutils; .ci/run installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "dig {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no status in {text}"))
        .to_owned();
    let flags = text
        .split(";; flags: ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let answers = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 5, "odd answer line {l:?}");
            (
                f[0].to_owned(),
                f[1].parse().expect("a TTL"),
                f[3].to_owned(),
                f[4].to_owned(),
            )
        })
        .collect();
    Dig {
        status,
        flags,
        answers,
    }
}

/// The data of the answers of type `rtype`, sorted.
pub fn data(d: &Dig, rtype: &str) -> Vec<String> {
    let mut v: Vec<String> = d
        .answers
        .iter()
        .filter(|a| a.2 == rtype)
        .map(|a| a.3.clone())
        .collect();
    v.sort();
    v
}
