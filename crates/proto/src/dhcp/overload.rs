//! Option overload (RFC 2132 9.3, option 52) and the client's maximum message size
//! (option 57), on the wire bytes. dhcproto 0.15 neither reads options from `file` /
//! `sname` nor writes them there, so this works on the encoded message:
//!
//! - [`fit`]: a reply larger than the client accepts keeps its options field as full as
//!   it can and moves the options that do not fit into `file` (option 52 = 1), then
//!   also `sname` (= 3). A field used for options loses its text, so the boot file
//!   name travels as option 67 and the server name as option 66 (added when missing).
//!   Pieces of one long option (RFC 3396) keep their order across the fields
//!   (options, then `file`, then `sname`). An option that fits nowhere is left out and
//!   counted in the result.
//! - [`unfold`]: a request carrying option 52 is rewritten into the plain layout
//!   (`file`/`sname` options appended to the options field, in RFC 2132 order) before
//!   dhcproto decodes it, so the core sees every option the client sent.
//!
//! Hand-written because it is byte layout only (no parsing beyond TLVs) and the crate
//! has no hook for it.

use std::borrow::Cow;

/// Offsets in the fixed BOOTP header.
const SNAME: std::ops::Range<usize> = 44..108;
const FILE: std::ops::Range<usize> = 108..236;
const COOKIE_END: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];

const OPT_PAD: u8 = 0;
const OPT_END: u8 = 255;
const OPT_OVERLOAD: u8 = 52;
const OPT_MSG_TYPE: u8 = 53;
const OPT_TFTP_SERVER: u8 = 66;
const OPT_BOOTFILE: u8 = 67;

/// Smallest DHCP message every client must accept: RFC 2131 section 2, a 236-octet
/// header and 312 octets of options (576-octet IP datagram minus IP and UDP headers).
pub const MIN_MESSAGE_LEN: usize = 548;
/// IPv4 + UDP headers, which option 57 counts (as ISC dhcpd and dnsmasq read it).
const IP_UDP_HEADERS: usize = 28;
/// The largest reply we size for without fragmenting: an Ethernet MTU.
pub(crate) const MAX_MESSAGE_LEN: usize = 1500 - IP_UDP_HEADERS;

/// The largest DHCP message (UDP payload) a client whose option 57 says `opt57`
/// accepts: values below the RFC minimum 576 count as 576, the result is capped at an
/// Ethernet frame. No option 57: [`MIN_MESSAGE_LEN`].
pub(crate) fn max_len_for(opt57: Option<u16>) -> usize {
    match opt57 {
        Some(v) => (usize::from(v).max(576) - IP_UDP_HEADERS).min(MAX_MESSAGE_LEN),
        None => MIN_MESSAGE_LEN,
    }
}

/// One option as found on the wire (one TLV; a long option is several).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tlv<'a> {
    code: u8,
    data: Cow<'a, [u8]>,
}

impl Tlv<'_> {
    fn wire_len(&self) -> usize {
        2 + self.data.len()
    }
}

/// The TLVs of one option area, up to the end option. `None` when one runs past it.
fn tlvs(area: &[u8]) -> Option<Vec<Tlv<'_>>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < area.len() {
        match area[i] {
            OPT_PAD => i += 1,
            OPT_END => break,
            code => {
                let l = usize::from(*area.get(i + 1)?);
                let data = area.get(i + 2..i + 2 + l)?;
                out.push(Tlv {
                    code,
                    data: Cow::Borrowed(data),
                });
                i += 2 + l;
            }
        }
    }
    Some(out)
}

/// C-string text of a header field (up to its first NUL).
fn field_text(f: &[u8]) -> &[u8] {
    let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    &f[..end]
}

/// Split `text` into TLVs of `code` (RFC 3396 for texts over 255 bytes).
fn text_tlvs(code: u8, text: &[u8]) -> Vec<Tlv<'static>> {
    text.chunks(255)
        .map(|c| Tlv {
            code,
            data: Cow::Owned(c.to_vec()),
        })
        .collect()
}

/// What [`fit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    pub bytes: Vec<u8>,
    /// Option 52's value: 0 none, 1 `file`, 2 `sname`, 3 both.
    pub overload: u8,
    /// Option TLVs that fit nowhere and were left out.
    pub dropped: usize,
}

/// Make an encoded reply fit in `max_len` bytes (see the module doc). A reply that
/// already fits, or that is not a well-formed DHCP message, is returned unchanged.
pub fn fit(encoded: Vec<u8>, max_len: usize) -> Fitted {
    let unchanged = |bytes| Fitted {
        bytes,
        overload: 0,
        dropped: 0,
    };
    let max_len = max_len.max(MIN_MESSAGE_LEN);
    if encoded.len() <= max_len || encoded.len() < COOKIE_END || encoded[236..240] != MAGIC {
        return unchanged(encoded);
    }
    let Some(opts) = tlvs(&encoded[COOKIE_END..]) else {
        return unchanged(encoded);
    };
    let mut opts: Vec<Tlv<'_>> = opts
        .into_iter()
        .filter(|t| t.code != OPT_OVERLOAD)
        .collect();
    // The texts of `file` and `sname` must survive as options if the fields are reused.
    let file = field_text(&encoded[FILE]).to_vec();
    let sname = field_text(&encoded[SNAME]).to_vec();
    if !file.is_empty() && !opts.iter().any(|t| t.code == OPT_BOOTFILE) {
        opts.extend(text_tlvs(OPT_BOOTFILE, &file));
    }
    if !sname.is_empty() && !opts.iter().any(|t| t.code == OPT_TFTP_SERVER) {
        opts.extend(text_tlvs(OPT_TFTP_SERVER, &sname));
    }
    // Areas: 0 = options field (room for option 52 and the end option), 1 = file, 2 = sname.
    let mut room = [
        max_len - COOKIE_END - 3 - 1,
        FILE.len() - 1,
        SNAME.len() - 1,
    ];
    // First fit, largest option first (the small ones fill the gaps), the message type
    // first of all and only in the options field (RFC 2131 wants it there). The pieces
    // of one option (RFC 3396) are placed together, each in the same area as the one
    // before it or a later one, so their concatenation keeps its order.
    let mut units: Vec<(u8, Vec<usize>)> = Vec::new();
    for (i, t) in opts.iter().enumerate() {
        match units.iter_mut().find(|u| u.0 == t.code) {
            Some(u) => u.1.push(i),
            None => units.push((t.code, vec![i])),
        }
    }
    let size = |u: &(u8, Vec<usize>)| -> usize { u.1.iter().map(|&i| opts[i].wire_len()).sum() };
    units.sort_by_key(|u| (u.0 != OPT_MSG_TYPE, std::cmp::Reverse(size(u))));
    let mut placed: [Vec<usize>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut dropped = 0;
    for (code, pieces) in &units {
        let last = if *code == OPT_MSG_TYPE { 0 } else { 2 };
        let mut first = 0;
        for (k, &i) in pieces.iter().enumerate() {
            let len = opts[i].wire_len();
            match (first..=last).find(|&a| room[a] >= len) {
                Some(a) => {
                    room[a] -= len;
                    placed[a].push(i);
                    first = a;
                }
                None => {
                    // Later pieces of a cut option would be misread: leave them out too.
                    dropped += pieces.len() - k;
                    break;
                }
            }
        }
    }
    for p in &mut placed {
        p.sort_unstable();
    }
    let overload = u8::from(!placed[1].is_empty()) | (u8::from(!placed[2].is_empty()) << 1);

    let mut out = Vec::with_capacity(max_len);
    out.extend_from_slice(&encoded[..COOKIE_END]);
    let write_area = |dst: &mut [u8], list: &[usize]| {
        dst.fill(0);
        let mut i = 0;
        for t in list.iter().map(|&k| &opts[k]) {
            dst[i] = t.code;
            dst[i + 1] = t.data.len() as u8;
            dst[i + 2..i + 2 + t.data.len()].copy_from_slice(&t.data);
            i += t.wire_len();
        }
        dst[i] = OPT_END;
    };
    if overload & 1 != 0 {
        write_area(&mut out[FILE], &placed[1]);
    }
    if overload & 2 != 0 {
        write_area(&mut out[SNAME], &placed[2]);
    }
    for t in placed[0].iter().map(|&k| &opts[k]) {
        out.push(t.code);
        out.push(t.data.len() as u8);
        out.extend_from_slice(&t.data);
    }
    if overload != 0 {
        out.extend_from_slice(&[OPT_OVERLOAD, 1, overload]);
    }
    out.push(OPT_END);
    Fitted {
        bytes: out,
        overload,
        dropped,
    }
}

/// Rewrite a request that uses option overload into the plain layout (see the module
/// doc). Anything else, including malformed input, is returned as it is (the decoder
/// then judges it).
pub(crate) fn unfold(buf: &[u8]) -> Cow<'_, [u8]> {
    if buf.len() < COOKIE_END || buf[236..240] != MAGIC {
        return Cow::Borrowed(buf);
    }
    let Some(main) = tlvs(&buf[COOKIE_END..]) else {
        return Cow::Borrowed(buf);
    };
    let Some(ov) = main
        .iter()
        .find(|t| t.code == OPT_OVERLOAD)
        .and_then(|t| t.data.first().copied())
    else {
        return Cow::Borrowed(buf);
    };
    if !(1..=3).contains(&ov) {
        return Cow::Borrowed(buf);
    }
    let mut extra = Vec::new();
    for (bit, range) in [(1u8, FILE), (2u8, SNAME)] {
        if ov & bit != 0 {
            match tlvs(&buf[range]) {
                Some(t) => extra.extend(t),
                None => return Cow::Borrowed(buf),
            }
        }
    }
    let mut out = Vec::with_capacity(buf.len() + 192);
    out.extend_from_slice(&buf[..COOKIE_END]);
    if ov & 1 != 0 {
        out[FILE].fill(0);
    }
    if ov & 2 != 0 {
        out[SNAME].fill(0);
    }
    for t in main.iter().filter(|t| t.code != OPT_OVERLOAD).chain(&extra) {
        out.push(t.code);
        out.push(t.data.len() as u8);
        out.extend_from_slice(&t.data);
    }
    out.push(OPT_END);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply header with `file` text and the given options.
    fn message(file: &str, opts: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; COOKIE_END];
        b[0] = 2;
        b[1] = 1;
        b[2] = 6;
        b[4..8].copy_from_slice(&[1, 2, 3, 4]);
        b[FILE.start..FILE.start + file.len()].copy_from_slice(file.as_bytes());
        b[236..240].copy_from_slice(&MAGIC);
        for (c, d) in opts {
            b.push(*c);
            b.push(d.len() as u8);
            b.extend_from_slice(d);
        }
        b.push(OPT_END);
        b
    }

    /// All options of a message as the client sees them (through option 52).
    fn client_view(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let plain = unfold(b);
        tlvs(&plain[COOKIE_END..])
            .unwrap()
            .into_iter()
            .map(|t| (t.code, t.data.into_owned()))
            .collect()
    }

    #[test]
    fn max_len_follows_option_57() {
        assert_eq!(max_len_for(None), 548);
        assert_eq!(max_len_for(Some(300)), 548); // below the RFC minimum
        assert_eq!(max_len_for(Some(576)), 548);
        assert_eq!(max_len_for(Some(1000)), 972);
        assert_eq!(max_len_for(Some(65535)), 1472);
    }

    #[test]
    fn small_replies_are_untouched() {
        let b = message("undionly.kpxe", &[(53, vec![2]), (54, vec![10, 0, 0, 1])]);
        let f = fit(b.clone(), 548);
        assert_eq!((f.bytes, f.overload, f.dropped), (b, 0, 0));
    }

    #[test]
    fn overflow_moves_options_into_file_then_sname() {
        let url = "http://boot.example/".to_string() + &"x".repeat(150);
        let mut opts = vec![
            (53, vec![5]),
            (54, vec![10, 0, 0, 1]),
            (1, vec![255, 255, 255, 0]),
        ];
        opts.push((67, url.clone().into_bytes()));
        // vendor data that overflows the 312-octet options field
        for c in 200..203u8 {
            opts.push((c, vec![c; 60]));
        }
        let b = message("ipxe.efi", &opts);
        assert!(b.len() > 548);
        let f = fit(b, 548);
        assert!(f.bytes.len() <= 548, "{}", f.bytes.len());
        assert_eq!(f.dropped, 0);
        assert_ne!(f.overload & 1, 0, "file holds options");
        // file now holds options, not the boot file name
        assert_ne!(&f.bytes[FILE.start..FILE.start + 8], b"ipxe.efi");
        let seen = client_view(&f.bytes);
        assert_eq!(seen[0], (53, vec![5]));
        for (c, d) in &opts {
            assert!(seen.contains(&(*c, d.clone())), "option {c} lost");
        }
        assert_eq!(seen.iter().filter(|(c, _)| *c == 52).count(), 0);
        // the options field itself carries 52 = 1
        let main = tlvs(&f.bytes[COOKIE_END..]).unwrap();
        assert!(main.iter().any(|t| t.code == 52 && *t.data == [1]));

        // a bigger overflow uses sname too
        let mut more = opts.clone();
        for c in 210..212u8 {
            more.push((c, vec![c; 50]));
        }
        let f = fit(message("", &more), 548);
        assert_eq!((f.overload, f.dropped), (3, 0), "{}", f.bytes.len());
        assert!(f.bytes.len() <= 548);
        let seen = client_view(&f.bytes);
        for (c, d) in &more {
            assert!(seen.contains(&(*c, d.clone())), "option {c} lost");
        }
    }

    #[test]
    fn file_text_becomes_option_67_and_too_much_is_dropped() {
        let mut opts = vec![(53, vec![2])];
        for c in 200..210u8 {
            opts.push((c, vec![c; 100]));
        }
        let f = fit(message("undionly.kpxe", &opts), 548);
        assert!(f.bytes.len() <= 548);
        assert!(f.dropped > 0);
        let seen = client_view(&f.bytes);
        assert!(seen.contains(&(67, b"undionly.kpxe".to_vec())), "{seen:?}");
        assert!(seen.contains(&(53, vec![2])));
        // a larger option-57 limit keeps everything in the options field
        let f = fit(message("undionly.kpxe", &opts), max_len_for(Some(1500)));
        assert_eq!((f.overload, f.dropped), (0, 0));
    }

    #[test]
    fn split_long_option_keeps_its_order() {
        // option 43 in two pieces (RFC 3396) that cannot both stay in the options field
        let mut opts = vec![(53, vec![2]), (100, vec![1; 200])];
        opts.push((43, vec![0xa; 255]));
        opts.push((43, vec![0xb; 60]));
        let f = fit(message("", &opts), 548);
        let seen = client_view(&f.bytes);
        let pieces: Vec<u8> = seen
            .iter()
            .filter(|(c, _)| *c == 43)
            .map(|(_, d)| d[0])
            .collect();
        // whatever was kept is in order: a piece never precedes an earlier one
        assert!(pieces.windows(2).all(|w| w[0] <= w[1]), "{pieces:?}");
    }

    #[test]
    fn unfold_reads_overloaded_requests_and_leaves_others() {
        let mut b = message("", &[(53, vec![1]), (52, vec![3])]);
        b[FILE.start..FILE.start + 5].copy_from_slice(&[12, 3, b'a', b'b', b'c']);
        b[FILE.start + 5] = OPT_END;
        b[SNAME.start..SNAME.start + 4].copy_from_slice(&[93, 2, 0, 7]);
        b[SNAME.start + 4] = OPT_END;
        let seen = client_view(&b);
        assert_eq!(
            seen,
            vec![(53, vec![1]), (12, b"abc".to_vec()), (93, vec![0, 7])]
        );
        // malformed overload areas and junk come back unchanged
        let mut bad = b.clone();
        bad[FILE.start + 1] = 200;
        assert_eq!(&*unfold(&bad), &bad[..]);
        assert_eq!(&*unfold(&[1, 2, 3]), &[1, 2, 3][..]);
        let plain = message("x", &[(53, vec![1])]);
        assert!(matches!(unfold(&plain), Cow::Borrowed(_)));
    }
}
