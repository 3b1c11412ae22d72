//! The stand-in's storage: objects by resource, namespace and name, one global resourceVersion, a bounded history
//! of changes (what watches and continue tokens read), and the watches that follow it.

use std::collections::{BTreeMap, VecDeque};

use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::resource::Resource;
use crate::selector::Selector;
use crate::status::ApiError;

/// What a write changes: the main resource or its `status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

type Key = (Resource, String, String);

#[derive(Debug, Clone, Copy)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in the history: the object after it (for a deletion, the last state at the deletion's version) and
/// before it (to rewind a list to an older version).
#[derive(Debug)]
struct Change {
    rv: u64,
    key: Key,
    event: EventType,
    object: Value,
    previous: Option<Value>,
}

/// A watch: what it selects and where its events go (each a ready `{"type", "object"}` value).
#[derive(Debug)]
struct Watcher {
    resource: Resource,
    namespace: Option<String>,
    selector: Selector,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<Value>,
}

impl Watcher {
    /// Whether an event about `object` (stored under `key`) goes to this watch.
    fn selects(&self, key: &Key, object: &Value) -> bool {
        self.resource == key.0
            && self.namespace.as_ref().is_none_or(|ns| *ns == key.1)
            && self.selector.matches(object)
    }
}

/// The whole state, behind one lock.
#[derive(Debug)]
pub(crate) struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    capacity: usize,
    /// Every change with a resourceVersion above `floor` is in `history`; a watch or a continue token may start
    /// at `floor` or later.
    floor: u64,
    watchers: Vec<Watcher>,
    requests: BTreeMap<String, usize>,
}

fn rv_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(field.to_owned(), value);
    }
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// A random UUID (version 4), as the API server gives `metadata.uid`.
fn uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Now as RFC 3339 in UTC with second precision (`2026-12-07T08:30:00Z`), as `creationTimestamp` is written.
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar, 400-year eras).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A continue token: the list's resourceVersion and the last key returned.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = json!({"rv": rv, "ns": ns, "name": name}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    Some((
        v.get("rv")?.as_u64()?,
        v.get("ns")?.as_str()?.to_owned(),
        v.get("name")?.as_str()?.to_owned(),
    ))
}

impl Store {
    pub(crate) fn new(capacity: usize) -> Store {
        Store {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            capacity,
            floor: 1,
            watchers: Vec::new(),
            requests: BTreeMap::new(),
        }
    }

    pub(crate) fn count(&mut self, verb: &str) {
        *self.requests.entry(verb.to_owned()).or_default() += 1;
    }

    pub(crate) fn requests(&self, verb: &str) -> usize {
        self.requests.get(verb).copied().unwrap_or(0)
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    pub(crate) fn get(&self, res: Resource, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(res, ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    fn record(&mut self, key: Key, event: EventType, object: Value, previous: Option<Value>) {
        let line = json!({"type": event.as_str(), "object": object});
        self.watchers
            .retain(|w| !w.selects(&key, &object) || w.tx.send(line.clone()).is_ok());
        self.history.push_back(Change {
            rv: self.rv,
            key,
            event,
            object,
            previous,
        });
        while self.history.len() > self.capacity {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
    }

    pub(crate) fn create(
        &mut self,
        res: Resource,
        ns: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut obj = check_body(res, ns, body)?;
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::invalid(
                    res,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                )
            })?;
        let key = (res, ns.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &name));
        }
        self.rv += 1;
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), ns.into());
            meta.insert("uid".into(), uid().into());
            meta.insert("creationTimestamp".into(), now_rfc3339().into());
            meta.insert("resourceVersion".into(), self.rv.to_string().into());
            if res.has_generation() {
                meta.insert("generation".into(), 1.into());
            } else {
                meta.remove("generation");
            }
        }
        if res.has_status()
            && let Some(map) = obj.as_object_mut()
        {
            // With a status subresource, the main resource's writes leave status alone.
            map.remove("status");
            if res == Resource::Pod {
                // The API server starts every Pod Pending (the kubelet reports the rest).
                map.insert("status".into(), json!({"phase": "Pending"}));
            }
        }
        self.objects.insert(key.clone(), obj.clone());
        self.record(key, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    pub(crate) fn update(
        &mut self,
        res: Resource,
        ns: &str,
        name: &str,
        part: Part,
        body: Value,
    ) -> Result<Value, ApiError> {
        let body = check_body(res, ns, body)?;
        let body_name = body.pointer("/metadata/name").and_then(Value::as_str);
        if body_name.is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                body_name.unwrap_or_default()
            )));
        }
        let key = (res, ns.to_owned(), name.to_owned());
        let stored = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if let Some(want) = rv_of(&body)
            && !want.is_empty()
            && Some(want) != rv_of(&stored)
        {
            return Err(ApiError::conflict(res, name));
        }
        let mut next = match part {
            Part::Main => {
                let mut next = body;
                for field in [
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "namespace",
                    "name",
                    "resourceVersion",
                ] {
                    match stored.pointer(&format!("/metadata/{field}")) {
                        Some(v) => set_meta(&mut next, field, v.clone()),
                        None => {
                            if let Some(meta) =
                                next.get_mut("metadata").and_then(Value::as_object_mut)
                            {
                                meta.remove(field);
                            }
                        }
                    }
                }
                if res.has_status()
                    && let Some(map) = next.as_object_mut()
                {
                    match stored.get("status") {
                        Some(s) => map.insert("status".into(), s.clone()),
                        None => map.remove("status"),
                    };
                }
                if res.has_generation() && next.get("spec") != stored.get("spec") {
                    let generation = stored
                        .pointer("/metadata/generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    set_meta(&mut next, "generation", (generation + 1).into());
                }
                next
            }
            Part::Status => {
                let mut next = stored.clone();
                if let Some(map) = next.as_object_mut() {
                    match body.get("status") {
                        Some(s) => map.insert("status".into(), s.clone()),
                        None => map.remove("status"),
                    };
                }
                next
            }
        };
        if next == stored {
            // A write that changes nothing is not a change: same resourceVersion, no event.
            return Ok(stored);
        }
        self.rv += 1;
        set_meta(&mut next, "resourceVersion", self.rv.to_string().into());
        self.objects.insert(key.clone(), next.clone());
        self.record(key, EventType::Modified, next.clone(), Some(stored));
        Ok(next)
    }

    pub(crate) fn patch(
        &mut self,
        res: Resource,
        ns: &str,
        name: &str,
        part: Part,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let mut merged = self.get(res, ns, name)?;
        merge_patch(&mut merged, patch);
        self.update(res, ns, name, part, merged)
    }

    pub(crate) fn delete(
        &mut self,
        res: Resource,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = (res, ns.to_owned(), name.to_owned());
        let stored = self
            .objects
            .remove(&key)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        self.rv += 1;
        let mut last = stored.clone();
        set_meta(&mut last, "resourceVersion", self.rv.to_string().into());
        self.record(key, EventType::Deleted, last.clone(), Some(stored));
        Ok(last)
    }

    /// Creates the object, or replaces what is stored under its name unconditionally (as `kubectl apply`).
    pub(crate) fn apply(&mut self, obj: Value) -> Result<Value, ApiError> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let res = Resource::from_kind(api_version, kind).ok_or_else(|| {
            ApiError::bad_request(format!(
                "no kind {kind:?} is registered for version {api_version:?}"
            ))
        })?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if self.objects.contains_key(&(res, ns.clone(), name.clone())) {
            let mut body = obj;
            set_meta(&mut body, "resourceVersion", "".into());
            self.update(res, &ns, &name, Part::Main, body)
        } else {
            self.create(res, &ns, obj)
        }
    }

    /// The objects of `res` as they were at resourceVersion `rv` (which must be at or above the floor).
    fn snapshot(&self, res: Resource, rv: u64) -> BTreeMap<Key, Value> {
        let mut objects: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.0 == res)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for change in self.history.iter().rev().take_while(|c| c.rv > rv) {
            if change.key.0 != res {
                continue;
            }
            match &change.previous {
                Some(prev) => objects.insert(change.key.clone(), prev.clone()),
                None => objects.remove(&change.key),
            };
        }
        objects
    }

    pub(crate) fn list(
        &self,
        res: Resource,
        ns: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> Result<Value, ApiError> {
        let (rv, after) = match cont.filter(|c| !c.is_empty()) {
            None => (self.rv, None),
            Some(token) => {
                let (rv, ns, name) = decode_continue(token).ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid continue token: continue key is not valid".into(),
                    )
                })?;
                if rv < self.floor {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can \
                         start a new list without the continue parameter."
                            .into(),
                    ));
                }
                (rv, Some((ns, name)))
            }
        };
        let selected: Vec<(Key, Value)> = self
            .snapshot(res, rv)
            .into_iter()
            .filter(|(k, v)| ns.is_none_or(|ns| k.1 == ns) && selector.matches(v))
            .filter(|(k, _)| {
                after
                    .as_ref()
                    .is_none_or(|(ans, aname)| (&k.1, &k.2) > (ans, aname))
            })
            .collect();
        let take = limit
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX)
            .min(selected.len());
        let mut metadata = Map::new();
        metadata.insert("resourceVersion".into(), rv.to_string().into());
        if take < selected.len() {
            let (last, _) = &selected[take - 1];
            metadata.insert(
                "continue".into(),
                encode_continue(rv, &last.1, &last.2).into(),
            );
            if selector.is_empty() {
                // The API server counts what remains only for lists without a selector.
                metadata.insert("remainingItemCount".into(), (selected.len() - take).into());
            }
        }
        let items: Vec<Value> = selected.into_iter().take(take).map(|(_, v)| v).collect();
        Ok(json!({
            "kind": format!("{}List", res.kind()),
            "apiVersion": res.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// Starts a watch: the events after `from` (every object as ADDED when `from` is `None`) are queued at once,
    /// later ones as they happen. A `from` older than the history queues one ERROR event (410 Expired) and ends.
    pub(crate) fn watch(
        &mut self,
        res: Resource,
        ns: Option<&str>,
        selector: Selector,
        from: Option<u64>,
        bookmarks: bool,
    ) -> mpsc::UnboundedReceiver<Value> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher {
            resource: res,
            namespace: ns.map(str::to_owned),
            selector,
            bookmarks,
            tx,
        };
        match from {
            None => {
                for (key, obj) in &self.objects {
                    if watcher.selects(key, obj) {
                        let _ = watcher.tx.send(json!({"type": "ADDED", "object": obj}));
                    }
                }
            }
            Some(rv) if rv < self.floor => {
                let err =
                    ApiError::expired(format!("too old resource version: {rv} ({})", self.floor));
                let _ = watcher
                    .tx
                    .send(json!({"type": "ERROR", "object": err.status()}));
                return rx;
            }
            Some(rv) => {
                for change in self
                    .history
                    .iter()
                    .filter(|c| c.rv > rv && watcher.selects(&c.key, &c.object))
                {
                    let _ = watcher
                        .tx
                        .send(json!({"type": change.event.as_str(), "object": change.object}));
                }
            }
        }
        self.watchers.push(watcher);
        rx
    }

    /// Sends a BOOKMARK at the current resourceVersion to every watch that allowed bookmarks.
    pub(crate) fn bookmark(&mut self) {
        let rv = self.rv.to_string();
        self.watchers.retain(|w| {
            if !w.bookmarks {
                return !w.tx.is_closed();
            }
            let obj = json!({"kind": w.resource.kind(), "apiVersion": w.resource.api_version(), "metadata": {"resourceVersion": rv}});
            w.tx.send(json!({"type": "BOOKMARK", "object": obj})).is_ok()
        });
    }

    /// Forgets the whole history: a watch or continue token from before now gets 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Ends every watch.
    pub(crate) fn close_watches(&mut self) {
        self.watchers.clear();
    }
}

/// Checks a request body is an object of `res` in namespace `ns`, and fills in `apiVersion` and `kind`.
fn check_body(res: Resource, ns: &str, body: Value) -> Result<Value, ApiError> {
    let Value::Object(mut map) = body else {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object".into(),
        ));
    };
    for (field, want) in [
        ("apiVersion", res.api_version()),
        ("kind", res.kind().to_owned()),
    ] {
        match map.get(field).and_then(Value::as_str) {
            None => {
                map.insert(field.into(), want.into());
            }
            Some(got) if got == want => {}
            Some(got) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({got}) does not match the expected API version ({want})"
                )));
            }
        }
    }
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        return Err(ApiError::bad_request("metadata is not an object".into()));
    }
    if let Some(got) = meta.get("namespace").and_then(Value::as_str)
        && !got.is_empty()
        && got != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    if res == Resource::Secret {
        fold_secret(&mut map)?;
    }
    Ok(Value::Object(map))
}

/// What the API server does with a Secret on every write: `stringData` is folded into `data` (base64, winning over
/// a `data` key of the same name) and dropped, `data` values must be base64, and `type` defaults to `Opaque`.
fn fold_secret(map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let string_data = map.remove("stringData");
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(data) = data.as_object_mut() else {
        return Err(ApiError::bad_request("data is not an object".into()));
    };
    for (key, value) in data.iter() {
        let valid = value.as_str().is_some_and(|v| engine.decode(v).is_ok());
        if !valid {
            return Err(ApiError::bad_request(format!(
                "data[{key:?}]: illegal base64 data"
            )));
        }
    }
    match string_data {
        None | Some(Value::Null) => {}
        Some(Value::Object(strings)) => {
            for (key, value) in strings {
                let Some(text) = value.as_str() else {
                    return Err(ApiError::bad_request(format!(
                        "stringData[{key:?}] is not a string"
                    )));
                };
                data.insert(key, engine.encode(text).into());
            }
        }
        Some(_) => return Err(ApiError::bad_request("stringData is not an object".into())),
    }
    if data.is_empty() {
        map.remove("data");
    }
    map.entry("type").or_insert_with(|| "Opaque".into());
    Ok(())
}
