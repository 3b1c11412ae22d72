//! Call counts to the control plane: every interval, a `weft.plugin.v1.PluginCounts` for each plugin whose calls,
//! failures or serving code changed since they were last sent, all in one unsolicited report request; nothing
//! changed, nothing sent. The control plane judges a staged version's failure ratio from their growth.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use weft_plugin_host::PluginHost;
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as pb;

use crate::shadow_report::SendReport;

/// One plugin's counts as a tick sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    /// The plugin.
    pub plugin: String,
    /// sha256 of the serving code.
    pub sha256: String,
    /// Calls, every version.
    pub calls: u64,
    /// Failed calls, every version.
    pub failures: u64,
}

/// Error kinds that are not a call's failure (a background pool refill).
const NOT_A_CALL: &[&str] = &["instantiate"];

/// The counts of every serving plugin of `host`.
pub fn plugin_counts(host: &PluginHost) -> Vec<Counts> {
    host.status()
        .into_iter()
        .filter_map(|st| {
            let sha256 = st.sha256?;
            let failures = st
                .errors
                .iter()
                .filter(|(k, _)| !NOT_A_CALL.contains(k))
                .map(|(_, n)| *n)
                .sum();
            Some(Counts {
                plugin: st.name,
                sha256,
                calls: st.calls,
                failures,
            })
        })
        .collect()
}

/// `c` packed for `error_detail.details`.
pub fn counts_report(c: &Counts) -> prost_types::Any {
    weft_proto::to_any(
        type_url::PLUGIN_COUNTS,
        &pb::PluginCounts {
            plugin: c.plugin.clone(),
            sha256: c.sha256.clone(),
            calls: c.calls,
            failures: c.failures,
        },
    )
}

/// What was last sent, per plugin.
#[derive(Default)]
pub(crate) struct CountsReporter {
    sent: BTreeMap<String, Counts>,
}

impl CountsReporter {
    /// One interval: sends the counts of `now` that differ from what was last sent, in one request. Returns how
    /// many went (0 when nothing changed or the request could not go).
    pub fn tick(&mut self, now: Vec<Counts>, send: &SendReport) -> usize {
        self.sent
            .retain(|name, _| now.iter().any(|c| &c.plugin == name));
        let changed: Vec<Counts> = now
            .into_iter()
            .filter(|c| self.sent.get(&c.plugin) != Some(c))
            .collect();
        if changed.is_empty() {
            return 0;
        }
        let details: Vec<prost_types::Any> = changed.iter().map(counts_report).collect();
        if !send(&details) {
            return 0;
        }
        let n = changed.len();
        for c in changed {
            self.sent.insert(c.plugin.clone(), c);
        }
        n
    }
}

/// Every `interval` (tokio time), sends with `send` the counts of the plugins of `host` that changed. Runs until
/// the host goes away.
pub fn spawn_counts_reporter(
    host: &Arc<PluginHost>,
    send: Arc<SendReport>,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    let host = Arc::downgrade(host);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reporter = CountsReporter::default();
        loop {
            ticks.tick().await;
            let Some(h) = Weak::upgrade(&host) else {
                return;
            };
            let now = plugin_counts(&h);
            drop(h);
            let n = reporter.tick(now, &*send);
            if n > 0 {
                tracing::debug!(
                    plugins = n,
                    "plugin call counts reported to the control plane"
                );
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use std::sync::Mutex;

    use prost::Message;

    use super::*;

    fn counts(plugin: &str, calls: u64) -> Counts {
        Counts {
            plugin: plugin.into(),
            sha256: "s".into(),
            calls,
            failures: calls / 2,
        }
    }

    #[test]
    fn only_changed_counts_go_and_a_failed_send_is_tried_again() {
        let sent: Arc<Mutex<Vec<Vec<pb::PluginCounts>>>> = Arc::default();
        let up = Arc::new(Mutex::new(true));
        let (s, u) = (sent.clone(), up.clone());
        let send: Arc<SendReport> = Arc::new(move |d: &[prost_types::Any]| {
            if !*u.lock().unwrap() {
                return false;
            }
            s.lock().unwrap().push(
                d.iter()
                    .map(|a| {
                        assert_eq!(a.type_url, type_url::PLUGIN_COUNTS);
                        pb::PluginCounts::decode(a.value.as_slice()).unwrap()
                    })
                    .collect(),
            );
            true
        });
        let mut r = CountsReporter::default();
        assert_eq!(r.tick(vec![counts("a", 1), counts("b", 1)], &*send), 2);
        assert_eq!(r.tick(vec![counts("a", 1), counts("b", 1)], &*send), 0);
        assert_eq!(r.tick(vec![counts("a", 4), counts("b", 1)], &*send), 1);
        *up.lock().unwrap() = false;
        assert_eq!(r.tick(vec![counts("a", 6), counts("b", 1)], &*send), 0);
        *up.lock().unwrap() = true;
        assert_eq!(r.tick(vec![counts("a", 6), counts("b", 1)], &*send), 1);
        let got = sent.lock().unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[2],
            vec![pb::PluginCounts {
                plugin: "a".into(),
                sha256: "s".into(),
                calls: 6,
                failures: 3,
            }]
        );
    }
}
