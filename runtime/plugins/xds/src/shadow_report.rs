//! Shadow figures to the control plane: every interval, the `weft.plugin.v1.ShadowReport` of each plugin whose
//! shadow figures changed since they were last sent goes in one unsolicited report request (one `Any` per plugin in
//! `error_detail.details`); nothing changed, nothing sent; a request that could not go is tried again next interval.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use weft_plugin_host::{PluginHost, ShadowReport};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as pb;

/// The divergence samples sent per plugin, at most: the newest ones.
pub const MAX_SAMPLES: usize = 16;

/// Sends one report request carrying these details; `false` when it could not go (no stream open).
pub type SendReport = dyn Fn(&[prost_types::Any]) -> bool + Send + Sync;

fn addr(a: &SocketAddr) -> String {
    a.to_string()
}

fn text(o: &Option<String>) -> String {
    o.clone().unwrap_or_default()
}

/// The `ShadowReport` of `plugin` (whose serving code is `serving_sha256`), packed for `error_detail.details`.
/// Socket addresses become `ip:port`, absent options empty strings; only the newest [`MAX_SAMPLES`] samples go,
/// still oldest first.
pub fn shadow_report(plugin: &str, serving_sha256: &str, r: &ShadowReport) -> prost_types::Any {
    let newest = r.samples.len().saturating_sub(MAX_SAMPLES);
    weft_proto::to_any(
        type_url::SHADOW_REPORT,
        &pb::ShadowReport {
            plugin: plugin.to_string(),
            serving_sha256: serving_sha256.to_string(),
            shadow_sha256: text(&r.sha256),
            load_error: text(&r.load_error),
            decisions: r
                .decisions
                .iter()
                .map(|c| pb::ShadowDecisions {
                    direction: c.direction.to_string(),
                    serving: c.serving.to_string(),
                    shadow: c.shadow.to_string(),
                    count: c.count,
                })
                .collect(),
            skipped: r.skipped,
            samples_dropped: r.samples_dropped,
            samples: r.samples[newest..]
                .iter()
                .map(|s| pb::DivergenceSample {
                    direction: s.direction.to_string(),
                    source: addr(&s.src),
                    destination: addr(&s.dst),
                    source_identity: text(&s.src_identity),
                    source_workload: text(&s.src_workload),
                    destination_workload: text(&s.dst_workload),
                    serving: s.serving.to_string(),
                    serving_reason: text(&s.serving_reason),
                    shadow: s.shadow.to_string(),
                    shadow_reason: text(&s.shadow_reason),
                })
                .collect(),
        },
    )
}

/// One plugin's shadow figures as a tick sees them: (plugin, serving sha256, report).
pub type Figures = (String, String, ShadowReport);

/// What was last sent successfully, per plugin: tells a changed report from one already sent.
#[derive(Default)]
pub(crate) struct Reporter {
    sent: BTreeMap<String, (String, ShadowReport)>,
}

impl Reporter {
    /// One interval: sends the reports of `now` (every plugin with a shadow) that differ from what was last sent,
    /// all in one request. Returns how many went (0 when nothing changed or the request could not go).
    pub fn tick(&mut self, now: Vec<Figures>, send: &SendReport) -> usize {
        // A plugin whose shadow went is forgotten: if one comes back, it is reported afresh.
        self.sent
            .retain(|name, _| now.iter().any(|(plugin, _, _)| plugin == name));
        let changed: Vec<Figures> = now
            .into_iter()
            .filter(|(plugin, serving, report)| {
                self.sent
                    .get(plugin)
                    .is_none_or(|(s, r)| s != serving || r != report)
            })
            .collect();
        if changed.is_empty() {
            return 0;
        }
        let details: Vec<prost_types::Any> = changed
            .iter()
            .map(|(plugin, serving, report)| shadow_report(plugin, serving, report))
            .collect();
        if !send(&details) {
            return 0;
        }
        let n = changed.len();
        for (plugin, serving, report) in changed {
            self.sent.insert(plugin, (serving, report));
        }
        n
    }
}

/// Every plugin of `host` with a shadow (or a shadow that failed to load), with its serving sha256 (empty when
/// nothing serves) and its shadow figures.
pub fn shadow_figures(host: &PluginHost) -> Vec<Figures> {
    host.status()
        .into_iter()
        .filter_map(|st| {
            let report = host.shadow_report(&st.name)?;
            Some((st.name, st.sha256.unwrap_or_default(), report))
        })
        .collect()
}

/// Every `interval` (tokio time), sends with `send` the `ShadowReport`s of the plugins of `host` whose shadow
/// figures changed since they were last sent. Runs until the host goes away.
pub fn spawn_shadow_reporter(
    host: &Arc<PluginHost>,
    send: Arc<SendReport>,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    let host = Arc::downgrade(host);
    spawn_ticks(
        move || Weak::upgrade(&host).map(|h| shadow_figures(&h)),
        send,
        interval,
    )
}

/// The reporter's loop over any source of figures: `figures` returns `None` once there is nothing to report on any
/// more (the loop ends).
pub(crate) fn spawn_ticks(
    figures: impl Fn() -> Option<Vec<Figures>> + Send + 'static,
    send: Arc<SendReport>,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reporter = Reporter::default();
        loop {
            ticks.tick().await;
            let Some(now) = figures() else { return };
            let n = reporter.tick(now, &*send);
            if n > 0 {
                tracing::debug!(plugins = n, "shadow figures reported to the control plane");
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use std::sync::Mutex;

    use prost::Message;
    use weft_plugin_host::{DivergenceSample, ShadowCount};

    use super::*;

    fn sample(conn: u64) -> DivergenceSample {
        DivergenceSample {
            conn,
            direction: "inbound",
            src: "10.0.0.1:40000".parse().unwrap(),
            dst: "[fd00::2]:8080".parse().unwrap(),
            src_identity: Some("spiffe://cluster.local/ns/a/sa/b".into()),
            src_workload: Some("a/client".into()),
            dst_workload: Some("b/server".into()),
            serving: "allow",
            serving_reason: None,
            shadow: "deny",
            shadow_reason: Some("port 8080 not allowed".into()),
        }
    }

    fn report(count: u64) -> ShadowReport {
        ShadowReport {
            sha256: Some("shadow-sha".into()),
            load_error: None,
            decisions: vec![ShadowCount {
                direction: "inbound",
                serving: "allow",
                shadow: "deny",
                count,
            }],
            skipped: 2,
            samples_dropped: 3,
            samples: vec![sample(1)],
        }
    }

    fn decode(a: &prost_types::Any) -> pb::ShadowReport {
        assert_eq!(a.type_url, type_url::SHADOW_REPORT);
        pb::ShadowReport::decode(a.value.as_slice()).unwrap()
    }

    #[test]
    fn the_conversion_fills_every_field() {
        let r = decode(&shadow_report("ports", "serving-sha", &report(5)));
        assert_eq!(
            r,
            pb::ShadowReport {
                plugin: "ports".into(),
                serving_sha256: "serving-sha".into(),
                shadow_sha256: "shadow-sha".into(),
                load_error: String::new(),
                decisions: vec![pb::ShadowDecisions {
                    direction: "inbound".into(),
                    serving: "allow".into(),
                    shadow: "deny".into(),
                    count: 5,
                }],
                skipped: 2,
                samples_dropped: 3,
                samples: vec![pb::DivergenceSample {
                    direction: "inbound".into(),
                    source: "10.0.0.1:40000".into(),
                    destination: "[fd00::2]:8080".into(),
                    source_identity: "spiffe://cluster.local/ns/a/sa/b".into(),
                    source_workload: "a/client".into(),
                    destination_workload: "b/server".into(),
                    serving: "allow".into(),
                    serving_reason: String::new(),
                    shadow: "deny".into(),
                    shadow_reason: "port 8080 not allowed".into(),
                }],
            }
        );
    }

    #[test]
    fn a_shadow_that_did_not_load_is_reported_with_empty_strings_for_what_is_absent() {
        let r = ShadowReport {
            load_error: Some("bad magic".into()),
            ..ShadowReport::default()
        };
        let r = decode(&shadow_report("ports", "", &r));
        assert_eq!(r.shadow_sha256, "");
        assert_eq!(r.serving_sha256, "");
        assert_eq!(r.load_error, "bad magic");
        assert!(r.decisions.is_empty() && r.samples.is_empty());
    }

    #[test]
    fn only_the_newest_samples_are_sent_oldest_first() {
        let mut r = report(1);
        r.samples = (0..40).map(sample).collect();
        let sent = decode(&shadow_report("ports", "s", &r));
        assert_eq!(sent.samples.len(), MAX_SAMPLES);
        // The proto carries no connection id: tell the samples apart by their reasons.
        r.samples = (0..40)
            .map(|i| DivergenceSample {
                shadow_reason: Some(format!("r{i}")),
                ..sample(i)
            })
            .collect();
        let reasons: Vec<String> = decode(&shadow_report("ports", "s", &r))
            .samples
            .into_iter()
            .map(|s| s.shadow_reason)
            .collect();
        let want: Vec<String> = (24..40).map(|i| format!("r{i}")).collect();
        assert_eq!(reasons, want);
    }

    /// A fake `send` that records each request's plugins and answers as `up` says.
    struct Fake {
        sent: Mutex<Vec<Vec<pb::ShadowReport>>>,
        up: Mutex<bool>,
    }

    impl Fake {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                sent: Mutex::new(Vec::new()),
                up: Mutex::new(true),
            })
        }

        fn send(self: &Arc<Self>) -> Arc<SendReport> {
            let me = self.clone();
            Arc::new(move |details: &[prost_types::Any]| {
                if !*me.up.lock().unwrap() {
                    return false;
                }
                me.sent
                    .lock()
                    .unwrap()
                    .push(details.iter().map(decode).collect());
                true
            })
        }

        /// The plugins of each request sent so far, with the first decision's count.
        fn requests(&self) -> Vec<Vec<(String, u64)>> {
            self.sent
                .lock()
                .unwrap()
                .iter()
                .map(|req| {
                    req.iter()
                        .map(|r| (r.plugin.clone(), r.decisions[0].count))
                        .collect()
                })
                .collect()
        }
    }

    type Shared = Arc<Mutex<Option<Vec<Figures>>>>;

    fn figures(plugins: &[(&str, u64)]) -> Option<Vec<Figures>> {
        Some(
            plugins
                .iter()
                .map(|(p, n)| (p.to_string(), "serving".to_string(), report(*n)))
                .collect(),
        )
    }

    fn req(plugins: &[(&str, u64)]) -> Vec<(String, u64)> {
        plugins.iter().map(|(p, n)| (p.to_string(), *n)).collect()
    }

    /// Lets the reporter run one interval on the paused clock.
    async fn one_interval() {
        tokio::time::sleep(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn changed_reports_are_sent_once_unchanged_ones_not_again() {
        let fake = Fake::new();
        let now: Shared = Arc::new(Mutex::new(figures(&[("a", 1), ("b", 1)])));
        let source = now.clone();
        let task = spawn_ticks(
            move || source.lock().unwrap().clone(),
            fake.send(),
            Duration::from_secs(10),
        );
        // Nothing before the first interval.
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(fake.requests().is_empty());
        one_interval().await;
        assert_eq!(fake.requests(), vec![req(&[("a", 1), ("b", 1)])]);
        // Unchanged: nothing more.
        one_interval().await;
        one_interval().await;
        assert_eq!(fake.requests().len(), 1);
        // Only the changed plugin goes.
        *now.lock().unwrap() = figures(&[("a", 1), ("b", 2)]);
        one_interval().await;
        assert_eq!(fake.requests()[1..], [req(&[("b", 2)])]);
        one_interval().await;
        assert_eq!(fake.requests().len(), 2);
        // A plugin whose shadow went and came back with the same figures is reported again.
        *now.lock().unwrap() = figures(&[("b", 2)]);
        one_interval().await;
        *now.lock().unwrap() = figures(&[("a", 1), ("b", 2)]);
        one_interval().await;
        assert_eq!(fake.requests()[2..], [req(&[("a", 1)])]);
        // The host went: the reporter ends.
        *now.lock().unwrap() = None;
        one_interval().await;
        assert!(task.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_send_is_retried_next_interval() {
        let fake = Fake::new();
        *fake.up.lock().unwrap() = false;
        let now: Shared = Arc::new(Mutex::new(figures(&[("a", 1)])));
        let source = now.clone();
        let _task = spawn_ticks(
            move || source.lock().unwrap().clone(),
            fake.send(),
            Duration::from_secs(10),
        );
        one_interval().await;
        one_interval().await;
        assert!(fake.requests().is_empty());
        // The figures changed meanwhile: the latest ones go once the stream is back.
        *now.lock().unwrap() = figures(&[("a", 4)]);
        *fake.up.lock().unwrap() = true;
        one_interval().await;
        assert_eq!(fake.requests(), vec![req(&[("a", 4)])]);
        one_interval().await;
        assert_eq!(fake.requests().len(), 1);
    }

    #[test]
    fn a_serving_version_change_alone_is_a_change() {
        let fake = Fake::new();
        let send = fake.send();
        let mut r = Reporter::default();
        assert_eq!(r.tick(figures(&[("a", 1)]).unwrap(), &*send), 1);
        assert_eq!(r.tick(figures(&[("a", 1)]).unwrap(), &*send), 0);
        let moved = vec![("a".to_string(), "new-serving".to_string(), report(1))];
        assert_eq!(r.tick(moved, &*send), 1);
        assert_eq!(
            fake.sent.lock().unwrap()[1][0].serving_sha256,
            "new-serving"
        );
    }
}
