//! Moving bytes between two ranks of a CPU group: each [`Peer`] is a connection with a writer
//! thread that streams queued sends, and the engine's point-to-point primitives (`send`,
//! `recv`, waiting for queued sends) with their failure reporting. Large reads sleep in
//! `poll()` until a batch has arrived (SO_RCVLOWAT) instead of waking per TCP segment.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::engine::Engine;
use super::mesh::Conn;
use crate::comm::{Backend, CommError};

/// In the direct (small-buffer) algorithms and barriers, messages of at most this size are
/// written by the communication thread itself when the peer's writer is idle (saves two thread
/// switches per small collective). There every link carries one such message per operation,
/// and socket buffers always absorb a few of them, so two ranks can never both sit in a write
/// waiting for the other to read. The pipelined rings always go through the writer threads.
const INLINE_WRITE_MAX: usize = 8 << 10;

/// Reads of at least `LOWAT_MIN` bytes ask the kernel (SO_RCVLOWAT) to wake the reader only
/// once up to `LOWAT_MAX` bytes have arrived: fewer wake-ups and larger copies per syscall.
const LOWAT_MIN: usize = 64 << 10;
const LOWAT_MAX: usize = 1 << 20;

/// Sets the socket's receive low-water mark (SO_RCVLOWAT) to `bytes`.
fn set_rcvlowat(s: &TcpStream, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: `s` keeps its socket open during the call, and `optval` points to a live
    // `c_int` whose size is `optlen`; setsockopt only reads it.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Why a link to a peer failed, as the error message will say.
#[derive(Debug, Clone)]
enum Failure {
    Closed,
    TimedOut,
    Io(io::ErrorKind, String),
}

/// The [`Failure`] an I/O error means.
fn classify(e: &io::Error) -> Failure {
    use io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
            Failure::Closed
        }
        WouldBlock | TimedOut => Failure::TimedOut,
        k => Failure::Io(k, e.to_string()),
    }
}

/// A send queued to a writer thread: `len` bytes at `ptr` (see `Engine::send`).
struct SendItem {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a `SendItem` is a borrowed view of memory that `Engine::send`'s contract keeps
// valid and unmodified until the writer thread counts the item done, so the writer thread
// may read it.
unsafe impl Send for SendItem {}

/// What a writer thread reports: how many items it is done with, and its first failure.
#[derive(Default)]
struct WriterState {
    done: u64,
    failure: Option<Failure>,
}

#[derive(Default)]
struct WriterShared {
    state: Mutex<WriterState>,
    cv: Condvar,
}

impl WriterShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One peer of the group: the connection, its writer thread and the count of sends queued.
pub(super) struct Peer {
    global: usize,
    addr: String,
    stream: TcpStream,
    /// Current SO_RCVLOWAT (large reads wait for big batches instead of waking per segment).
    lowat: usize,
    tx: Option<mpsc::Sender<SendItem>>,
    shared: Arc<WriterShared>,
    issued: u64,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    /// Starts the writer thread of `conn`, the connection to group member `global`.
    pub(super) fn start(conn: Conn, global: usize, group: &str) -> Result<Peer, CommError> {
        let w = conn.stream.try_clone().map_err(|e| {
            CommError::setup(
                Backend::Cpu,
                format!("cloning the socket to {}: {e}", conn.addr),
            )
        })?;
        let shared = Arc::new(WriterShared::default());
        let (tx, rx) = mpsc::channel::<SendItem>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("comm-{group}-w{global}"))
            .spawn(move || writer_loop(w, rx, sh))
            .map_err(|e| {
                CommError::setup(Backend::Cpu, format!("spawning a writer thread: {e}"))
            })?;
        Ok(Peer {
            global,
            addr: conn.addr,
            stream: conn.stream,
            lowat: 1,
            tx: Some(tx),
            shared,
            issued: 0,
            thread: Some(thread),
        })
    }
}

impl Peer {
    /// Shuts the connection both ways, so blocked reads and writes on it fail at once.
    pub(super) fn shut(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Blocks until the writer thread is done with every queued send (written or failed), so
    /// it no longer reads the memory those sends point to.
    pub(super) fn wait_drained(&self) {
        let mut st = self.shared.lock();
        while st.done < self.issued {
            st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread of a peer: writes queued items in order, counting each one done (after
/// a failure, without writing it), until the engine drops the sender.
fn writer_loop(mut sock: TcpStream, rx: mpsc::Receiver<SendItem>, shared: Arc<WriterShared>) {
    let mut failed = false;
    for item in rx {
        if !failed {
            // SAFETY: the engine queued `item` under `Engine::send`'s contract: `ptr` is valid
            // for reads of `len` bytes, not written or freed until this item is counted done
            // below.
            let buf = unsafe { std::slice::from_raw_parts(item.ptr, item.len) };
            if let Err(e) = sock.write_all(buf) {
                failed = true;
                let _ = sock.shutdown(Shutdown::Both);
                let mut st = shared.lock();
                st.failure.get_or_insert(classify(&e));
            }
        }
        let mut st = shared.lock();
        st.done += 1;
        drop(st);
        shared.cv.notify_all();
    }
}

impl Engine {
    fn error(&self, q: usize, f: Failure) -> CommError {
        let p = self.peer(q);
        let (rank, addr, op) = (p.global, p.addr.clone(), self.op);
        match f {
            Failure::Closed => CommError::PeerClosed { rank, addr, op },
            Failure::TimedOut => CommError::Timeout {
                rank,
                addr,
                op,
                timeout: self.timeout,
            },
            Failure::Io(kind, msg) => CommError::Io {
                rank,
                addr,
                op,
                source: io::Error::new(kind, msg),
            },
        }
    }

    /// Queues `len` elements at `p` for peer `q` (in the direct algorithms, a small message
    /// to an idle writer is written at once instead, see [`INLINE_WRITE_MAX`]).
    ///
    /// # Safety
    /// `p` is valid for reads of `len` elements of `T`, and that memory is neither written
    /// nor freed until the send is done: until `wait_sent` has returned `Ok` for a count that
    /// includes it (`wait_all_sent` does), or, after an error, until the engine has drained
    /// its writer threads.
    pub(super) unsafe fn send<T>(
        &mut self,
        q: usize,
        p: *const T,
        len: usize,
    ) -> Result<(), CommError> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        let peer = self.peers[q].as_mut().expect("a peer of this group");
        let failed = peer.shared.lock().failure.clone();
        if let Some(f) = failed {
            return Err(self.error(q, f));
        }
        if self.inline_ok && bytes <= INLINE_WRITE_MAX {
            let st = peer.shared.lock();
            if st.done == peer.issued && st.failure.is_none() {
                drop(st);
                // SAFETY: `p` is valid for reads of `len` elements, `bytes` bytes, and is not
                // written during this call (our caller's contract).
                let buf = unsafe { std::slice::from_raw_parts(p as *const u8, bytes) };
                if let Err(e) = (&peer.stream).write_all(buf) {
                    let f = classify(&e);
                    peer.shared.lock().failure.get_or_insert(f.clone());
                    return Err(self.error(q, f));
                }
                return Ok(());
            }
        }
        peer.issued += 1;
        let item = SendItem {
            ptr: p as *const u8,
            len: bytes,
        };
        if peer.tx.as_ref().is_none_or(|tx| tx.send(item).is_err()) {
            peer.issued -= 1;
            return Err(self.error(
                q,
                Failure::Io(io::ErrorKind::Other, "writer thread exited".into()),
            ));
        }
        Ok(())
    }

    /// Reads exactly `len` elements from peer `q` into `p`.
    ///
    /// # Safety
    /// `p` is valid for writes of `len` elements of `T`, and nothing else reads or writes
    /// that memory during the call (no pending send reads it either).
    pub(super) unsafe fn recv<T>(
        &mut self,
        q: usize,
        p: *mut T,
        len: usize,
    ) -> Result<(), CommError> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `p` is valid for writes of `len` elements, `bytes` bytes, and nothing else
        // accesses them during this call (our caller's contract); the element types are
        // plain data without padding, so any bytes read into them make valid values.
        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, bytes) };
        let wait_ms = self.timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let peer = self.peers[q].as_mut().expect("a peer of this group");
        let fd = peer.stream.as_raw_fd();
        let mut done = 0;
        while done < bytes {
            let left = bytes - done;
            if left < LOWAT_MIN {
                // Small remainder: a plain blocking read (SO_RCVTIMEO bounds it).
                if peer.lowat != 1 {
                    set_rcvlowat(&peer.stream, 1);
                    peer.lowat = 1;
                }
                match (&peer.stream).read(&mut buf[done..]) {
                    Ok(0) => return Err(self.read_error(q, io::ErrorKind::UnexpectedEof.into())),
                    Ok(k) => done += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.read_error(q, e)),
                }
                continue;
            }
            // Large remainder: take what is queued without blocking; when nothing is, sleep
            // in poll() until SO_RCVLOWAT bytes (never more than this message still owes us)
            // are queued, so the reader wakes once per big batch instead of per segment. (A
            // blocking read with a raised SO_RCVLOWAT can sleep forever: the kernel compares
            // the low-water mark with what is still queued, not with what the call copied.)
            // SAFETY: `fd` is the peer's open socket, and `buf[done..]` is a live mutable slice
            // of `left` bytes for `recv` to write into.
            let k = unsafe {
                libc::recv(
                    fd,
                    buf[done..].as_mut_ptr() as *mut libc::c_void,
                    left,
                    libc::MSG_DONTWAIT,
                )
            };
            if k > 0 {
                done += k as usize;
                continue;
            }
            if k == 0 {
                return Err(self.read_error(q, io::ErrorKind::UnexpectedEof.into()));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => return Err(self.read_error(q, e)),
            }
            let want = left.min(LOWAT_MAX);
            if peer.lowat != want {
                set_rcvlowat(&peer.stream, want);
                peer.lowat = want;
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `pfd` is one live, initialised `pollfd`, and `nfds` is 1.
            let r = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if r == 0 {
                return Err(self.read_error(q, io::ErrorKind::TimedOut.into()));
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(self.read_error(q, e));
                }
            }
        }
        Ok(())
    }

    fn read_error(&self, q: usize, e: io::Error) -> CommError {
        // If our writer to `q` failed first (and shut the socket), its cause is the real one.
        let f = self
            .peer(q)
            .shared
            .lock()
            .failure
            .clone()
            .unwrap_or_else(|| classify(&e));
        self.error(q, f)
    }

    pub(super) fn issued(&self, q: usize) -> u64 {
        self.peer(q).issued
    }

    /// Waits until the first `upto` queued sends to `q` are written.
    pub(super) fn wait_sent(&self, q: usize, upto: u64) -> Result<(), CommError> {
        let p = self.peer(q);
        let mut st = p.shared.lock();
        loop {
            if let Some(f) = st.failure.clone() {
                drop(st);
                return Err(self.error(q, f));
            }
            if st.done >= upto {
                return Ok(());
            }
            st = p.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(super) fn wait_all_sent(&self) -> Result<(), CommError> {
        for q in 0..self.n {
            if q != self.rank {
                self.wait_sent(q, self.issued(q))?;
            }
        }
        Ok(())
    }
}
