//! Network namespaces for tests: create them with `ip`, and run async code inside one on a dedicated thread
//! (sockets created there belong to that namespace).

use std::future::Future;
use std::process::Command;

/// Run `ip` with arguments; error with its stderr on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

/// Run a command; error with its stderr on failure.
pub fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace, deleted on drop unless it is a borrowed handle.
#[derive(Debug)]
pub struct Netns {
    /// Its name (as `ip netns` knows it).
    pub name: String,
    owned: bool,
}

impl Netns {
    /// Create a namespace with loopback up (an existing one of that name is replaced).
    pub fn create(name: &str) -> Result<Self, String> {
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
            owned: true,
        };
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Run a command inside the namespace.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), cmd];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Run a command inside the namespace and return its stdout (trimmed); error with its stderr on failure.
    pub fn output(&self, cmd: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", self.name.as_str(), cmd])
            .args(args)
            .output()
            .map_err(|e| format!("ip netns exec {} {cmd}: {e}", self.name))?;
        if !out.status.success() {
            return Err(format!(
                "{cmd} {} in {}: {}",
                args.join(" "),
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// [`Netns::run`], awaited without blocking the caller's runtime: `f`'s output, or why the thread failed.
    pub async fn within<F, Fut, T>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let handle = self.run(f);
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| format!("thread in {} panicked", self.name))?
    }

    /// Run `f`'s future to completion on a new thread that has entered this namespace.
    pub fn run<F, Fut, T>(&self, f: F) -> std::thread::JoinHandle<Result<T, String>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns {path}: {e}"))?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            Ok(rt.block_on(f()))
        })
    }
}

impl Netns {
    /// A handle to an existing namespace that does not delete it on drop.
    pub fn existing(name: &str) -> Self {
        Netns {
            name: name.to_owned(),
            owned: false,
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Connect two namespaces with a veth pair and give each end an address (`10.x.y.z/24` style CIDRs).
pub fn link(
    a: &Netns,
    a_if: &str,
    a_cidr: &str,
    b: &Netns,
    b_if: &str,
    b_cidr: &str,
) -> Result<(), String> {
    ip(&[
        "link", "add", a_if, "netns", &a.name, "type", "veth", "peer", "name", b_if, "netns",
        &b.name,
    ])?;
    a.exec("ip", &["addr", "add", a_cidr, "dev", a_if])?;
    b.exec("ip", &["addr", "add", b_cidr, "dev", b_if])?;
    a.exec("ip", &["link", "set", a_if, "up"])?;
    b.exec("ip", &["link", "set", b_if, "up"])?;
    Ok(())
}
