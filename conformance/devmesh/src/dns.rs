//! A real DNS server for tests (UDP and TCP on one port): `A` records from a fixed table with their TTLs, NXDOMAIN
//! with an SOA (negative TTL 45 s) for every other name; answers of more than 20 records are truncated over UDP so
//! a client must retry over TCP. It counts every question it gets, so a test can see what reached it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
pub use hickory_proto::rr::RecordType;
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

/// Records of one name: TTL and addresses.
type Table = HashMap<String, (u32, Vec<Ipv4Addr>)>;
/// Questions seen: (lowercased FQDN, type) → count.
type Asked = Arc<Mutex<HashMap<(String, RecordType), usize>>>;
/// Source addresses questions came from.
type Sources = Arc<Mutex<Vec<IpAddr>>>;

/// The server; it stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    /// Where it listens (UDP and TCP).
    pub addr: SocketAddr,
    asked: Asked,
    sources: Sources,
    tasks: Vec<JoinHandle<()>>,
}

impl Upstream {
    /// Serve `table` (FQDN with the root dot, TTL, addresses) on `ip`, on a port of the system's choosing.
    pub async fn start(
        ip: std::net::IpAddr,
        table: &[(&str, u32, Vec<Ipv4Addr>)],
    ) -> std::io::Result<Upstream> {
        let tcp = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = tcp.local_addr()?;
        let udp = UdpSocket::bind(addr).await?;
        let table: Arc<Table> = Arc::new(
            table
                .iter()
                .map(|(n, ttl, ips)| (n.to_ascii_lowercase(), (*ttl, ips.clone())))
                .collect(),
        );
        let asked: Asked = Arc::default();
        let sources: Sources = Arc::default();
        let seen = |sources: &Sources, ip: IpAddr| {
            let mut s = sources.lock().unwrap_or_else(|p| p.into_inner());
            if !s.contains(&ip) {
                s.push(ip);
            }
        };
        let udp_task = {
            let (table, asked, sources) = (table.clone(), asked.clone(), sources.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok((n, src)) = udp.recv_from(&mut buf).await {
                    seen(&sources, src.ip());
                    if let Some(reply) = answer(&buf[..n], &table, &asked, true) {
                        let _ = udp.send_to(&reply, src).await;
                    }
                }
            })
        };
        let tcp_task = {
            let (asked, sources) = (asked.clone(), sources.clone());
            tokio::spawn(async move {
                while let Ok((mut s, peer)) = tcp.accept().await {
                    seen(&sources, peer.ip());
                    let (table, asked) = (table.clone(), asked.clone());
                    tokio::spawn(async move {
                        while let Ok(len) = s.read_u16().await {
                            let mut b = vec![0u8; usize::from(len)];
                            if s.read_exact(&mut b).await.is_err() {
                                return;
                            }
                            let Some(reply) = answer(&b, &table, &asked, false) else {
                                return;
                            };
                            let Ok(n) = u16::try_from(reply.len()) else {
                                return;
                            };
                            if s.write_u16(n).await.is_err() || s.write_all(&reply).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            })
        };
        Ok(Upstream {
            addr,
            asked,
            sources,
            tasks: vec![udp_task, tcp_task],
        })
    }

    /// How many times `name` (FQDN with the root dot) was asked for `rtype`, over either transport.
    pub fn asked(&self, name: &str, rtype: RecordType) -> usize {
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(name.to_ascii_lowercase(), rtype))
            .copied()
            .unwrap_or(0)
    }

    /// The source addresses questions came from, first seen first.
    pub fn sources(&self) -> Vec<IpAddr> {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Questions asked in all.
    pub fn total(&self) -> usize {
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn answer(bytes: &[u8], table: &Table, asked: &Asked, udp: bool) -> Option<Vec<u8>> {
    let q = Message::from_vec(bytes).ok()?;
    let query = q.queries.first()?.clone();
    let name = query.name().to_lowercase().to_ascii();
    *asked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((name.clone(), query.query_type()))
        .or_default() += 1;
    let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    r.add_query(query.clone());
    match table.get(&name) {
        Some((ttl, ips)) => {
            if query.query_type() == RecordType::A {
                if udp && ips.len() > 20 {
                    r.metadata.truncation = true;
                } else {
                    for ip in ips {
                        r.add_answer(Record::from_rdata(
                            query.name().clone(),
                            *ttl,
                            RData::A(A(*ip)),
                        ));
                    }
                }
            }
        }
        None => {
            r.metadata.response_code = ResponseCode::NXDomain;
            let zone = Name::from_ascii("example.").ok()?;
            let soa = SOA::new(zone.clone(), zone.clone(), 1, 3600, 600, 86400, 45);
            r.add_authority(Record::from_rdata(zone, 900, RData::SOA(soa)));
        }
    }
    r.to_vec().ok()
}
