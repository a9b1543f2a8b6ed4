//! Connection set-up of a CPU group: choosing the address to listen on, publishing it in the
//! store with the rank's host name, and connecting every pair of ranks once (the lower rank
//! accepts, the higher one connects and says hello with the group's hash and its rank). Each
//! connection keeps its peer's host and address, which every error about that peer names
//! (`rank 3 (fltnode2, 10.77.0.12:33683) closed the connection during all_reduce`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use super::CpuOptions;
use crate::comm::{Backend, CommError};
use crate::store::KvStore;

/// First field of the hello a connecting rank sends.
const HELLO_MAGIC: u32 = 0xF107_C0DE;

/// An established connection to a peer, and the peer's host and address for messages.
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) addr: String,
}

/// The store key under which `rank` of `group` publishes `<ip:port> <host name>`.
fn addr_key(group: &str, rank: usize) -> String {
    format!("cpu/{group}/addr/{rank}")
}

/// The value a rank publishes under [`addr_key`]: its listening address, then its host name.
fn published(addr: SocketAddr, host: &str) -> String {
    format!("{addr} {host}")
}

/// A published value split into the socket address and the name for messages
/// (`fltnode2, 10.77.0.12:33683`; the bare address when no host was published).
fn parse_published(value: &str) -> Option<(SocketAddr, String)> {
    let (addr_s, host) = match value.split_once(' ') {
        Some((a, h)) => (a, h.trim()),
        None => (value, ""),
    };
    let addr: SocketAddr = addr_s.parse().ok()?;
    let label = if host.is_empty() {
        addr.to_string()
    } else {
        format!("{host}, {addr}")
    };
    Some((addr, label))
}

/// FNV-1a hash of a group name, which hellos carry so a stray connection is not mistaken for
/// a member of another group.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The local address of the route towards `host` (no packet is sent), else loopback.
fn route_ip(host: Option<&str>) -> IpAddr {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return loopback;
    };
    let Ok(addrs) = (host, 9).to_socket_addrs() else {
        return loopback;
    };
    for a in addrs {
        let bind: SocketAddr = if a.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        if let Ok(u) = UdpSocket::bind(bind) {
            if u.connect(a).is_ok() {
                if let Ok(l) = u.local_addr() {
                    return l.ip();
                }
            }
        }
    }
    loopback
}

/// The address to listen on: `FLOTILLA_CPU_LISTEN_IP`, else the configured one, else the
/// route towards the master.
fn listen_ip(opts: &CpuOptions) -> IpAddr {
    if let Some(ip) = std::env::var("FLOTILLA_CPU_LISTEN_IP")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return ip;
    }
    opts.listen_ip
        .unwrap_or_else(|| route_ip(opts.route_to.as_deref()))
}

/// The 16-byte hello: magic, group hash and rank.
fn hello(group_hash: u64, rank: usize) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    h[4..12].copy_from_slice(&group_hash.to_le_bytes());
    h[12..].copy_from_slice(&(rank as u32).to_le_bytes());
    h
}

/// Connects every pair of ranks of the group (lower rank accepts, higher rank connects).
pub(super) fn connect_mesh(
    store: &dyn KvStore,
    group: &str,
    rank: usize,
    globals: &[usize],
    opts: &CpuOptions,
) -> Result<Vec<Option<Conn>>, CommError> {
    let n = globals.len();
    let setup = |msg: String| CommError::setup(Backend::Cpu, msg);
    let ip = listen_ip(opts);
    let listener =
        TcpListener::bind((ip, 0)).map_err(|e| setup(format!("listening on {ip}: {e}")))?;
    let me = listener.local_addr().map_err(|e| setup(e.to_string()))?;
    let host = flotilla_contract::host_name();
    store.set(&addr_key(group, rank), published(me, &host).as_bytes())?;
    let deadline = Instant::now() + opts.timeout;
    let group_hash = fnv1a(group);
    let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();

    for (q, conn) in conns.iter_mut().enumerate().skip(rank + 1) {
        let value = String::from_utf8_lossy(&store.get(&addr_key(group, q))?).into_owned();
        let (addr, addr_s) = parse_published(&value).ok_or_else(|| {
            CommError::Store(format!("bad address {value:?} for rank {}", globals[q]))
        })?;
        let mut stream = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5).min(opts.timeout)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(setup(format!(
                        "connecting to rank {} ({addr_s}): {e}",
                        globals[q]
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        stream
            .write_all(&hello(group_hash, rank))
            .map_err(|e| setup(format!("greeting rank {} ({addr_s}): {e}", globals[q])))?;
        *conn = Some(Conn {
            stream,
            addr: addr_s,
        });
    }

    listener
        .set_nonblocking(true)
        .map_err(|e| setup(e.to_string()))?;
    let mut missing = rank;
    while missing > 0 {
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(100)),
                ));
                let mut h = [0u8; 16];
                if s.read_exact(&mut h).is_err() {
                    continue; // not one of ours, or gone
                }
                let magic = u32::from_le_bytes(h[..4].try_into().unwrap());
                let ghash = u64::from_le_bytes(h[4..12].try_into().unwrap());
                let q = u32::from_le_bytes(h[12..].try_into().unwrap()) as usize;
                if magic != HELLO_MAGIC || ghash != group_hash || q >= rank || conns[q].is_some() {
                    tracing::warn!(
                        "ignoring unexpected connection from {from} while setting up group {group}"
                    );
                    continue;
                }
                let value = String::from_utf8_lossy(&store.get(&addr_key(group, q))?).into_owned();
                let addr = parse_published(&value).map_or(value, |(_, label)| label);
                conns[q] = Some(Conn { stream: s, addr });
                missing -= 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let absent: Vec<usize> = (0..rank)
                        .filter(|&q| conns[q].is_none())
                        .map(|q| globals[q])
                        .collect();
                    return Err(setup(format!(
                        "timed out after {:?} waiting for ranks {absent:?} to connect to {me}",
                        opts.timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(setup(format!("accepting connections on {me}: {e}"))),
        }
    }
    for c in conns.iter().flatten() {
        let s = &c.stream;
        let r = s
            .set_nodelay(true)
            .and_then(|_| s.set_read_timeout(Some(opts.timeout)))
            .and_then(|_| s.set_write_timeout(Some(opts.timeout)));
        r.map_err(|e| setup(format!("configuring the connection to {}: {e}", c.addr)))?;
    }
    Ok(conns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_ip_of_loopback_is_loopback() {
        assert_eq!(route_ip(Some("127.0.0.1")), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(route_ip(None), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(route_ip(Some("no-such-host.invalid")).is_loopback());
    }

    #[test]
    fn published_address_carries_the_host_name() {
        let addr: SocketAddr = "10.77.0.12:33683".parse().unwrap();
        let (back, label) = parse_published(&published(addr, "fltnode2")).unwrap();
        assert_eq!(back, addr);
        assert_eq!(label, "fltnode2, 10.77.0.12:33683");
        // A value without a host (an older peer) is the bare address.
        assert_eq!(
            parse_published("10.77.0.12:33683").unwrap().1,
            "10.77.0.12:33683"
        );
        assert!(parse_published("fltnode2").is_none());
    }

    #[test]
    fn every_connection_names_its_peer_host_and_address() {
        use crate::store::MemoryStore;
        let stores = MemoryStore::group(3);
        let globals = [0, 1, 2];
        let opts = CpuOptions {
            listen_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ..CpuOptions::default()
        };
        let host = flotilla_contract::host_name();
        let meshes: Vec<Vec<Option<Conn>>> = std::thread::scope(|s| {
            let handles: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(rank, store)| {
                    let opts = &opts;
                    s.spawn(move || {
                        connect_mesh(store.as_ref(), "g", rank, &globals, opts).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, conns) in meshes.iter().enumerate() {
            for (q, conn) in conns.iter().enumerate() {
                let Some(conn) = conn else {
                    assert_eq!(q, rank, "rank {rank} has no connection to {q}");
                    continue;
                };
                let peer = meshes[q][rank]
                    .as_ref()
                    .unwrap()
                    .stream
                    .local_addr()
                    .unwrap();
                let (prefix, addr) = conn.addr.split_once(", ").unwrap();
                assert_eq!(
                    prefix, host,
                    "rank {rank}'s label of rank {q}: {}",
                    conn.addr
                );
                // The listening address the peer published: its IP, whatever the port.
                assert_eq!(addr.parse::<SocketAddr>().unwrap().ip(), peer.ip());
            }
        }
    }
}
