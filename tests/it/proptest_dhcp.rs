//! Property test of the DHCP codec with option overload (`dhcp::core::encode`,
//! `dhcp::overload::fit`, `dhcp::core::decode` which unfolds option 52): a reply with
//! random options, fitted into a random client maximum message size, decodes back to
//! the same options (none lost beyond those counted as dropped), and the fitted reply
//! is never longer than the limit.

use bootplane::dhcp::core::{decode, encode};
use bootplane::dhcp::overload::{fit, MIN_MESSAGE_LEN};
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode, UnknownOption};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fitted_replies_decode_to_the_same_options(
        // Site-specific codes (224-254): carried as opaque bytes by dhcproto (which
        // drops a zero-length unknown option when decoding, so lengths start at 1).
        opts in proptest::collection::btree_map(224u8..=254, proptest::collection::vec(any::<u8>(), 1..120), 0..12),
        max_len in MIN_MESSAGE_LEN..1472,
        file in "[a-z./]{0,40}",
    ) {
        let mut m = Message::default();
        m.set_chaddr(&[0x52, 0x54, 0, 0xab, 0xcd, 0xef]);
        m.set_fname_str(&file);
        m.opts_mut().insert(DhcpOption::MessageType(MessageType::Offer));
        for (code, data) in &opts {
            m.opts_mut().insert(DhcpOption::Unknown(UnknownOption::new(OptionCode::from(*code), data.clone())));
        }
        let wire = encode(&m).expect("encodes");
        let f = fit(wire.clone(), max_len);
        prop_assert!(f.bytes.len() <= max_len, "{} > {}", f.bytes.len(), max_len);
        if wire.len() <= max_len {
            // Nothing to fit: the reply goes out as encoded.
            prop_assert!(f.bytes == wire && f.dropped == 0 && f.overload == 0);
        }
        let back = decode(&f.bytes).expect("a fitted reply decodes");
        let mut missing = 0;
        for (code, data) in &opts {
            match back.opts().get(OptionCode::from(*code)) {
                Some(DhcpOption::Unknown(u)) => prop_assert_eq!(u.data(), &data[..], "option {}", code),
                Some(other) => prop_assert!(false, "option {code} came back as {other:?}"),
                None => missing += 1,
            }
        }
        // `dropped` counts TLVs (the pieces of a long option, and the option 67/66 that
        // carries the text of a reused `file`/`sname`), so it bounds the options lost.
        prop_assert!(missing <= f.dropped, "{missing} options lost, {} counted as dropped", f.dropped);
        prop_assert!(matches!(back.opts().get(OptionCode::MessageType), Some(DhcpOption::MessageType(MessageType::Offer))));
        if f.overload & 1 == 0 {
            let name = back.fname_str().and_then(Result::ok).unwrap_or("").trim_end_matches('\0');
            prop_assert_eq!(name, file.as_str());
        }
    }
}
