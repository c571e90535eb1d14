//! "Require a tool": a test that drives a real program fails (never skips) when it is
//! missing, with a message naming the Debian package to install. Every package named
//! here is in scripts/test-packages.txt, which scripts/test.sh installs, or is on every
//! machine that builds the crate (coreutils, libc-bin, dpkg, apt, and gcc as the
//! linker). A tool missing from the table fails the test too, saying so.

use std::path::Path;

/// The Debian package that ships `tool`; None for a tool this table does not know.
pub fn package_of(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "ip" | "tc" => "iproute2",
        "curl" => "curl",
        "chromium" => "chromium",
        "chromedriver" => "chromium-driver",
        "wget" => "wget",
        "busybox" => "busybox",
        "dhclient" => "isc-dhcp-client",
        "dnsmasq" => "dnsmasq-base",
        "tftp" => "tftp-hpa",
        "in.tftpd" => "tftpd-hpa",
        "atftp" => "atftp",
        "nft" => "nftables",
        "ganesha.nfsd" => "nfs-ganesha",
        "rpcbind" => "rpcbind",
        "nfs-cat" | "nfs-ls" | "nfs-cp" => "libnfs-utils",
        "unshare" => "util-linux",
        "losetup" | "mount" | "umount" => "mount",
        "mkfs.ext4" => "e2fsprogs",
        "mkfs.xfs" => "xfsprogs",
        "mkfs.vfat" => "dosfstools",
        "mcopy" | "mtype" | "mdir" => "mtools",
        "sgdisk" => "gdisk",
        "wipefs" | "blkid" | "blkdiscard" | "partx" => "util-linux",
        "cmp" => "diffutils",
        "zstd" => "zstd",
        "bmaptool" => "bmap-tools",
        "openssl" => "openssl",
        "nginx" => "nginx-light",
        "wrk" => "wrk",
        "kea-dhcp4" => "kea-dhcp4-server",
        "perfdhcp" => "kea-admin",
        "ignition" | "ignition-validate" => "ignition",
        "qemu-system-x86_64" => "qemu-system-x86",
        "libvirtd" => "libvirt-daemon",
        "virsh" => "libvirt-clients",
        "timeout" | "sha256sum" => "coreutils",
        "dpkg-deb" => "dpkg",
        "ldd" => "libc-bin",
        "file" => "file",
        "python3" => "python3",
        "apt-get" | "apt-cache" => "apt",
        "cc" => "gcc",
        "etcd" => "etcd-server",
        "etcdctl" => "etcd-client",
        // google-cloud-cli's (v1.32 here); Debian's kubernetes-client (v1.20) is fetched
        // by support::kube instead, its /usr/bin/kubectl would overwrite this one.
        "kubectl" => "kubectl",
        "testssl" => "testssl.sh",
        _ => return None,
    })
}

/// Whether `tool` is on PATH (or in /usr/sbin, which a non-login root PATH may lack).
fn installed(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || Path::new("/usr/sbin").join(tool).is_file()
}

/// Fail (never skip) when `tool` is not installed, naming its Debian package.
pub fn require(tool: &str) {
    let package = package_of(tool).unwrap_or_else(|| {
        panic!("no Debian package known for {tool}: add it to tests/support/require.rs")
    });
    assert!(
        installed(tool),
        "{tool} is not installed: apt-get install {package} \
         (scripts/test.sh installs scripts/test-packages.txt)"
    );
}

/// [`require`] each of `tools`.
pub fn require_tools(tools: &[&str]) {
    for t in tools {
        require(t);
    }
}

/// Fail (never skip) when the file `path`, shipped by the Debian package `package`, is
/// missing.
pub fn require_file(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} missing: apt-get install {package} \
         (scripts/test.sh installs scripts/test-packages.txt)"
    );
}
