//! Tests of the state store and of the config file watcher, on real files in temporary directories and a real
//! tokio runtime: live edits, refused edits, removed files, and the counters.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weft_state::{ConfigError, StateStore, load_into, watch_file};
use weft_testkit::{PATIENCE, until};

const TICK: Duration = Duration::from_millis(20);

fn workloads_yaml(names: &[&str]) -> String {
    let mut out = String::from("workloads:\n");
    for (i, n) in names.iter().enumerate() {
        out.push_str(&format!(
            "- uid: {n}\n  name: {n}\n  namespace: default\n  workloadIps: [10.0.0.{}]\n",
            i + 1
        ));
    }
    out
}

/// Write like an editor that saves to a temporary file and renames it over the original.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn store_basics() {
    let store = StateStore::new();
    assert_eq!(store.version(), 0);
    assert!(!store.is_loaded());
    assert!(store.current().workloads.is_empty());
    assert_eq!(store.last_error(), None);
    let rx = store.subscribe();
    assert_eq!(*rx.borrow(), 0);

    let cfg = weft_state::local::parse(&workloads_yaml(&["a"]), Path::new("/")).unwrap();
    assert_eq!(store.replace(cfg.clone()), 1);
    assert!(store.is_loaded());
    assert_eq!(*rx.borrow(), 1);
    let snapshot = store.current();
    assert!(snapshot.workloads.contains_key("a"));

    store.record_error("bad edit");
    assert_eq!(store.last_error().as_deref(), Some("bad edit"));
    assert_eq!((store.accepted_reloads(), store.refused_reloads()), (1, 1));
    assert_eq!(store.current().version, 1, "a refused edit changes nothing");

    assert_eq!(
        store.replace_parts(cfg.workloads, vec![], vec![], vec![]),
        2
    );
    assert_eq!(
        store.last_error(),
        None,
        "an accepted update clears the last error"
    );
    assert_eq!(store.accepted_reloads(), 2);
    // A snapshot taken earlier stays valid and unchanged.
    assert_eq!(snapshot.version, 1);
}

#[test]
fn load_into_refuses_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.yaml");
    std::fs::write(
        &path,
        "workloads:\n- uid: a\n  namespace: ns\n  workloadIps: [nope]\n",
    )
    .unwrap();
    let store = StateStore::new();
    let err = load_into(&path, &store).unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid { line: Some(4), .. }),
        "{err}"
    );
    assert!(!store.is_loaded());
    assert_eq!(store.refused_reloads(), 1);
    assert!(store.last_error().unwrap().contains("workloadIps[0]"));

    std::fs::write(&path, workloads_yaml(&["a"])).unwrap();
    assert_eq!(load_into(&path, &store).unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_are_applied_live_and_broken_edits_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.yaml");
    std::fs::write(&path, workloads_yaml(&["a"])).unwrap();
    let store = Arc::new(StateStore::new());
    assert_eq!(load_into(&path, &store).unwrap(), 1);
    let mut rx = store.subscribe();
    let watcher = watch_file(path.clone(), store.clone(), TICK);

    // A good edit (editor-style replace) is applied: new version, new workload visible.
    replace_file(&path, &workloads_yaml(&["a", "b"]));
    tokio::time::timeout(PATIENCE, rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*rx.borrow_and_update(), 2);
    let s = store.current();
    assert_eq!(s.version, 2);
    assert!(s.workloads.contains_key("b"));
    assert!(s.workload_by_ip("10.0.0.2".parse().unwrap()).is_some());

    // A broken edit is refused; the last good state is still served.
    replace_file(
        &path,
        "workloads:\n- uid: a\n  namespace: default\n  workloadIps: [10.0.0.300]\n",
    );
    until("the broken edit to be refused", || {
        store.refused_reloads() == 1
    })
    .await;
    let err = store.last_error().unwrap();
    assert!(
        err.contains("line 4") && err.contains("workloads[0].workloadIps[0]"),
        "{err}"
    );
    assert_eq!(store.version(), 2);
    assert!(store.current().workloads.contains_key("b"));
    assert!(
        !rx.has_changed().unwrap(),
        "subscribers are not woken by refused edits"
    );

    // A later good edit is applied again.
    replace_file(&path, &workloads_yaml(&["a", "b", "c"]));
    tokio::time::timeout(PATIENCE, rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*rx.borrow_and_update(), 3);
    assert_eq!(store.current().workloads.len(), 3);
    assert_eq!(store.last_error(), None);

    // A removed file is an error too; the last good state stays.
    std::fs::remove_file(&path).unwrap();
    until("the removal to be reported", || {
        store.refused_reloads() == 2
    })
    .await;
    assert!(
        store
            .last_error()
            .unwrap()
            .contains("cannot read config file")
    );
    assert_eq!(store.version(), 3);
    assert_eq!(store.current().workloads.len(), 3);

    // Put back, it is applied.
    replace_file(&path, &workloads_yaml(&["d"]));
    tokio::time::timeout(PATIENCE, rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*rx.borrow_and_update(), 4);
    assert_eq!(
        store.current().workloads.keys().collect::<Vec<_>>(),
        vec!["d"]
    );
    assert_eq!((store.accepted_reloads(), store.refused_reloads()), (4, 2));

    // Rewriting the same bytes is not a change.
    replace_file(&path, &workloads_yaml(&["d"]));
    let checks = store.source_checks();
    until(
        "the watcher to look at the rewritten file three times",
        || store.source_checks() >= checks + 3,
    )
    .await;
    assert_eq!(store.version(), 4);

    // Emptying the file does not drop every workload.
    std::fs::write(&path, "").unwrap();
    until("the empty file to be refused", || {
        store.refused_reloads() == 3
    })
    .await;
    assert!(store.last_error().unwrap().contains("the file is empty"));
    assert_eq!(store.current().workloads.len(), 1);

    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_loads_an_unloaded_store_and_stops_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.yaml");
    std::fs::write(&path, workloads_yaml(&["a"])).unwrap();
    let store = Arc::new(StateStore::new());
    let watcher = watch_file(path, store.clone(), TICK);
    until("the first load", || store.is_loaded()).await;
    assert_eq!(store.version(), 1);
    assert_eq!(store.refused_reloads(), 0);

    drop(store);
    tokio::time::timeout(PATIENCE, watcher)
        .await
        .unwrap()
        .unwrap();
}
