//! Fuzz the provisioning job's progress lines (`provision::progress::parse_line`, fed
//! every stderr line of `bootplane provision`) folded into `Progress` as the job
//! runners do. Checks: counts are never negative or NaN-derived, rates finite, the
//! result serializes (it is written to the job's status).
#![no_main]

use bootplane::provision::progress::{parse_line, Line, Progress};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut p = Progress::default();
    for line in text.split('\n').take(256) {
        let l = parse_line(line);
        match &l {
            Line::Text(t) => assert!(!t.is_empty() && t.trim() == t),
            Line::Empty => assert!(line.trim().is_empty()),
            Line::Progress { rate, .. } => {
                assert!(rate.is_none_or(|r| r.is_finite() && r >= 0.0));
            }
        }
        let _ = p.apply(&l);
    }
    assert!(p.rate.is_none_or(|r| r.is_finite() && r >= 0.0));
    let j = serde_json::to_string(&p).expect("progress serializes");
    let back: Progress = serde_json::from_str(&j).expect("progress reparses");
    assert_eq!(back.bytes, p.bytes);
    assert_eq!(back.total, p.total);
});
