//! The `storage` and `boot_device` sections: disks, raid, filesystems (with their
//! generated mount units), luks, files, directories, links and `trees`, and the
//! disk layouts `boot_device` stands for.

use super::*;

impl Tx<'_> {
    pub(super) fn storage(
        &mut self,
        s: &Storage,
        out: &mut Map<String, Value>,
        units: &mut Vec<Value>,
    ) {
        if let Some(d) = &s.disks {
            out.insert("disks".into(), pass(d));
        }
        if let Some(r) = &s.raid {
            out.insert("raid".into(), pass(r));
        }
        let mut files: Vec<Value> = Vec::new();
        let mut dirs: Vec<Value> = Vec::new();
        let mut links: Vec<Value> = Vec::new();
        for (i, f) in s.files.iter().flatten().enumerate() {
            let at = format!("storage.files[{i}]");
            let mut m = self.node(&f.path, f.overwrite, &f.user, &f.group);
            if let Some(c) = &f.contents {
                let v = self.resource(c, &format!("{at}.contents"));
                m.insert("contents".into(), v);
            }
            if let Some(a) = &f.append {
                let v: Vec<Value> = a
                    .iter()
                    .enumerate()
                    .map(|(n, r)| self.resource(r, &format!("{at}.append[{n}]")))
                    .collect();
                m.insert("append".into(), Value::Array(v));
            }
            put(&mut m, "mode", self.mode(&f.mode, &at));
            files.push(Value::Object(m));
        }
        for (i, d) in s.directories.iter().flatten().enumerate() {
            let at = format!("storage.directories[{i}]");
            let mut m = self.node(&d.path, d.overwrite, &d.user, &d.group);
            put(&mut m, "mode", self.mode(&d.mode, &at));
            dirs.push(Value::Object(m));
        }
        for l in s.links.iter().flatten() {
            let mut m = self.node(&l.path, l.overwrite, &l.user, &l.group);
            put(&mut m, "target", l.target.as_ref().map(|t| json!(t)));
            put(&mut m, "hard", l.hard.map(Value::Bool));
            links.push(Value::Object(m));
        }
        for (i, t) in s.trees.iter().flatten().enumerate() {
            self.tree(
                t,
                &format!("storage.trees[{i}]"),
                &mut files,
                &dirs,
                &mut links,
            );
        }
        if let Some(fs) = &s.filesystems {
            for (i, f) in fs.iter().enumerate() {
                if f.with_mount_unit == Some(true) {
                    let remote = s.luks.iter().flatten().any(|l| {
                        (f.device == format!("/dev/mapper/{}", l.name)
                            || f.device == format!("/dev/disk/by-id/dm-name-{}", l.name))
                            && l.clevis
                                .as_ref()
                                .and_then(|c| c.tang.as_ref())
                                .is_some_and(|t| !t.is_empty())
                    });
                    match Self::mount_unit(f, remote) {
                        Some(u) => units.push(u),
                        None => self.issue(
                            format!("storage.filesystems[{i}].with_mount_unit"),
                            "needs format and path (or format: swap) to generate a mount unit",
                        ),
                    }
                }
            }
            out.insert("filesystems".into(), pass(fs));
        }
        if !files.is_empty() {
            out.insert("files".into(), Value::Array(files));
        }
        if !dirs.is_empty() {
            out.insert("directories".into(), Value::Array(dirs));
        }
        if !links.is_empty() {
            out.insert("links".into(), Value::Array(links));
        }
        if let Some(l) = &s.luks {
            let mut v = Vec::new();
            for (i, x) in l.iter().enumerate() {
                v.push(self.luks(x, &format!("storage.luks[{i}]")));
            }
            out.insert("luks".into(), Value::Array(v));
        }
    }

    fn luks(&mut self, l: &Luks, at: &str) -> Value {
        self.need(
            l.discard.is_some(),
            &format!("{at}.discard"),
            IgnVersion::V3_4,
        );
        self.need(
            l.open_options.is_some(),
            &format!("{at}.open_options"),
            IgnVersion::V3_4,
        );
        self.need(l.cex.is_some(), &format!("{at}.cex"), IgnVersion::V3_5);
        for (j, t) in l
            .clevis
            .iter()
            .flat_map(|c| c.tang.iter().flatten())
            .enumerate()
        {
            self.need(
                t.advertisement.is_some(),
                &format!("{at}.clevis.tang[{j}].advertisement"),
                IgnVersion::V3_4,
            );
        }
        let mut m = Map::new();
        m.insert("name".into(), json!(l.name));
        put(&mut m, "device", l.device.as_ref().map(|d| json!(d)));
        if let Some(k) = &l.key_file {
            let v = self.resource(k, &format!("{at}.key_file"));
            m.insert("keyFile".into(), v);
        }
        put(&mut m, "label", l.label.as_ref().map(|d| json!(d)));
        put(&mut m, "uuid", l.uuid.as_ref().map(|d| json!(d)));
        put(&mut m, "options", l.options.as_ref().map(|d| json!(d)));
        put(&mut m, "wipeVolume", l.wipe_volume.map(Value::Bool));
        put(&mut m, "clevis", l.clevis.as_ref().map(pass));
        put(&mut m, "discard", l.discard.map(Value::Bool));
        put(
            &mut m,
            "openOptions",
            l.open_options.as_ref().map(|d| json!(d)),
        );
        put(&mut m, "cex", l.cex.as_ref().map(pass));
        Value::Object(m)
    }

    /// `storage.trees`: every file and symlink under `local` becomes a file (mode 0755
    /// if executable, else 0644) or a link under `path` (default `/`).
    fn tree(
        &mut self,
        t: &Tree,
        at: &str,
        files: &mut Vec<Value>,
        dirs: &[Value],
        links: &mut Vec<Value>,
    ) {
        if t.local.starts_with('/') || t.local.split('/').any(|s| s == "..") {
            self.issue(
                format!("{at}.local"),
                format!(
                    "local path {:?} must be relative to the files dir and stay inside it",
                    t.local
                ),
            );
            return;
        }
        if self.files.is_empty() {
            self.issue(format!("{at}.local"), "storage.trees needs a files dir");
            return;
        }
        let fd = self.files;
        match fd.get(&t.local) {
            Some(LocalEntry::Dir) => {}
            None if t.local.is_empty() || t.local == "." => {}
            _ => {
                self.issue(
                    format!("{at}.local"),
                    format!("{:?} is not a directory in the files dir", t.local),
                );
                return;
            }
        }
        let base = t.path.clone().unwrap_or_else(|| "/".to_string());
        if !base.starts_with('/') {
            self.issue(
                format!("{at}.path"),
                format!("path {base:?} must be absolute"),
            );
            return;
        }
        let base = base.trim_end_matches('/');
        let find = |list: &[Value], p: &str| list.iter().position(|x| x["path"] == p);
        for (rel, e) in fd.under(&t.local) {
            let dest = format!("{base}/{rel}");
            let exists = |files: &[Value], links: &[Value]| {
                find(files, &dest).is_some()
                    || find(links, &dest).is_some()
                    || find(dirs, &dest).is_some()
            };
            match e {
                LocalEntry::File { data, executable } => {
                    let (url, comp) = data_url(data, true);
                    let mode = if *executable { 0o755 } else { 0o644 };
                    match find(files, &dest) {
                        // An explicit entry without contents gets the tree's contents (butane).
                        Some(k) if files[k].pointer("/contents/source").is_none() => {
                            if let Value::Object(m) = &mut files[k] {
                                m.insert(
                                    "contents".into(),
                                    json!({ "compression": comp, "source": url }),
                                );
                                m.entry("mode").or_insert(json!(mode));
                            }
                        }
                        _ if exists(files, links) => {
                            self.issue(at, format!("a node already exists at {dest:?}"));
                        }
                        _ => files.push(json!({
                            "path": dest,
                            "contents": { "compression": comp, "source": url },
                            "mode": mode,
                        })),
                    }
                }
                LocalEntry::Symlink { target } => match find(links, &dest) {
                    Some(k) if files_target_missing(&links[k]) => {
                        if let Value::Object(m) = &mut links[k] {
                            m.insert("target".into(), json!(target));
                        }
                    }
                    _ if exists(files, links) => {
                        self.issue(at, format!("a node already exists at {dest:?}"));
                    }
                    _ => links.push(json!({ "path": dest, "target": target })),
                },
                LocalEntry::Dir => {}
            }
        }
    }

    /// The unit butane's `with_mount_unit` generates (same text as butane's template:
    /// no trailing newline; `_netdev` + `remote-fs.target` on a tang-bound LUKS device).
    fn mount_unit(f: &Filesystem, remote: bool) -> Option<Value> {
        let fmt = f.format.as_deref().filter(|f| !f.is_empty())?;
        let what = &f.device;
        let mut opts: Vec<&str> = f
            .mount_options
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if remote {
            opts.push("_netdev");
        }
        let options = if opts.is_empty() {
            String::new()
        } else {
            format!("\nOptions={}", opts.join(","))
        };
        if fmt == "swap" {
            let name = format!("{}.swap", systemd_escape_path(what));
            let c = format!("# Generated by Butane\n[Swap]\nWhat={what}{options}\n\n[Install]\nRequiredBy=swap.target");
            return Some(json!({ "name": name, "enabled": true, "contents": c }));
        }
        let path = f.path.as_deref()?;
        let dev = systemd_escape_path(what);
        let target = if remote {
            "remote-fs.target"
        } else {
            "local-fs.target"
        };
        let c = format!(
            "# Generated by Butane\n[Unit]\nRequires=systemd-fsck@{dev}.service\nAfter=systemd-fsck@{dev}.service\n\n\
             [Mount]\nWhere={path}\nWhat={what}\nType={fmt}{options}\n\n[Install]\nRequiredBy={target}"
        );
        Some(
            json!({ "name": format!("{}.mount", systemd_escape_path(path)), "enabled": true, "contents": c }),
        )
    }

    /// `boot_device`: LUKS-encrypted root and/or a mirrored boot disk, laid out like
    /// butane's fcos sugar (BIOS-BOOT 1 MiB on x86_64, EFI-SYSTEM 127 MiB, boot 384 MiB,
    /// root the rest, md RAID1 for boot and root).
    pub(super) fn boot_device(&mut self, b: &BootDevice, storage: &mut Map<String, Value>) {
        let layout = b.layout.as_deref().unwrap_or("x86_64");
        if !matches!(layout, "x86_64" | "aarch64" | "ppc64le") {
            self.issue(
                "boot_device.layout",
                format!("layout {layout:?} is not supported (supported: x86_64, aarch64, ppc64le)"),
            );
            return;
        }
        let mirror: Vec<String> = b
            .mirror
            .as_ref()
            .and_then(|m| m.devices.clone())
            .unwrap_or_default();
        if b.mirror.is_some() && mirror.len() < 2 {
            self.issue(
                "boot_device.mirror.devices",
                "a mirror needs at least two devices",
            );
            return;
        }
        let mut disks = Vec::new();
        let mut raid = Vec::new();
        let mut filesystems = Vec::new();
        let mut root_dev = "/dev/disk/by-partlabel/root".to_string();
        if !mirror.is_empty() {
            let mut boots = Vec::new();
            let mut roots = Vec::new();
            for (n, dev) in mirror.iter().enumerate() {
                let k = n + 1;
                let mut parts = Vec::new();
                // Same sizes and type GUIDs as butane's v1 layout (replicating the
                // CoreOS image), so the desugared partitions are never smaller.
                const RESERVED: &str = "8DA63339-0007-60C0-C436-083AC8230908";
                let reserved =
                    json!({"label": format!("reserved-{k}"), "sizeMiB": 1, "typeGuid": RESERVED});
                match layout {
                    "x86_64" => parts.push(json!({"label": format!("bios-{k}"), "sizeMiB": 1, "typeGuid": "21686148-6449-6E6F-744E-656564454649"})),
                    "ppc64le" => parts.push(json!({"label": format!("prep-{k}"), "sizeMiB": 4, "typeGuid": "9E1A2D38-C612-4316-AA26-8B49521E5A8B"})),
                    _ => parts.push(reserved.clone()),
                }
                if layout == "ppc64le" {
                    parts.push(reserved);
                } else {
                    parts.push(json!({"label": format!("esp-{k}"), "sizeMiB": 127, "typeGuid": "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"}));
                }
                parts.push(json!({"label": format!("boot-{k}"), "sizeMiB": 384}));
                parts.push(json!({"label": format!("root-{k}")}));
                disks.push(json!({"device": dev, "partitions": parts, "wipeTable": true}));
                boots.push(format!("/dev/disk/by-partlabel/boot-{k}"));
                roots.push(format!("/dev/disk/by-partlabel/root-{k}"));
                if layout != "ppc64le" {
                    filesystems.push(json!({"device": format!("/dev/disk/by-partlabel/esp-{k}"), "format": "vfat", "label": format!("esp-{k}"), "wipeFilesystem": true}));
                }
            }
            raid.push(json!({"devices": boots, "level": "raid1", "name": "md-boot", "options": ["--metadata=1.0"]}));
            raid.push(json!({"devices": roots, "level": "raid1", "name": "md-root"}));
            filesystems.push(json!({"device": "/dev/md/md-boot", "format": "ext4", "label": "boot", "wipeFilesystem": true}));
            root_dev = "/dev/md/md-root".to_string();
        }
        let mut luks = Vec::new();
        if let Some(l) = &b.luks {
            self.need(
                l.discard.is_some(),
                "boot_device.luks.discard",
                IgnVersion::V3_4,
            );
            self.need(l.cex.is_some(), "boot_device.luks.cex", IgnVersion::V3_5);
            if let Some(d) = &l.device {
                self.need(true, "boot_device.luks.device", IgnVersion::V3_5);
                if mirror.is_empty() {
                    root_dev = d.clone();
                }
            }
            for (j, t) in l.tang.iter().flatten().enumerate() {
                self.need(
                    t.advertisement.is_some(),
                    &format!("boot_device.luks.tang[{j}].advertisement"),
                    IgnVersion::V3_4,
                );
            }
            if l.tang.as_ref().is_none_or(Vec::is_empty) && l.tpm2 != Some(true) && l.cex.is_none()
            {
                self.issue("boot_device.luks", "needs tang servers, tpm2: true or cex");
            }
            let mut clevis = Map::new();
            put(&mut clevis, "tang", l.tang.as_ref().map(pass));
            put(&mut clevis, "threshold", l.threshold.map(|t| json!(t)));
            put(&mut clevis, "tpm2", l.tpm2.map(Value::Bool));
            let mut m = Map::new();
            if !clevis.is_empty() {
                m.insert("clevis".into(), Value::Object(clevis));
            }
            put(&mut m, "cex", l.cex.as_ref().map(pass));
            m.insert("device".into(), json!(root_dev));
            put(&mut m, "discard", l.discard.map(Value::Bool));
            m.insert("label".into(), json!("luks-root"));
            m.insert("name".into(), json!("root"));
            m.insert("wipeVolume".into(), json!(true));
            luks.push(Value::Object(m));
            root_dev = "/dev/mapper/root".to_string();
        }
        if !mirror.is_empty() || !luks.is_empty() {
            filesystems.push(json!({"device": root_dev, "format": "xfs", "label": "root", "wipeFilesystem": true}));
        }
        // The sugar is the parent and the user's own storage is merged onto it by key,
        // as butane does, so explicit entries can refine generated ones.
        let mut sugar = Map::new();
        append(&mut sugar, "disks", disks);
        append(&mut sugar, "raid", raid);
        append(&mut sugar, "filesystems", filesystems);
        append(&mut sugar, "luks", luks);
        let user = std::mem::take(storage);
        let merged = merge::merge(&json!({ "storage": sugar }), &json!({ "storage": user }));
        if let Some(Value::Object(m)) = merged.get("storage") {
            *storage = m.clone();
        }
    }
}

fn files_target_missing(link: &Value) -> bool {
    link.get("target")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
}

fn append(m: &mut Map<String, Value>, key: &str, v: Vec<Value>) {
    if v.is_empty() {
        return;
    }
    match m.get_mut(key) {
        Some(Value::Array(a)) => a.extend(v),
        _ => {
            m.insert(key.into(), Value::Array(v));
        }
    }
}
