//! Unit tests of the provisioning stream.

use super::*;

fn data(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| {
            if (i / 100_000) % 3 == 0 {
                0
            } else {
                (i * 7 % 251) as u8
            }
        })
        .collect()
}

#[test]
fn library_round_trip_and_resume_from_a_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let raw = d.path().join("raw");
    let v = data(5 * (1 << 20) + 333);
    std::fs::write(&raw, &v).unwrap();
    let img = d.path().join("img.zst");
    let opts = crate::pack::PackOptions {
        frame_size: 1 << 20,
        level: 1,
        threads: 2,
    };
    let m = crate::pack::pack(&raw, &img, &crate::pack::manifest_path(&img), &opts).unwrap();
    let out = d.path().join("out");
    let o = provision(&Options::new(img.to_str().unwrap(), &out)).unwrap();
    assert_eq!(o.resumed_from, 0);
    assert_eq!(std::fs::read(&out).unwrap(), v);

    // A checkpoint saying 3 frames are done (with the matching midstate) resumes at frame 3.
    let mut h = ResumableSha256::new();
    h.update(&v[..3 << 20]);
    let c = Checkpoint {
        version: 1,
        image_sha256: m.sha256.clone(),
        chunk_size: 1 << 20,
        chunks_done: 3,
        hash_state: h.save(),
        target_fresh: false,
    };
    let ck = d.path().join("out.bootplane-checkpoint");
    std::fs::write(&ck, serde_json::to_vec(&c).unwrap()).unwrap();
    let o = provision(&Options::new(img.to_str().unwrap(), &out)).unwrap();
    assert_eq!(o.resumed_from, 3 << 20);
    assert_eq!(std::fs::read(&out).unwrap(), v);
    assert!(!ck.exists());

    // A target changed since the checkpoint is caught before resuming (23), the
    // checkpoint is dropped and the next run starts over.
    std::fs::write(&ck, serde_json::to_vec(&c).unwrap()).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
        f.write_all_at(b"tampered", (2 << 20) + 5).unwrap();
    }
    let e = provision(&Options::new(img.to_str().unwrap(), &out)).unwrap_err();
    assert_eq!(e.exit_code(), 23, "{e}");
    assert!(std::fs::read(&out).unwrap()[..1 << 20]
        .iter()
        .all(|&b| b == 0));
    assert!(
        !ck.exists(),
        "a checkpoint that does not match the target is dropped"
    );
    let o = provision(&Options::new(img.to_str().unwrap(), &out)).unwrap();
    assert_eq!(o.resumed_from, 0);
    assert_eq!(std::fs::read(&out).unwrap(), v);

    // A checkpoint whose midstate is wrong (not what the target holds) is caught by
    // the read-back too (23), before anything is written.
    let mut c = c;
    let mut h = ResumableSha256::new();
    h.update(&vec![1u8; 3 << 20]);
    c.hash_state = h.save();
    std::fs::write(&ck, serde_json::to_vec(&c).unwrap()).unwrap();
    let e = provision(&Options::new(img.to_str().unwrap(), &out)).unwrap_err();
    assert_eq!(e.exit_code(), 23, "{e}");
    assert!(std::fs::read(&out).unwrap()[..1 << 20]
        .iter()
        .all(|&b| b == 0));
    assert!(
        !ck.exists(),
        "a checkpoint that led to a mismatch is dropped"
    );
}

#[test]
fn device_interrupts_are_summed_per_cpu_from_the_numbered_lines() {
    let text = "           CPU0       CPU1       \n 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n 36:          0    3718021 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n 39:      20394          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\nNMI:          0          0   Non-maskable interrupts\nLOC:   16915165   17618640   Local timer interrupts\n";
    assert_eq!(super::place::device_interrupts(text), [20395, 3718021]);
    assert!(super::place::device_interrupts("").is_empty());
}

#[test]
fn a_checkpoint_on_the_target_resumes_and_is_replaced_by_the_image() {
    let d = tempfile::tempdir().unwrap();
    let raw = d.path().join("raw");
    let v = data(5 * (1 << 20) + 333);
    std::fs::write(&raw, &v).unwrap();
    let img = d.path().join("img.zst");
    let opts = crate::pack::PackOptions {
        frame_size: 1 << 20,
        level: 1,
        threads: 2,
    };
    let m = crate::pack::pack(&raw, &img, &crate::pack::manifest_path(&img), &opts).unwrap();
    let out = d.path().join("out");
    let mut o = Options::new(img.to_str().unwrap(), &out);
    o.checkpoint_on_target = true;
    assert_eq!(provision(&o).unwrap().resumed_from, 0);
    assert_eq!(std::fs::read(&out).unwrap(), v);

    // What an interrupted run leaves: the head zero but for the checkpoint block.
    let mut h = ResumableSha256::new();
    h.update(&v[..3 << 20]);
    let c = Checkpoint {
        version: 1,
        image_sha256: m.sha256.clone(),
        chunk_size: 1 << 20,
        chunks_done: 3,
        hash_state: h.save(),
        target_fresh: false,
    };
    let leave_interrupted = |c: &Checkpoint| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
        f.write_all_at(&vec![0u8; 1 << 20], 0).unwrap();
        let b = checkpoint::target_block(&serde_json::to_vec(c).unwrap()).unwrap();
        f.write_all_at(&b.as_slice()[..4096], TARGET_CKPT_OFF)
            .unwrap();
    };
    leave_interrupted(&c);
    assert_eq!(provision(&o).unwrap().resumed_from, 3 << 20);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        v,
        "the image replaced the block"
    );
    assert!(!d.path().join("out.bootplane-checkpoint").exists());

    // A target changed since: caught (23), the whole first MiB zero, no block left.
    leave_interrupted(&c);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
        f.write_all_at(b"tampered", (2 << 20) + 5).unwrap();
    }
    let e = provision(&o).unwrap_err();
    assert_eq!(e.exit_code(), 23, "{e}");
    assert!(std::fs::read(&out).unwrap()[..1 << 20]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(provision(&o).unwrap().resumed_from, 0);
    assert_eq!(std::fs::read(&out).unwrap(), v);
}
