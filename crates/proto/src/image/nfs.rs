//! `nfs://host[:port]/export/path` sources: a small user-space NFSv3 client over TCP.
//!
//! Written here rather than taken from a crate: the provisioning job needs only
//! portmapper GETPORT, MOUNT3 MNT, and NFSv3 LOOKUP/GETATTR/FSINFO/READ, read
//! sequentially with several READs in flight on one connection, from a blocking
//! thread; the crates available (`nfs3_client`, libnfs bindings) bring an async runtime
//! or a C library for that. No privileged mount is needed (works inside a pod).
//! Authentication is AUTH_SYS as uid 0/gid 0 (what an NFS export policy keys on is the
//! client address). The export is found by trying `MNT` on the longest directory prefix
//! of the path first; the rest of the path is looked up component by component.
//! An explicit `:port` is the NFS port (MOUNT still comes from the portmapper).

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use std::sync::Arc;

use super::error::{PResult, ProvisionError};
use super::source::Source;
use super::spec::Scheme;

const PMAP_PROG: u32 = 100000;
const MOUNT_PROG: u32 = 100005;
const NFS_PROG: u32 = 100003;
const MAX_RECORD: usize = 64 << 20;
/// A record is read in pieces of at most this size, so memory follows the bytes received.
const READ_CHUNK: usize = 1 << 20;

/// XDR encoder.
#[derive(Default)]
struct Xdr(Vec<u8>);

impl Xdr {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn opaque(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        self
    }
}

/// XDR decoder over a reply; every accessor is bounds-checked.
struct Rd<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Rd<'a> {
    fn u32(&mut self) -> PResult<u32> {
        let s = self.b.get(self.p..self.p + 4).ok_or_else(short)?;
        self.p += 4;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> PResult<u64> {
        Ok(((self.u32()? as u64) << 32) | self.u32()? as u64)
    }
    fn opaque(&mut self) -> PResult<&'a [u8]> {
        let n = self.u32()? as usize;
        let s = self
            .b
            .get(self.p..self.p.checked_add(n).ok_or_else(short)?)
            .ok_or_else(short)?;
        self.p += n.div_ceil(4) * 4;
        Ok(s)
    }
    fn skip(&mut self, n: usize) -> PResult<()> {
        if self.p + n > self.b.len() {
            return Err(short());
        }
        self.p += n;
        Ok(())
    }
    /// post_op_attr; returns the file size when present.
    fn post_op_attr(&mut self) -> PResult<Option<u64>> {
        if self.u32()? == 0 {
            return Ok(None);
        }
        self.skip(20)?;
        let size = self.u64()?;
        self.skip(56)?;
        Ok(Some(size))
    }
}

fn short() -> ProvisionError {
    ProvisionError::Source("nfs: short or malformed rpc reply".into())
}

fn nfs_status(what: &str, st: u32) -> ProvisionError {
    let name = match st {
        1 => "permission denied (NFS3ERR_PERM)",
        2 => "not found (NFS3ERR_NOENT)",
        5 => "i/o error (NFS3ERR_IO)",
        13 => "access denied (NFS3ERR_ACCES)",
        20 => "not a directory (NFS3ERR_NOTDIR)",
        21 => "is a directory (NFS3ERR_ISDIR)",
        70 => "stale file handle (NFS3ERR_STALE)",
        _ => "error",
    };
    ProvisionError::Source(format!("nfs: {what}: {name} (status {st})"))
}

/// Read one RPC record (RFC 5531 record marking: fragments until the last-fragment
/// bit), at most [`MAX_RECORD`] bytes in all, buffered as it arrives.
pub fn read_record(s: &mut impl Read) -> PResult<Vec<u8>> {
    let mut rec = Vec::new();
    loop {
        let mut h = [0u8; 4];
        s.read_exact(&mut h)
            .map_err(|e| ProvisionError::Source(format!("nfs: reading reply: {e}")))?;
        let h = u32::from_be_bytes(h);
        let n = (h & 0x7fff_ffff) as usize;
        if rec.len() + n > MAX_RECORD {
            return Err(ProvisionError::Source("nfs: reply record too large".into()));
        }
        let mut left = n;
        while left > 0 {
            let at = rec.len();
            let k = left.min(READ_CHUNK);
            rec.resize(at + k, 0);
            s.read_exact(&mut rec[at..])
                .map_err(|e| ProvisionError::Source(format!("nfs: reading reply: {e}")))?;
            left -= k;
        }
        if h & 0x8000_0000 != 0 {
            return Ok(rec);
        }
    }
}

/// Check an RPC reply record's header; returns (xid, the procedure's reply body).
pub fn parse_reply(mut rec: Vec<u8>) -> PResult<(u32, Vec<u8>)> {
    let mut r = Rd { b: &rec, p: 0 };
    let xid = r.u32()?;
    if r.u32()? != 1 {
        return Err(ProvisionError::Source("nfs: not an rpc reply".into()));
    }
    if r.u32()? != 0 {
        let why = r.u32().unwrap_or(99);
        return Err(ProvisionError::Source(format!(
            "nfs: rpc call denied ({})",
            if why == 1 {
                "authentication error"
            } else {
                "rpc version mismatch"
            }
        )));
    }
    r.u32()?;
    r.opaque()?; // verifier
    let st = r.u32()?;
    if st != 0 {
        return Err(ProvisionError::Source(format!(
            "nfs: rpc call not accepted (accept_stat {st})"
        )));
    }
    let p = r.p;
    rec.drain(..p);
    Ok((xid, rec))
}

/// PMAPPROC_GETPORT reply: the port, `None` when the program is not registered.
pub fn parse_getport(b: &[u8]) -> PResult<Option<u16>> {
    let port = Rd { b, p: 0 }.u32()?;
    Ok(u16::try_from(port).ok().filter(|&p| p != 0))
}

/// MOUNTPROC3_MNT reply: the root file handle, or the mount status when refused.
pub fn parse_mnt(b: &[u8]) -> PResult<Result<Vec<u8>, u32>> {
    let mut r = Rd { b, p: 0 };
    match r.u32()? {
        0 => Ok(Ok(r.opaque()?.to_vec())),
        st => Ok(Err(st)),
    }
}

/// NFSPROC3_LOOKUP reply: the object's file handle and its size when the reply
/// carries its attributes; `what` names the lookup in errors.
pub fn parse_lookup(b: &[u8], what: &str) -> PResult<(Vec<u8>, Option<u64>)> {
    let mut r = Rd { b, p: 0 };
    let st = r.u32()?;
    if st != 0 {
        return Err(nfs_status(what, st));
    }
    let fh = r.opaque()?.to_vec();
    Ok((fh, r.post_op_attr()?))
}

/// NFSPROC3_GETATTR reply: the file size.
pub fn parse_getattr(b: &[u8], what: &str) -> PResult<u64> {
    let mut r = Rd { b, p: 0 };
    let st = r.u32()?;
    if st != 0 {
        return Err(nfs_status(what, st));
    }
    r.skip(20)?;
    r.u64()
}

/// NFSPROC3_FSINFO reply: the READ size to use (the server's preferred size, clamped
/// to 4 KiB..1 MiB; 64 KiB when the call failed).
pub fn parse_fsinfo(b: &[u8]) -> PResult<u32> {
    let mut r = Rd { b, p: 0 };
    if r.u32()? == 0 {
        r.post_op_attr()?;
        Ok(r.u32()?.clamp(4096, 1 << 20))
    } else {
        Ok(64 << 10)
    }
}

/// NFSPROC3_READ reply to a request for `count` bytes: the data (never more than
/// `count` bytes) and the EOF flag; `what` names the read in errors.
pub fn parse_read<'a>(b: &'a [u8], count: u32, what: &str) -> PResult<(&'a [u8], bool)> {
    let mut r = Rd { b, p: 0 };
    let st = r.u32()?;
    if st != 0 {
        return Err(nfs_status(what, st));
    }
    r.post_op_attr()?;
    let n = r.u32()?;
    let eof = r.u32()? != 0;
    let data = r.opaque()?;
    if n as usize != data.len() || n > count {
        return Err(short());
    }
    Ok((data, eof))
}

struct Conn {
    s: TcpStream,
    xid: u32,
}

impl Conn {
    fn connect(host: &str, port: u16) -> PResult<Conn> {
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| ProvisionError::Source(format!("nfs: resolving {host}: {e}")))?
            .next()
            .ok_or_else(|| ProvisionError::Source(format!("nfs: no address for {host}")))?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| ProvisionError::Source(format!("nfs: connecting to {addr}: {e}")))?;
        s.set_read_timeout(Some(Duration::from_secs(60))).ok();
        s.set_write_timeout(Some(Duration::from_secs(60))).ok();
        s.set_nodelay(true).ok();
        Ok(Conn {
            s,
            xid: std::process::id().wrapping_mul(2654435761),
        })
    }

    fn send(&mut self, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> PResult<u32> {
        self.xid = self.xid.wrapping_add(1);
        let mut cred = Xdr::default();
        cred.u32(0).opaque(b"bootplane").u32(0).u32(0).u32(0);
        let mut m = Xdr::default();
        m.u32(0); // record mark, patched below
        m.u32(self.xid).u32(0).u32(2).u32(prog).u32(vers).u32(proc_);
        m.u32(1).opaque(&cred.0); // AUTH_SYS
        m.u32(0).u32(0); // verifier AUTH_NONE
        m.0.extend_from_slice(args);
        let len = (m.0.len() - 4) as u32 | 0x8000_0000;
        m.0[..4].copy_from_slice(&len.to_be_bytes());
        self.s
            .write_all(&m.0)
            .map_err(|e| ProvisionError::Source(format!("nfs: sending request: {e}")))?;
        Ok(self.xid)
    }

    /// Read one reply record; returns (xid, body after the accepted-reply header).
    fn recv(&mut self) -> PResult<(u32, Vec<u8>)> {
        parse_reply(read_record(&mut self.s)?)
    }

    fn call(&mut self, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> PResult<Vec<u8>> {
        let xid = self.send(prog, vers, proc_, args)?;
        loop {
            let (x, body) = self.recv()?;
            if x == xid {
                return Ok(body);
            }
        }
    }
}

fn getport(host: &str, prog: u32, vers: u32) -> PResult<u16> {
    let mut c = Conn::connect(host, 111)?;
    let mut a = Xdr::default();
    a.u32(prog).u32(vers).u32(6).u32(0);
    let b = c.call(PMAP_PROG, 2, 3, &a.0)?;
    parse_getport(&b)?.ok_or_else(|| {
        ProvisionError::Source(format!(
            "nfs: program {prog} v{vers} is not registered on {host}"
        ))
    })
}

/// Parsed `nfs://host[:port]/path`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NfsUrl {
    pub host: String,
    pub port: Option<u16>,
    pub path: Vec<String>,
}

pub(crate) fn parse_url(url: &str) -> PResult<NfsUrl> {
    let bad = || ProvisionError::Usage(format!("{url:?} is not nfs://host[:port]/export/path"));
    let rest = url.strip_prefix("nfs://").ok_or_else(bad)?;
    let (hostport, path) = rest.split_once('/').ok_or_else(bad)?;
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h.split_once(']').ok_or_else(bad)?;
        (
            h.to_string(),
            p.strip_prefix(':')
                .map(|p| p.parse().map_err(|_| bad()))
                .transpose()?,
        )
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.parse().map_err(|_| bad())?)),
            None => (hostport.to_string(), None),
        }
    };
    let path: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .map(|c| {
            percent_encoding::percent_decode_str(c)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    if host.is_empty() || path.is_empty() || path.iter().any(|c| c == "..") {
        return Err(bad());
    }
    Ok(NfsUrl { host, port, path })
}

/// The `nfs://` scheme, for [`super::stream::Options::schemes`].
pub const SCHEME: Scheme = Scheme {
    prefix: "nfs://",
    open: open_source,
};

fn open_source(url: &str) -> PResult<Arc<dyn Source>> {
    Ok(Arc::new(NfsSource::open(url)?))
}

pub(crate) struct NfsSource {
    url: String,
    host: String,
    port: u16,
    fh: Vec<u8>,
    size: u64,
    rsize: u32,
}

impl NfsSource {
    pub(crate) fn open(url: &str) -> PResult<Self> {
        let u = parse_url(url)?;
        let mport = getport(&u.host, MOUNT_PROG, 3)?;
        let port = match u.port {
            Some(p) => p,
            None => getport(&u.host, NFS_PROG, 3)?,
        };
        // Find the export: longest directory prefix first.
        let mut mc = Conn::connect(&u.host, mport)?;
        let mut found = None;
        let mut last_err = 0;
        for k in (0..u.path.len()).rev() {
            let dir = format!("/{}", u.path[..k].join("/"));
            let mut a = Xdr::default();
            a.opaque(dir.as_bytes());
            let b = mc.call(MOUNT_PROG, 3, 1, &a.0)?;
            match parse_mnt(&b)? {
                Ok(fh) => {
                    found = Some((k, fh));
                    break;
                }
                Err(st) => last_err = st,
            }
        }
        let (k, mut fh) = found.ok_or_else(|| {
            ProvisionError::Source(format!(
                "nfs: no export of {} grants access to {url} (mount status {last_err}{})",
                u.host,
                if last_err == 13 {
                    ", access denied"
                } else {
                    ""
                }
            ))
        })?;
        let mut c = Conn::connect(&u.host, port)?;
        let mut size = None;
        for name in &u.path[k..] {
            let mut a = Xdr::default();
            a.opaque(&fh).opaque(name.as_bytes());
            let b = c.call(NFS_PROG, 3, 3, &a.0)?;
            (fh, size) = parse_lookup(&b, &format!("looking up {name:?} in {url}"))?;
        }
        let size = match size {
            Some(s) => s,
            None => {
                let mut a = Xdr::default();
                a.opaque(&fh);
                let b = c.call(NFS_PROG, 3, 1, &a.0)?;
                parse_getattr(&b, &format!("getattr {url}"))?
            }
        };
        let mut a = Xdr::default();
        a.opaque(&fh);
        let b = c.call(NFS_PROG, 3, 19, &a.0)?;
        let rsize = parse_fsinfo(&b)?;
        Ok(NfsSource {
            url: url.to_string(),
            host: u.host,
            port,
            fh,
            size,
            rsize,
        })
    }
}

impl Source for NfsSource {
    fn describe(&self) -> String {
        self.url.clone()
    }
    fn len(&self) -> Option<u64> {
        Some(self.size)
    }
    fn open_at(&self, offset: u64) -> PResult<Box<dyn Read + Send>> {
        let conn = Conn::connect(&self.host, self.port)?;
        Ok(Box::new(NfsReader {
            conn,
            fh: self.fh.clone(),
            next_req: offset,
            size: self.size,
            rsize: self.rsize,
            inflight: VecDeque::new(),
            replies: HashMap::new(),
            cur: Vec::new(),
            cur_pos: 0,
            url: self.url.clone(),
        }))
    }
}

/// Sequential reader with up to `DEPTH` READ calls in flight.
struct NfsReader {
    conn: Conn,
    fh: Vec<u8>,
    next_req: u64,
    size: u64,
    rsize: u32,
    inflight: VecDeque<(u32, u64, u32)>, // xid, offset, count, in offset order
    replies: HashMap<u32, Vec<u8>>,
    cur: Vec<u8>,
    cur_pos: usize,
    url: String,
}

const DEPTH: usize = 8;

impl NfsReader {
    fn request(&mut self, off: u64, count: u32) -> PResult<u32> {
        let mut a = Xdr::default();
        a.opaque(&self.fh).u64(off).u32(count);
        self.conn.send(NFS_PROG, 3, 6, &a.0)
    }

    fn fill(&mut self) -> PResult<bool> {
        while self.inflight.len() < DEPTH && self.next_req < self.size {
            let count = (self.size - self.next_req).min(self.rsize as u64) as u32;
            let xid = self.request(self.next_req, count)?;
            self.inflight.push_back((xid, self.next_req, count));
            self.next_req += count as u64;
        }
        let Some(&(xid, off, count)) = self.inflight.front() else {
            return Ok(false);
        };
        let body = loop {
            if let Some(b) = self.replies.remove(&xid) {
                break b;
            }
            let (x, b) = self.conn.recv()?;
            self.replies.insert(x, b);
        };
        self.inflight.pop_front();
        let (data, eof) = parse_read(
            &body,
            count,
            &format!("reading {} at offset {off}", self.url),
        )?;
        let n = data.len() as u32;
        if n < count {
            if eof || n == 0 {
                return Err(ProvisionError::Truncated(format!(
                    "{} ended at offset {}",
                    self.url,
                    off + n as u64
                )));
            }
            // Short read: ask for the rest before anything queued after it.
            let xid = self.request(off + n as u64, count - n)?;
            self.inflight.push_front((xid, off + n as u64, count - n));
        }
        self.cur = data.to_vec();
        self.cur_pos = 0;
        Ok(true)
    }
}

impl Read for NfsReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cur_pos == self.cur.len() {
            match self.fill() {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(ProvisionError::Truncated(m)) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, m))
                }
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
        }
        let n = buf.len().min(self.cur.len() - self.cur_pos);
        buf[..n].copy_from_slice(&self.cur[self.cur_pos..self.cur_pos + n]);
        self.cur_pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("nfs://10.0.0.1/export/img/a%20b.zst").unwrap(),
            NfsUrl {
                host: "10.0.0.1".into(),
                port: None,
                path: vec!["export".into(), "img".into(), "a b.zst".into()]
            }
        );
        assert_eq!(parse_url("nfs://h:2049/x").unwrap().port, Some(2049));
        assert_eq!(parse_url("nfs://[::1]:2049/x").unwrap().host, "::1");
        for bad in [
            "nfs://h",
            "nfs:///x",
            "http://h/x",
            "nfs://h/../x",
            "nfs://h:99999/x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let mut r = Rd {
            b: &[0, 0, 0, 1, 0, 0],
            p: 0,
        };
        assert_eq!(r.u32().unwrap(), 1);
        assert!(r.u32().is_err());
        let mut r = Rd {
            b: &[0xff, 0xff, 0xff, 0xff],
            p: 0,
        };
        assert!(r.opaque().is_err());
        let mut r = Rd {
            b: &[0, 0, 0, 1, 0, 0],
            p: 0,
        };
        assert!(r.post_op_attr().is_err());
    }

    #[test]
    fn replies_parse_from_records() {
        let mut body = Xdr::default();
        body.u32(0).u32(0).u32(5).u32(1).opaque(b"hello"); // READ: ok, no attrs, 5, eof
        let mut rec = Xdr::default();
        rec.u32(9).u32(1).u32(0).u32(0).opaque(b"").u32(0);
        rec.0.extend_from_slice(&body.0);
        let mut wire = ((rec.0.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
        wire.extend_from_slice(&rec.0);
        let r = read_record(&mut &wire[..]).unwrap();
        let (xid, b) = parse_reply(r).unwrap();
        assert_eq!(xid, 9);
        assert_eq!(parse_read(&b, 5, "r").unwrap(), (&b"hello"[..], true));
        assert!(parse_read(&b, 4, "r").is_err(), "more data than asked for");
        assert_eq!(parse_getport(&[0, 1, 0, 0]).unwrap(), None, "port 65536");
        assert_eq!(parse_getport(&[0, 0, 8, 1]).unwrap(), Some(2049));
        assert_eq!(parse_fsinfo(&[0, 0, 0, 1]).unwrap(), 64 << 10);
        assert_eq!(parse_mnt(&[0, 0, 0, 13]).unwrap(), Err(13));
        assert!(
            read_record(&mut &[0x80, 0, 0, 9, 1][..]).is_err(),
            "truncated record"
        );
    }

    /// Found while fuzzing (`nfs_xdr` ran at 859 inputs/s): a 4-byte record mark made
    /// the client allocate and zero the whole claimed fragment (up to 64 MiB) before
    /// reading any of it. Memory must follow the bytes that actually arrive.
    #[test]
    fn a_record_mark_alone_commits_no_memory() {
        struct Probe<'a>(&'a [u8], usize);
        impl Read for Probe<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.1 = self.1.max(buf.len());
                let n = buf.len().min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut p = Probe(&[0xbf, 0xff, 0xff, 0xff, 1, 2, 3], 0);
        assert!(read_record(&mut p).is_err(), "3 of 1 GiB is truncated");
        let mut p = Probe(&[0x83, 0xff, 0xff, 0xf0, 1, 2, 3], 0);
        assert!(read_record(&mut p).is_err(), "3 of 64 MiB is truncated");
        assert!(
            p.1 <= READ_CHUNK,
            "read into a {} byte buffer for 3 bytes",
            p.1
        );
    }

    #[test]
    fn xdr_pads_opaques() {
        let mut x = Xdr::default();
        x.opaque(b"abcde").u32(7);
        assert_eq!(x.0.len(), 4 + 8 + 4);
        let mut r = Rd { b: &x.0, p: 0 };
        assert_eq!(r.opaque().unwrap(), b"abcde");
        assert_eq!(r.u32().unwrap(), 7);
    }
}
