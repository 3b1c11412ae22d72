//! Test helpers: real network namespaces (`ip netns`, needs root) and a recording listener-set factory.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::manager::ListenerSets;
use crate::netns::Netns;
use crate::protocol::PodInfo;
use crate::status::Describe;

/// A named network namespace, deleted on drop.
pub struct TestNs {
    pub name: String,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl TestNs {
    pub fn new() -> Self {
        let name = format!(
            "weft-ut-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .status();
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name} (tests need root)");
        Self { name }
    }

    pub fn path(&self) -> std::path::PathBuf {
        format!("/var/run/netns/{}", self.name).into()
    }

    pub fn open(&self) -> Netns {
        Netns::open(&self.path()).unwrap()
    }

    pub fn exec(&self, args: &[&str]) {
        let ok = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .status()
            .unwrap();
        assert!(ok.success(), "{args:?}");
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

pub fn pod(uid: &str) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        name: format!("name-{uid}"),
        namespace: "default".into(),
        service_account: "sa".into(),
    }
}

/// What the fake did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Open(String),
    Drain(String),
}

pub struct FakeSet(pub String);

impl Describe for FakeSet {
    fn describe(&self) -> Value {
        Value::String(self.0.clone())
    }
}

/// Records opens and drains; `fail_next` makes the next N opens fail.
#[derive(Default)]
pub struct FakeSets {
    pub calls: Mutex<Vec<Call>>,
    pub fail_next: AtomicUsize,
}

impl FakeSets {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl ListenerSets for FakeSets {
    type Set = FakeSet;

    async fn open(&self, pod: &PodInfo, _netns: &Arc<Netns>) -> Result<Arc<FakeSet>, String> {
        self.calls.lock().unwrap().push(Call::Open(pod.uid.clone()));
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err("address in use".into());
        }
        Ok(Arc::new(FakeSet(pod.uid.clone())))
    }

    fn drain(&self, set: Arc<FakeSet>) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.calls.lock().unwrap().push(Call::Drain(set.0.clone()));
        async {}
    }
}
