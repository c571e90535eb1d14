//! End-to-end tests of `bootplane image pack` and `bootplane provision` with the real
//! binary, the `zstd` CLI, loop block devices, `mkfs.ext4`/`mount`, and an HTTP source.

use crate::support;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::bootplane::bin;
use support::data::sha256_hex;
use support::image::*;
use support::process::*;

const MIB: usize = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn packed_round_trip_to_files_at_odd_sizes() {
    let d = tempfile::tempdir().unwrap();
    for (size, frame) in [
        (700_001usize, 1u64),
        (4 * MIB + 1, 4),
        (9 * MIB + 4097, 1),
        (13 * MIB - 511, 4),
    ] {
        let data = mixed(size, size as u64);
        let raw = d.path().join(format!("raw{size}"));
        let img = d.path().join(format!("img{size}.bpz"));
        let out = d.path().join(format!("out{size}"));
        fs::write(&raw, &data).unwrap();
        pack(&raw, &img, frame);
        for fsha in ["on", "off"] {
            let _ = fs::remove_file(&out);
            let (code, lines) = provision(&[
                "--source",
                s(&img),
                "--target",
                s(&out),
                "--frame-sha256",
                fsha,
            ]);
            assert_eq!(code, 0, "size {size}: {lines:?}");
            let done = last_stage(&lines);
            assert_eq!(done["stage"], "done");
            assert_eq!(done["sha256"], sha256_hex(&data));
            assert_eq!(done["bytes"], size as u64);
            assert_eq!(
                fs::read(&out).unwrap(),
                data,
                "size {size} frame {frame} MiB differs"
            );
            assert!(!Path::new(&format!("{}.bootplane-checkpoint", s(&out))).exists());
        }
    }
}

#[test]
fn zstd_cli_and_raw_images_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(6 * MIB + 777, 7);
    let raw = d.path().join("raw");
    fs::write(&raw, &data).unwrap();
    let sha = sha256_hex(&data);
    // Single-frame .zst from the zstd CLI, and a multi-frame one (two CLI outputs concatenated).
    let single = d.path().join("single.zst");
    tool("zstd", &["-q", "-f", s(&raw), "-o", s(&single)]);
    let multi = d.path().join("multi.zst");
    let half = d.path().join("half");
    fs::write(&half, &data[..3 * MIB + 5]).unwrap();
    let rest = d.path().join("rest");
    fs::write(&rest, &data[3 * MIB + 5..]).unwrap();
    let a = tool("zstd", &["-q", "-c", s(&half)]).stdout;
    let b = tool("zstd", &["-q", "-c", "--no-check", s(&rest)]).stdout;
    fs::write(&multi, [a, b].concat()).unwrap();
    for src in [&single, &multi, &raw] {
        let out = d.path().join("out");
        let _ = fs::remove_file(&out);
        let (code, lines) = provision(&["--source", s(src), "--target", s(&out), "--sha256", &sha]);
        assert_eq!(code, 0, "{src:?}: {lines:?}");
        assert_eq!(fs::read(&out).unwrap(), data, "{src:?}");
    }
    // Without a manifest the checksum is required.
    let (code, _) = provision(&["--source", s(&single), "--target", s(&d.path().join("o2"))]);
    assert_eq!(code, 2);
}

#[test]
fn loop_device_round_trip_keeps_bytes_past_the_image() {
    let d = tempfile::tempdir().unwrap();
    let backing = d.path().join("disk");
    fs::write(&backing, vec![0x5Au8; 16 * MIB]).unwrap();
    let lo = Loop::new(&backing);
    let data = mixed(9 * MIB + 1000, 11);
    let (raw, img) = write_and_pack(d.path(), &data, 4);
    let ck = d.path().join("ckpt");
    let (code, lines) = provision(&[
        "--source",
        s(&img),
        "--target",
        s(&lo.dev),
        "--checkpoint",
        s(&ck),
    ]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(last_stage(&lines)["direct"], true);
    let disk = fs::read(&lo.dev).unwrap();
    assert_eq!(&disk[..data.len()], &data[..]);
    assert!(
        disk[data.len()..].iter().all(|&b| b == 0x5A),
        "bytes after the image were changed"
    );

    // A zstd CLI image and a raw image onto the same device.
    let zst = d.path().join("img.zst");
    tool("zstd", &["-q", "-f", s(&raw), "-o", s(&zst)]);
    for src in [&zst, &raw] {
        let (code, lines) = provision(&[
            "--source",
            s(src),
            "--target",
            s(&lo.dev),
            "--sha256",
            &sha256_hex(&data),
            "--checkpoint",
            s(&ck),
        ]);
        assert_eq!(code, 0, "{lines:?}");
        assert_eq!(&fs::read(&lo.dev).unwrap()[..data.len()], &data[..]);
    }

    // Too small: a 20 MiB image does not go onto a 16 MiB device, which stays untouched.
    let big = d.path().join("big");
    fs::write(&big, mixed(20 * MIB, 3)).unwrap();
    let bigimg = d.path().join("big.bpz");
    pack(&big, &bigimg, 4);
    let (code, lines) = provision(&[
        "--source",
        s(&bigimg),
        "--target",
        s(&lo.dev),
        "--checkpoint",
        s(&ck),
    ]);
    assert_eq!(code, 21, "{lines:?}");
    assert_eq!(last_stage(&lines)["class"], "too_small");
    assert_eq!(&fs::read(&lo.dev).unwrap()[..data.len()], &data[..]);

    // --zero-skip on a device: all-zero frames become BLKZEROOUT over old non-zero data.
    fs::write(&lo.dev, vec![0x77u8; 16 * MIB]).unwrap();
    let mut z = mixed(10 * MIB + 100, 12);
    z[2 * MIB..7 * MIB].fill(0);
    let zraw = d.path().join("zraw");
    fs::write(&zraw, &z).unwrap();
    let zimg = d.path().join("z.bpz");
    pack(&zraw, &zimg, 1);
    let (code, lines) = provision(&[
        "--source",
        s(&zimg),
        "--target",
        s(&lo.dev),
        "--checkpoint",
        s(&ck),
        "--zero-skip",
    ]);
    assert_eq!(code, 0, "{lines:?}");
    let disk = fs::read(&lo.dev).unwrap();
    assert_eq!(&disk[..z.len()], &z[..]);
    assert!(disk[z.len()..].iter().all(|&b| b == 0x77));
}

#[test]
fn mounted_or_exclusively_held_device_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let backing = d.path().join("disk");
    fs::write(&backing, vec![0u8; 32 * MIB]).unwrap();
    let lo = Loop::new(&backing);
    let data = mixed(3 * MIB + 5, 5);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let ck = d.path().join("ckpt");

    // Held open with O_EXCL (as a mounted filesystem or another provisioner would).
    {
        let _held = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&lo.dev)
            .unwrap();
        let (code, lines) = provision(&[
            "--source",
            s(&img),
            "--target",
            s(&lo.dev),
            "--checkpoint",
            s(&ck),
        ]);
        assert_eq!(code, 20, "{lines:?}");
        assert_eq!(last_stage(&lines)["class"], "target_busy");
    }

    // Mounted.
    tool("mkfs.ext4", &["-q", "-F", s(&lo.dev)]);
    // ext4 leaves the first 1 KiB (boot block) alone: mark it to see whether we write there.
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&lo.dev).unwrap();
        f.write_all_at(&[0xAA; 1024], 0).unwrap();
        f.sync_all().unwrap();
    }
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    tool("mount", &[s(&lo.dev), s(&mnt)]);
    let m = Mount { dir: mnt.clone() };
    let (code, lines) = provision(&[
        "--source",
        s(&img),
        "--target",
        s(&lo.dev),
        "--checkpoint",
        s(&ck),
    ]);
    assert_eq!(code, 20, "{lines:?}");
    assert!(
        last_stage(&lines)["error"]
            .as_str()
            .unwrap()
            .contains("mounted"),
        "{lines:?}"
    );
    assert!(
        fs::read(&lo.dev).unwrap()[..1024]
            .iter()
            .all(|&b| b == 0xAA),
        "a refused target was written"
    );
    drop(m);
}

fn prefilled(path: &Path, len: usize) {
    fs::write(path, vec![0xAAu8; len]).unwrap();
}

#[test]
fn corrupt_frames_fail_with_the_first_mib_zeroed() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(12 * MIB + 3, 21);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(format!("{}.manifest.json", s(&img))).unwrap()).unwrap();
    let frames = manifest["frames"].as_array().unwrap();
    let packed = fs::read(&img).unwrap();
    for (fi, fsha) in [
        (0usize, "on"),
        (5, "off"),
        (5, "on"),
        (frames.len() - 1, "off"),
    ] {
        let f = &frames[fi];
        let (off, len) = (
            f["offset"].as_u64().unwrap() as usize,
            f["compressed_size"].as_u64().unwrap() as usize,
        );
        let mut bad = packed.clone();
        bad[off + len / 2] ^= 0x10;
        let badimg = d.path().join("bad.bpz");
        fs::write(&badimg, &bad).unwrap();
        fs::copy(
            format!("{}.manifest.json", s(&img)),
            format!("{}.manifest.json", s(&badimg)),
        )
        .unwrap();
        let out = d.path().join("out");
        prefilled(&out, data.len());
        let (code, lines) = provision(&[
            "--source",
            s(&badimg),
            "--target",
            s(&out),
            "--frame-sha256",
            fsha,
        ]);
        assert_eq!(code, 13, "frame {fi}: {lines:?}");
        assert_eq!(last_stage(&lines)["class"], "integrity");
        assert!(head_is_zero(&out, MIB), "frame {fi}: first MiB not zeroed");
    }
    // A raw image that differs from the expected checksum by one bit.
    let mut flipped = data.clone();
    flipped[7 * MIB + 3] ^= 1;
    let fr = d.path().join("flipped");
    fs::write(&fr, &flipped).unwrap();
    let out = d.path().join("out");
    prefilled(&out, data.len());
    let (code, _) = provision(&[
        "--source",
        s(&fr),
        "--target",
        s(&out),
        "--sha256",
        &sha256_hex(&data),
    ]);
    assert_eq!(code, 13);
    assert!(head_is_zero(&out, MIB));
    // A manifest for another image than --sha256 names.
    let (code, lines) = provision(&[
        "--source",
        s(&img),
        "--target",
        s(&out),
        "--sha256",
        &"ab".repeat(32),
    ]);
    assert_eq!(code, 14, "{lines:?}");
}

#[test]
fn truncated_source_and_trailing_garbage_have_their_own_codes() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(6 * MIB + 9, 33);
    let raw = d.path().join("raw");
    fs::write(&raw, &data).unwrap();
    let sha = sha256_hex(&data);
    let img = d.path().join("img.bpz");
    pack(&raw, &img, 1);
    let zst = d.path().join("img.zst");
    tool("zstd", &["-q", "-f", s(&raw), "-o", s(&zst)]);
    let packed = fs::read(&img).unwrap();
    let plain = fs::read(&zst).unwrap();
    let m = format!("{}.manifest.json", s(&img));
    let cases: Vec<(&str, Vec<u8>, bool, i32)> = vec![
        (
            "packed-truncated",
            packed[..packed.len() / 2].to_vec(),
            true,
            11,
        ),
        (
            "packed-trailing",
            [packed.clone(), b"garbage!".to_vec()].concat(),
            true,
            12,
        ),
        (
            "zstd-truncated",
            plain[..plain.len() - 100].to_vec(),
            false,
            11,
        ),
        (
            "zstd-trailing",
            [plain.clone(), b"garbage!".to_vec()].concat(),
            false,
            12,
        ),
    ];
    for (name, bytes, with_manifest, want) in cases {
        let src = d.path().join(name);
        fs::write(&src, bytes).unwrap();
        let out = d.path().join("out");
        prefilled(&out, data.len());
        let mut args = vec!["--source", s(&src), "--target", s(&out), "--sha256", &sha];
        if with_manifest {
            args.extend(["--manifest", &m]);
        }
        let (code, lines) = provision(&args);
        assert_eq!(code, want, "{name}: {lines:?}");
        assert!(head_is_zero(&out, MIB), "{name}: first MiB not zeroed");
    }
}

#[test]
fn too_small_file_target_is_refused_untouched() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(5 * MIB + 1, 44);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let out = d.path().join("small");
    prefilled(&out, 2 * MIB);
    let (code, lines) = provision(&["--source", s(&img), "--target", s(&out)]);
    assert_eq!(code, 21, "{lines:?}");
    assert!(fs::read(&out).unwrap().iter().all(|&b| b == 0xAA));
}

/// Start a rate-limited copy of `source` to `out` (with `extra` arguments), SIGKILL it
/// once its checkpoint covers at least `frames` frames; returns the checkpoint path.
fn kill_after_checkpoint(source: &str, extra: &[&str], out: &Path, frames: u64) -> String {
    let ck = format!("{}.bootplane-checkpoint", s(out));
    let mut child = Command::new(bin())
        .args(["provision", "--source", source, "--target", s(out)])
        .args(extra)
        .args(["--max-rate", "6000000", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(b) = fs::read(&ck) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) {
                if v["chunks_done"].as_u64().unwrap_or(0) >= frames {
                    break;
                }
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "copy finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "no checkpoint within 60s");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    ck
}

/// Start a rate-limited copy, SIGKILL it after a checkpoint, check the head is zero,
/// then rerun and check it resumed and produced an identical target.
fn kill_and_resume(source: &str, raw: &[u8], out: &Path) {
    let ck = kill_after_checkpoint(source, &[], out, 3);
    assert!(head_is_zero(out, MIB), "first MiB not zero after kill -9");
    assert_ne!(fs::read(out).unwrap(), raw);
    let (code, lines) = provision(&["--source", source, "--target", s(out)]);
    assert_eq!(code, 0, "{lines:?}");
    assert!(lines.iter().any(|l| l["stage"] == "resume"), "{lines:?}");
    let resumed = last_stage(&lines)["resumed_from"].as_u64().unwrap();
    assert!(resumed >= 3 * MIB as u64, "resumed from {resumed}");
    assert_eq!(fs::read(out).unwrap(), raw);
    assert!(!Path::new(&ck).exists());
}

#[test]
fn kill_9_mid_copy_then_resume_from_file_and_http() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(40 * MIB + 123, 55);
    let (raw, img) = write_and_pack(d.path(), &data, 1);
    kill_and_resume(s(&img), &data, &d.path().join("out-file"));
    let srv = http_server(d.path().to_path_buf());
    kill_and_resume(
        &format!("{}/img.bpz", srv.base),
        &data,
        &d.path().join("out-http"),
    );
    // A raw source resumes too (whole-image checksum only).
    let sha = sha256_hex(&data);
    let out = d.path().join("out-raw");
    kill_after_checkpoint(s(&raw), &["--sha256", &sha], &out, 1);
    let (code, lines) = provision(&["--source", s(&raw), "--target", s(&out), "--sha256", &sha]);
    assert_eq!(code, 0, "{lines:?}");
    assert!(last_stage(&lines)["resumed_from"].as_u64().unwrap() > 0);
    assert_eq!(fs::read(&out).unwrap(), data);
}

#[test]
fn http_source_round_trip_and_errors() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(5 * MIB + 31, 66);
    let raw = d.path().join("raw");
    fs::write(&raw, &data).unwrap();
    pack(&raw, &d.path().join("img.bpz"), 4);
    let srv = http_server(d.path().to_path_buf());
    let out = d.path().join("out");
    let (code, lines) = provision(&[
        "--source",
        &format!("{}/img.bpz", srv.base),
        "--target",
        s(&out),
    ]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(fs::read(&out).unwrap(), data);
    let (code, _) = provision(&[
        "--source",
        &format!("{}/missing.bpz", srv.base),
        "--target",
        s(&d.path().join("o2")),
    ]);
    assert_eq!(code, 10);
    let (code, _) = provision(&[
        "--source",
        "/nonexistent/image",
        "--target",
        s(&d.path().join("o3")),
        "--sha256",
        &"00".repeat(32),
    ]);
    assert_eq!(code, 10);
}

#[test]
fn zero_skip_on_a_new_file_gives_the_same_bytes() {
    let d = tempfile::tempdir().unwrap();
    let mut data = mixed(9 * MIB + 17, 77);
    data[2 * MIB..6 * MIB].fill(0);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let out = d.path().join("out");
    let (code, lines) = provision(&["--source", s(&img), "--target", s(&out), "--zero-skip"]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(fs::read(&out).unwrap(), data);
}

/// Bytes changed on the target between the kill and the resume, inside what the
/// checkpoint covers, are caught even with `--trust-checkpoint`: the resume fails
/// (checkpoint error) with the first MiB still zero, and the next run copies everything
/// again and ends with the right image.
#[test]
fn trusted_checkpoint_is_still_checked_against_the_target() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(24 * MIB + 77, 91);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let out = d.path().join("out");
    let ck = kill_after_checkpoint(s(&img), &[], &out, 4);
    // Change two bytes well inside the covered range (past the held first MiB).
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&out)
            .unwrap();
        let off = 2 * MIB as u64 + 4097;
        let mut b = [0u8; 2];
        f.read_at(&mut b, off).unwrap();
        f.write_at(&[!b[0], !b[1]], off).unwrap();
    }
    let (code, lines) = provision(&[
        "--source",
        s(&img),
        "--target",
        s(&out),
        "--trust-checkpoint",
    ]);
    let copied = fs::read(&out).unwrap();
    assert!(
        code != 0 || copied == data,
        "resume trusted a checkpoint the target no longer matches and exited 0 with a wrong image: {lines:?}"
    );
    assert!(
        head_is_zero(&out, MIB) || copied == data,
        "first MiB written over a target whose bytes were not verified"
    );
    assert_eq!(code, 23, "checkpoint error expected: {lines:?}");
    assert!(!Path::new(&ck).exists(), "mismatching checkpoint kept");
    // The next run starts over and ends with the right image.
    let (code, lines) = provision(&["--source", s(&img), "--target", s(&out)]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(last_stage(&lines)["resumed_from"].as_u64(), Some(0));
    assert_eq!(fs::read(&out).unwrap(), data);
    // The flag is accepted (old job definitions still run) and said to be ignored.
    let o = run_cmd(
        Command::new(bin()).args([
            "provision",
            "--source",
            s(&img),
            "--target",
            s(&out),
            "--trust-checkpoint",
        ]),
        120,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--trust-checkpoint is ignored"),
        "no warning: {err}"
    );
}

/// The checkpoint is never written through a symlink: a link at its temporary path (or
/// at the checkpoint path itself) pointing at a victim file makes provision refuse with
/// a clear error, and the victim is unchanged.
#[test]
fn checkpoint_paths_that_are_symlinks_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(12 * MIB + 5, 17);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let victim = d.path().join("victim");
    let victim_bytes = b"precious root-owned data\n".repeat(100);
    fs::write(&victim, &victim_bytes).unwrap();
    let ckdir = d.path().join("ck");
    fs::create_dir(&ckdir).unwrap();
    let ck = ckdir.join("bootplane-loop2.checkpoint");
    for (what, link) in [
        (
            "temporary file",
            ckdir.join("bootplane-loop2.checkpoint.tmp"),
        ),
        ("checkpoint", ck.clone()),
    ] {
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let out = d.path().join(format!("out-{}", what.len()));
        // Rate-limited to 3 s, so an unprotected run writes its checkpoint at least once.
        let o = run_cmd(
            Command::new(bin()).args([
                "provision",
                "--source",
                s(&img),
                "--target",
                s(&out),
                "--checkpoint",
                s(&ck),
                "--max-rate",
                "4000000",
                "-q",
            ]),
            120,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        let now = fs::read(&victim).unwrap();
        assert!(
            now == victim_bytes,
            "{what} symlink followed: victim rewritten to {:?} (exit {:?}, {err})",
            String::from_utf8_lossy(&now[..now.len().min(60)]),
            o.status.code()
        );
        assert_eq!(o.status.code(), Some(23), "{what}: {err}");
        assert!(err.contains("symlink"), "{what}: {err}");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{what}: link replaced"
        );
        fs::remove_file(&link).unwrap();
    }
}

/// The checkpoint's temporary file has a name of its own: a file of the operator's
/// next to the target (`disk.img.tmp` for `disk.img`) is neither removed nor rewritten.
#[test]
fn a_file_next_to_the_target_is_not_taken_for_the_checkpoint_tmp() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(3 * MIB + 5, 23);
    let (_, img) = write_and_pack(d.path(), &data, 1);
    let out = d.path().join("disk.img");
    let mine = d.path().join("disk.img.tmp");
    fs::write(&mine, b"the operator's file\n").unwrap();
    let (code, lines) = provision(&["--source", s(&img), "--target", s(&out)]);
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(fs::read(&out).unwrap(), data);
    assert_eq!(
        fs::read(&mine).ok().as_deref(),
        Some(&b"the operator's file\n"[..]),
        "disk.img.tmp removed or rewritten"
    );
}

/// `--no-follow-target` (what the appliance's job runner passes with the path it
/// resolved): a target that is a symbolic link is refused (usage, 2) and what it points
/// at is untouched, whether it exists or not; a plain file is written as usual.
#[test]
fn no_follow_target_refuses_a_symlink() {
    let d = tempfile::tempdir().unwrap();
    let data = mixed(MIB + 3, 45);
    let raw = d.path().join("raw");
    fs::write(&raw, &data).unwrap();
    let sha = sha256_hex(&data);
    let victim = d.path().join("victim");
    prefilled(&victim, 2 * MIB);
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let dangling = d.path().join("dangling");
    let planted = d.path().join("planted");
    std::os::unix::fs::symlink(&planted, &dangling).unwrap();
    for t in [&link, &dangling] {
        let args = ["--source", s(&raw), "--target", s(t), "--sha256", &sha];
        let (code, lines) = provision(&[&args[..], &["--no-follow-target"]].concat());
        assert_eq!(code, 2, "{t:?}: {lines:?}");
    }
    assert!(fs::read(&victim).unwrap().iter().all(|&b| b == 0xAA));
    assert!(!planted.exists());
    let out = d.path().join("out");
    let args = ["--source", s(&raw), "--target", s(&out), "--sha256", &sha];
    let (code, lines) = provision(&[&args[..], &["--no-follow-target"]].concat());
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(fs::read(&out).unwrap(), data);
}
