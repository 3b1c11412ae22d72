//! The cache of upstream answers: one entry per (name, type, class), kept for the answer's TTL (the smallest TTL
//! of its answer records; a negative answer for its SOA's negative TTL, RFC 2308), served with TTLs counted down,
//! bounded in size. Time comes from a [`Clock`], so tests move it by hand.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

pub use weft_hooks::clock::{Clock, ManualClock, SystemClock};

/// An upstream answer: its code and sections (the OPT record excluded).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// NOERROR, NXDOMAIN, ...
    pub code: ResponseCode,
    /// Answer section.
    pub answers: Vec<Record>,
    /// Authority section.
    pub authorities: Vec<Record>,
    /// Additional section.
    pub additionals: Vec<Record>,
}

impl Answer {
    /// How long the answer may be cached, if at all: NOERROR with answers for their smallest TTL; NXDOMAIN and
    /// NOERROR without answers (NODATA) for the SOA's negative TTL (min of its TTL and MINIMUM); nothing else.
    pub fn ttl(&self) -> Option<u32> {
        let ttl = match self.code {
            ResponseCode::NoError if !self.answers.is_empty() => {
                self.answers.iter().map(|r| r.ttl).min()
            }
            ResponseCode::NoError | ResponseCode::NXDomain => {
                self.authorities.iter().find_map(|r| match &r.data {
                    RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                    _ => None,
                })
            }
            _ => None,
        }?;
        (ttl > 0).then_some(ttl)
    }

    fn aged(&self, secs: u32) -> Answer {
        let age = |rs: &[Record]| -> Vec<Record> {
            rs.iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.ttl = r.ttl.saturating_sub(secs);
                    r
                })
                .collect()
        };
        Answer {
            code: self.code,
            answers: age(&self.answers),
            authorities: age(&self.authorities),
            additionals: age(&self.additionals),
        }
    }
}

/// What a cache entry is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// Lowercased name, with the root dot.
    pub name: String,
    pub rtype: RecordType,
    pub class: DNSClass,
}

#[derive(Debug)]
struct Entry {
    answer: Answer,
    stored: Duration,
    expires: Duration,
}

/// The cache.
#[derive(Debug)]
pub(crate) struct Cache {
    clock: std::sync::Arc<dyn Clock>,
    entries: Mutex<HashMap<Key, Entry>>,
    capacity: usize,
    max_ttl: u32,
}

impl Cache {
    pub(crate) fn new(clock: std::sync::Arc<dyn Clock>, capacity: usize, max_ttl: u32) -> Self {
        Self {
            clock,
            entries: Mutex::new(HashMap::new()),
            capacity,
            max_ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A live entry, its TTLs lowered by the whole seconds it has been cached.
    pub(crate) fn get(&self, key: &Key) -> Option<Answer> {
        let now = self.clock.now();
        let mut entries = self.lock();
        let e = entries.get(key)?;
        if now >= e.expires {
            entries.remove(key);
            return None;
        }
        let age = u32::try_from((now - e.stored).as_secs()).unwrap_or(u32::MAX);
        Some(e.answer.aged(age))
    }

    /// Keep `answer` for its TTL (capped), if it may be cached. A full cache first drops what has expired, then
    /// the entry closest to expiry.
    pub(crate) fn put(&self, key: Key, answer: &Answer) {
        if self.capacity == 0 {
            return;
        }
        let Some(ttl) = answer.ttl() else { return };
        let now = self.clock.now();
        let expires = now + Duration::from_secs(u64::from(ttl.min(self.max_ttl)));
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, e| e.expires > now);
            if entries.len() >= self.capacity
                && let Some(victim) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.expires)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&victim);
            }
        }
        entries.insert(
            key,
            Entry {
                answer: answer.clone(),
                stored: now,
                expires,
            },
        );
    }

    /// Entries held now (expired ones included until they are looked at or evicted).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use hickory_proto::rr::Name;
    use hickory_proto::rr::rdata::{A, SOA};

    use super::*;

    fn key(n: &str) -> Key {
        Key {
            name: n.into(),
            rtype: RecordType::A,
            class: DNSClass::IN,
        }
    }

    fn a(ttl: u32) -> Record {
        Record::from_rdata(
            Name::from_ascii("x.example.").unwrap(),
            ttl,
            RData::A(A(Ipv4Addr::new(192, 0, 2, 1))),
        )
    }

    fn positive(ttls: &[u32]) -> Answer {
        Answer {
            code: ResponseCode::NoError,
            answers: ttls.iter().map(|t| a(*t)).collect(),
            authorities: vec![],
            additionals: vec![],
        }
    }

    fn negative(code: ResponseCode, soa_ttl: u32, minimum: u32) -> Answer {
        let n = Name::from_ascii("example.").unwrap();
        let soa = SOA::new(n.clone(), n.clone(), 1, 3600, 600, 86400, minimum);
        Answer {
            code,
            answers: vec![],
            authorities: vec![Record::from_rdata(n, soa_ttl, RData::SOA(soa))],
            additionals: vec![],
        }
    }

    #[test]
    fn ttls_per_rfc_2308() {
        assert_eq!(positive(&[300, 60]).ttl(), Some(60));
        assert_eq!(positive(&[0]).ttl(), None);
        assert_eq!(negative(ResponseCode::NXDomain, 900, 30).ttl(), Some(30));
        assert_eq!(negative(ResponseCode::NoError, 20, 300).ttl(), Some(20));
        let mut no_soa = negative(ResponseCode::NXDomain, 1, 1);
        no_soa.authorities.clear();
        assert_eq!(no_soa.ttl(), None);
        assert_eq!(negative(ResponseCode::ServFail, 900, 30).ttl(), None);
    }

    #[test]
    fn entries_count_down_and_expire_by_the_clock() {
        let clock = Arc::new(ManualClock::default());
        let cache = Cache::new(clock.clone(), 10, 86400);
        cache.put(key("x."), &positive(&[60, 100]));
        assert_eq!(cache.get(&key("x.")).unwrap().answers[0].ttl, 60);
        clock.advance(Duration::from_millis(59_500));
        let aged = cache.get(&key("x.")).unwrap();
        assert_eq!(
            aged.answers.iter().map(|r| r.ttl).collect::<Vec<_>>(),
            [1, 41]
        );
        clock.advance(Duration::from_millis(500));
        assert_eq!(cache.get(&key("x.")), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn ttl_is_capped_and_size_is_bounded() {
        let clock = Arc::new(ManualClock::default());
        let cache = Cache::new(clock.clone(), 2, 10);
        cache.put(key("long."), &positive(&[1000]));
        clock.advance(Duration::from_secs(10));
        assert_eq!(cache.get(&key("long.")), None, "capped at max_ttl");
        cache.put(key("a."), &positive(&[50]));
        cache.put(key("b."), &positive(&[5]));
        cache.put(key("c."), &positive(&[100]));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key("b.")).is_none(), "closest to expiry evicted");
        assert!(cache.get(&key("a.")).is_some() && cache.get(&key("c.")).is_some());
        let off = Cache::new(clock, 0, 10);
        off.put(key("a."), &positive(&[50]));
        assert_eq!(off.len(), 0);
    }
}
