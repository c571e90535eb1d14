//! The read and decode stages: a packed image read frame by frame and decoded on
//! several threads, a plain zstd stream decoded as it is read, a raw image read in
//! chunks; each hands whole chunks on in order of their index.

use super::*;

fn read_exact_or(r: &mut dyn Read, buf: &mut [u8], what: impl Fn() -> String) -> PResult<()> {
    let n = read_full(r, buf).map_err(|e| ProvisionError::Source(format!("{}: {e}", what())))?;
    if n < buf.len() {
        return Err(ProvisionError::Truncated(format!(
            "{}: source ended after {n} of {} bytes",
            what(),
            buf.len()
        )));
    }
    Ok(())
}

/// Read until `buf` is full or the source ends; returns the bytes read.
pub(crate) fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reader for packed images: frame 0, then frames `start..`, then the seek table.
pub(super) fn read_framed(
    plan: &Plan,
    m: &Manifest,
    start: u64,
    tx: SyncSender<(u64, Vec<u8>)>,
    sh: &Shared,
) -> PResult<()> {
    let order: Vec<u64> = if start > 0 {
        std::iter::once(0)
            .chain(start..m.frames.len() as u64)
            .collect()
    } else {
        (0..m.frames.len() as u64).collect()
    };
    let mut r: Option<(Box<dyn Read + Send>, u64)> = None;
    for i in order {
        if sh.aborted() {
            return Ok(());
        }
        let f = &m.frames[i as usize];
        if r.as_ref().is_none_or(|(_, pos)| *pos != f.offset) {
            r = Some((plan.src.open_at(f.offset)?, f.offset));
        }
        let (rd, pos) = r.as_mut().expect("reader opened above");
        let mut v = vec![0u8; f.compressed_size as usize];
        read_exact_or(rd.as_mut(), &mut v, || {
            format!("reading frame {i} at offset {}", f.offset)
        })?;
        *pos += f.compressed_size;
        if tx.send((i, v)).is_err() {
            return Ok(());
        }
    }
    // The seek table, then nothing.
    let end = m.frames_end();
    let (rd, pos) = match r {
        Some((rd, pos)) if pos == end => (rd, pos),
        _ => (plan.src.open_at(end)?, end),
    };
    let mut rd = rd;
    let mut tail = vec![0u8; (m.compressed_size - pos) as usize];
    read_exact_or(rd.as_mut(), &mut tail, || "reading the seek table".into())?;
    if !tail.is_empty() && format::parse_seek_table(&tail).is_none_or(|t| t.len() != m.frames.len())
    {
        return Err(ProvisionError::Trailing(format!(
            "{} bytes after the last frame are not a seek table",
            tail.len()
        )));
    }
    let mut one = [0u8; 1];
    match rd.read(&mut one) {
        Ok(0) => Ok(()),
        Ok(_) => Err(ProvisionError::Trailing(format!(
            "data after the image's {} bytes",
            m.compressed_size
        ))),
        Err(e) => Err(ProvisionError::Source(format!("reading past the end: {e}"))),
    }
}

fn decode_one(
    d: &mut zstd::bulk::Decompressor<'static>,
    m: &Manifest,
    i: u64,
    comp: &[u8],
    pool: &Pool,
    frame_sha: bool,
) -> PResult<Chunk> {
    let f = &m.frames[i as usize];
    let len = f.raw_size as usize;
    let mut buf = pool.get();
    let n = d
        .decompress_to_buffer(comp, &mut buf.as_mut_slice()[..len])
        .map_err(|e| {
            ProvisionError::Integrity(format!(
                "frame {i} (raw offset {}): zstd: {e}",
                f.raw_offset
            ))
        })?;
    if n != len {
        return Err(ProvisionError::Integrity(format!(
            "frame {i}: decoded {n} bytes, manifest says {len}"
        )));
    }
    if frame_sha {
        let got = Sha256::digest(&buf.as_slice()[..len]);
        if hex::encode(got) != f.sha256 {
            return Err(ProvisionError::Integrity(format!(
                "frame {i} (raw offset {}): sha256 {} does not match the manifest's {}",
                f.raw_offset,
                hex::encode(got),
                f.sha256
            )));
        }
    }
    Ok(Chunk { idx: i, buf, len })
}

/// Decoder thread. After a failure anywhere it keeps draining its input (discarding),
/// so no producer stays blocked on a full channel; it ends when the reader is done.
pub(super) fn decode_worker(
    m: &Manifest,
    rx: &Mutex<Receiver<(u64, Vec<u8>)>>,
    tx: &SyncSender<Chunk>,
    pool: &Pool,
    frame_sha: bool,
    sh: &Shared,
) {
    let mut d = match zstd::bulk::Decompressor::new() {
        Ok(d) => Some(d),
        Err(e) => {
            sh.fail(ProvisionError::Internal(format!("zstd context: {e}")));
            None
        }
    };
    loop {
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok((i, comp)) = job else { return };
        let Some(d) = d.as_mut() else { continue };
        if sh.aborted() {
            continue;
        }
        match decode_one(d, m, i, &comp, pool, frame_sha) {
            Ok(c) => {
                if tx.send(c).is_err() {
                    sh.fail(ProvisionError::Internal("sequencer ended early".into()));
                }
            }
            Err(e) => sh.fail(e),
        }
    }
}

/// Reader+decoder for a plain zstd stream: fills chunk-sized buffers in order.
pub(super) fn decode_stream(
    plan: &Plan,
    tx: SyncSender<Chunk>,
    pool: &Pool,
    sh: &Shared,
) -> PResult<()> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    let mut r = plan.src.open_at(0)?;
    let mut dec =
        Decoder::new().map_err(|e| ProvisionError::Internal(format!("zstd context: {e}")))?;
    let chunk = plan.chunk as usize;
    let mut inbuf = vec![0u8; 1 << 20];
    let mut at_boundary = true;
    let mut idx = 0u64;
    let mut consumed = 0u64;
    let mut out = pool.get();
    let mut fill = 0usize;
    loop {
        if sh.aborted() {
            return Ok(());
        }
        let n = match r.read(&mut inbuf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(ProvisionError::Source(format!(
                    "reading {}: {e}",
                    plan.src.describe()
                )))
            }
        };
        if n == 0 {
            break;
        }
        let mut input = InBuffer::around(&inbuf[..n]);
        while input.pos < n {
            let before = input.pos;
            let mut o = OutBuffer::around(&mut out.as_mut_slice()[fill..chunk]);
            let res = dec.run(&mut input, &mut o);
            let written = o.pos();
            fill += written;
            match res {
                Ok(hint) => at_boundary = hint == 0,
                Err(e) => {
                    let off = consumed + before as u64;
                    return Err(if at_boundary && (idx > 0 || fill > 0) {
                        ProvisionError::Trailing(format!(
                            "data after the last zstd frame at compressed offset {off}: {e}"
                        ))
                    } else {
                        ProvisionError::Integrity(format!(
                            "zstd data near compressed offset {off}: {e}"
                        ))
                    });
                }
            }
            if send_if_full(&mut out, &mut fill, &mut idx, chunk, pool, &tx).is_err() {
                return Ok(());
            }
        }
        consumed += n as u64;
    }
    // Drain output still buffered inside the decoder.
    loop {
        let mut o = OutBuffer::around(&mut out.as_mut_slice()[fill..chunk]);
        let hint = dec
            .run(&mut InBuffer::around(&[]), &mut o)
            .map_err(|e| ProvisionError::Integrity(format!("zstd: {e}")))?;
        let w = o.pos();
        fill += w;
        match send_if_full(&mut out, &mut fill, &mut idx, chunk, pool, &tx) {
            Err(ReceiverGone) => return Ok(()),
            Ok(true) => continue,
            Ok(false) => {}
        }
        // With no input and nothing left to flush, zstd asks for the next frame's
        // header: that is not "inside a frame", so only count calls that produced output.
        if w == 0 {
            break;
        }
        at_boundary = hint == 0;
    }
    if !at_boundary {
        return Err(ProvisionError::Truncated(format!(
            "{} ends in the middle of a zstd frame",
            plan.src.describe()
        )));
    }
    if consumed == 0 {
        return Err(ProvisionError::Truncated(format!(
            "{} is empty",
            plan.src.describe()
        )));
    }
    if fill > 0 {
        let _ = tx.send(Chunk {
            idx,
            buf: out,
            len: fill,
        });
    }
    Ok(())
}

/// The next stage stopped taking chunks (it ends the pipeline, having failed or finished).
struct ReceiverGone;

/// Sends `out` on as chunk `idx` once it is full (`fill == chunk`), with a fresh pooled
/// buffer in its place and `idx` and `fill` moved on; `Ok(false)` while not full yet.
fn send_if_full(
    out: &mut PooledBuf,
    fill: &mut usize,
    idx: &mut u64,
    chunk: usize,
    pool: &Pool,
    tx: &SyncSender<Chunk>,
) -> Result<bool, ReceiverGone> {
    if *fill != chunk {
        return Ok(false);
    }
    let full = std::mem::replace(out, pool.get());
    let sent = tx.send(Chunk {
        idx: *idx,
        buf: full,
        len: chunk,
    });
    sent.map_err(|_| ReceiverGone)?;
    *idx += 1;
    *fill = 0;
    Ok(true)
}

/// Reader for raw images: chunk 0, then chunks from `start`.
pub(super) fn read_raw(
    plan: &Plan,
    start: u64,
    tx: SyncSender<Chunk>,
    pool: &Pool,
    sh: &Shared,
) -> PResult<()> {
    let chunk = plan.chunk as usize;
    let mut idx = 0u64;
    let mut r = plan.src.open_at(0)?;
    loop {
        if sh.aborted() {
            return Ok(());
        }
        if idx == 1 && start > 1 {
            idx = start;
            r = plan.src.open_at(start * plan.chunk)?;
        }
        let mut buf = pool.get();
        let n = read_full(r.as_mut(), &mut buf.as_mut_slice()[..chunk])
            .map_err(|e| ProvisionError::Source(format!("reading {}: {e}", plan.src.describe())))?;
        if n == 0 {
            break;
        }
        if tx.send(Chunk { idx, buf, len: n }).is_err() {
            return Ok(());
        }
        idx += 1;
        if n < chunk {
            break;
        }
    }
    Ok(())
}
