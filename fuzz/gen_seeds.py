#!/usr/bin/env python3
"""Write the seed corpora under fuzz/seeds/<target>/ from the tests' fixtures and the
strings the unit and integration tests use. Run from anywhere; rerun after changing it.
`dhcp_handle` seeds are kept as they are; `image_format` seeds come from the real
packer (see `scripts/fuzz.sh --seeds`). Seeds are small: the whole tree stays < 1 MB."""

import glob
import hashlib
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")


def put(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def z(*parts):
    return b"".join(p.encode() + b"\0" for p in parts)


# --- TFTP -------------------------------------------------------------------------
RRQS = {
    "rrq_plain": b"\0\1" + z("ipxe.efi", "octet"),
    "rrq_options": b"\0\1" + z("ipxe.efi", "OCTET", "BlkSize", "1468", "tsize", "0"),
    "rrq_window": b"\0\1" + z("undionly.kpxe", "octet", "blksize", "1428", "windowsize", "16", "timeout", "1"),
    "rrq_netascii": b"\0\1" + z("pxelinux.cfg/default", "netascii"),
    "rrq_mac": b"\0\1" + z("52:54:00:ab:cd:ef/grub.cfg", "octet"),
    "rrq_pxelinux": b"\0\1" + z("pxelinux.cfg/01-52-54-00-ab-cd-ef", "octet"),
    "rrq_traversal": b"\0\1" + z("../../etc/passwd", "octet"),
    "rrq_backslash": b"\0\1" + z("..\\..\\boot.ini", "octet"),
    "rrq_drive": b"\0\1" + z("C:/windows/win.ini", "octet"),
    "rrq_padding": b"\0\1" + z("f", "octet", "tsize", "0") + b"\0\0\0",
    "rrq_bad_mode": b"\0\1" + z("f", "mail"),
    "rrq_big_timeout": b"\0\1" + z("f", "octet", "timeout", "255", "blksize", "65464"),
    "wrq": b"\0\2" + z("upload.bin", "octet"),
    "ack": b"\0\4\x12\x34",
    "error": b"\0\5\0\x08" + z("blksize refused"),
    "error_unterminated": b"\0\5\0\x08x",
    "oack": b"\0\6" + z("blksize", "1428"),
    "data": b"\0\3\0\1hello",
}
for k, v in RRQS.items():
    put("tftp_packet", k, v)


def params(size, max_blksize, max_window, retries):
    return struct.pack("<I", size)[:3] + struct.pack("<H", max_blksize) + bytes([max_window, retries, 0])


def events(*evs):
    return b"\xff\xff" + b"".join(struct.pack(">H", e) for e in evs)


TO, ERR = 0xFFFE, 0xFFFF
put("tftp_options", "plain", params(1500, 1468, 16, 6) + RRQS["rrq_plain"] + events(1, 2, 3, 4))
put("tftp_options", "oack", params(100000, 1468, 16, 6) + RRQS["rrq_options"] + events(0, 1, TO, 1, 2, 3))
put("tftp_options", "window", params(200000, 1428, 16, 3) + RRQS["rrq_window"] + events(0, 16, 8, TO, TO, 32, 48, 64, 80, 96, 112, 128, 140))
put("tftp_options", "empty_file", params(0, 512, 1, 2) + RRQS["rrq_options"] + events(0, 1))
put("tftp_options", "peer_error", params(5000, 512, 1, 2) + RRQS["rrq_plain"] + events(1, ERR))
put("tftp_options", "rollover", params(0x7FFFFF, 512, 64, 6) + b"\0\1" + z("f", "octet", "windowsize", "64", "blksize", "8") + events(0, 64, 65535, 0, 1, TO))
put("tftp_options", "refused", params(10, 512, 1, 2) + b"\0\1" + z("f", "octet", "blksize", "7", "windowsize", "0"))

# --- HTTP -------------------------------------------------------------------------
OWNER, OTHER = b"\0", b"\1"
HEADS = {
    "boot": OTHER + b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "pipelined": OTHER
    + b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n\r\n"
    + b"HEAD /assets/ipxe.efi HTTP/1.1\r\nHost: x\r\n\r\n"
    + b"GET /assets/ipxe.efi HTTP/1.1\r\nHost: x\r\nRange: bytes=10-19\r\n\r\n",
    "http10": OTHER + b"GET /boot.ipxe HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "script_owner": OWNER + b"GET /ipxe/script?uuid=4c4c4544-0042-3510-8052-b4c04f4e4d32&mac=52:54:00:ab:cd:ef&buildarch=x86_64 HTTP/1.1\r\nHost: x\r\n\r\n",
    "script_other": OTHER + b"GET /ipxe/script?mac=52%3a54%3a00%3aab%3acd%3aef&token=abc HTTP/1.1\r\nHost: x\r\n\r\n",
    "ignition_owner": OWNER + b"GET /ignition/server-a HTTP/1.1\r\nHost: x\r\n\r\n",
    "ignition_token": OTHER + b"GET /ignition/server-a/v1.ZZZZ.deadbeef HTTP/1.1\r\nHost: x\r\n\r\n",
    "multirange": OTHER + b"GET /assets/ipxe.efi HTTP/1.1\r\nRange: bytes=0-9, 100-, -50\r\nIf-Range: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
    "conditional": OTHER + b"GET /assets/sub/a%20b.txt HTTP/1.1\r\nIf-None-Match: \"x\", W/\"y\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\nIf-Match: *\r\n\r\n",
    "images": OTHER + b"GET /assets/images/os/vmlinuz HTTP/1.1\r\nIf-Unmodified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
    "traversal": OTHER + b"GET /assets/..%2f..%2fetc/passwd HTTP/1.1\r\n\r\n",
    "post_body": OTHER + b"POST /boot.ipxe HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "dup_length": OTHER + b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    "chunked": OTHER + b"GET /boot.ipxe HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad_header": OTHER + b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
}
for k, v in HEADS.items():
    put("http_head", k, v)

QUERIES = {
    "uuid": b"\0uuid=4c4c4544-0042-3510-8052-b4c04f4e4d32",
    "mac": b"\0mac=52:54:00:ab:cd:ef&buildarch=x86_64&platform=efi",
    "mac_encoded": b"\4mac=52%3A54%3A00%3AAB%3ACD%3AEF",
    "server_token": b"\4server=server-a&token=v1.AAAA.bbbb",
    "unknown": b"\4uuid=00000000-0000-0000-0000-000000000000&mac=",
    "bad_utf8": b"\0mac=%ff%fe",
    "ignition": b"\2server-a",
    "ignition_token": b"\6server-a/sometoken",
    "asset": b"\3sub/a%20b.txt",
    "asset_traversal": b"\7..%2F..%2Fetc%2Fpasswd",
}
for k, v in QUERIES.items():
    put("http_query", k, v)

ETAG = '"%x-0-%x"' % (1_700_000_000, 3000)
LM = "Tue, 14 Nov 2023 22:13:20 GMT"


def cond(flags, length, day, lines):
    return bytes([flags]) + struct.pack("<I", length)[:3] + bytes([day]) + "\n".join(lines).encode()


A = "\x01"
put("http_range", "single", cond(0, 3000, 0, [A, A, A, A, "bytes=0-9"]))
put("http_range", "suffix", cond(0, 3000, 0, [A, A, A, A, "bytes=-500"]))
put("http_range", "open", cond(0, 3000, 0, [A, A, A, A, "bytes=2999990-"]))
put("http_range", "multi", cond(0, 3000, 0, [A, A, A, A, "bytes=0-0, 5-9, -1, 100-"]))
put("http_range", "unsatisfiable", cond(0, 3000, 0, [A, A, A, A, "bytes=3000000-"]))
put("http_range", "reversed", cond(0, 3000, 0, [A, A, A, A, "bytes=9-1"]))
put("http_range", "head", cond(1, 3000, 0, [A, A, A, A, "bytes=0-9"]))
put("http_range", "if_none_match", cond(0, 3000, 0, [A, ETAG]))
put("http_range", "if_none_match_weak", cond(0, 3000, 0, [A, 'W/"nope", ' + ETAG]))
put("http_range", "if_modified_since", cond(0, 3000, 0, [A, A, LM]))
put("http_range", "if_unmodified_since", cond(0, 3000, 0, [A, A, A, "Sun, 06 Nov 1994 08:49:37 GMT"]))
put("http_range", "if_match", cond(0, 3000, 0, ['"nope"']))
put("http_range", "if_match_star", cond(0, 3000, 0, ["*", A, A, A, "bytes=1-2"]))
put("http_range", "if_range_etag", cond(0, 3000, 0, [A, A, A, A, "bytes=0-3", ETAG]))
put("http_range", "if_range_date", cond(0, 3000, 0, [A, A, A, A, "bytes=0-3", LM]))
put("http_range", "if_range_stale", cond(0, 3000, 0, [A, A, A, A, "bytes=0-3", '"old"']))
put("http_range", "empty_file", cond(0, 0, 0, [A, A, A, A, "bytes=-1"]))

# --- API --------------------------------------------------------------------------
JSON, YAML, PATCH, NONE = b"\0", b"\1", b"\2", b"\3"
for f in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/metal-operator/*.yaml"))):
    put("api_body", os.path.basename(f), YAML + open(f, "rb").read())
for f in sorted(glob.glob(os.path.join(ROOT, "examples/s390x/*.yaml"))):
    put("api_body", "s390x_" + os.path.basename(f), NONE + open(f, "rb").read())
put("api_body", "server.json", JSON + json.dumps({
    "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
    "metadata": {"name": "s1", "labels": {"rack": "r1"}},
    "spec": {"systemUUID": "4c4c4544-0042-3510-8052-b4c04f4e4d32", "power": "On"}}).encode())
put("api_body", "claim.json", JSON + json.dumps({
    "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
    "metadata": {"name": "c1", "namespace": "default"},
    "spec": {"power": "On", "image": "os-image:latest", "serverSelector": {
        "matchLabels": {"rack": "r1"},
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                             {"key": "bad", "operator": "DoesNotExist"}]}}}).encode())
put("api_body", "merge_patch.json", PATCH + b'{"metadata":{"labels":{"rack":null,"new":"x"}},"spec":{"power":"On"}}')
put("api_body", "secret.yaml", YAML + b"apiVersion: v1\nkind: Secret\nmetadata:\n  name: sec\nstringData:\n  ignition: '{}'\n")
put("api_body", "anchors.yaml", YAML + b"a: &x [1, 2]\nb: *x\nc: {k: *x}\n")
put("api_body", "nested.yaml", NONE + b"a: " + b"[" * 64 + b"]" * 64 + b"\n")
put("api_body", "preconditions.json", JSON + b'{"preconditions":{"resourceVersion":"12"}}')

SELECTORS = ["a=1,b in (2,3),!c", "a!=1", "b notin (3),a", "", "a in 1",
             "app.kubernetes.io/name=server", "x==y, z", "a in (b,c),d notin (e)",
             "!x,y!=,k=\nk=v\nother=1"]
for i, s in enumerate(SELECTORS):
    put("label_selector", "sel%d" % i, s + "\na=1\nb=2\napp.kubernetes.io/name=server\n")

# --- CLI JSONPath templates: the template, then a line with the JSON document -----
JSONPATH_DOC = json.dumps({"kind": "ServerList", "items": [
    {"metadata": {"name": "b", "labels": {"z": "1", "a": "2"}}, "spec": {"n": 10},
     "status": {"manufacturer": "\u001b]0;owned\u0007Acme", "conditions": [
         {"type": "Ready", "status": "True"}]}},
    {"metadata": {"name": "a"}, "spec": {"n": "9", "tags": ["x", "y\nz"]}}]})
JSONPATHS = ["{.items[*].metadata.name}", "{.items[-1].metadata.name}", "{$.kind}",
             "{.items[0].metadata.labels['z']}", ".items[*].spec.n", "{.items[*].status.manufacturer}",
             '{range .items[*]}{.metadata.name}{"\\t"}{.spec.n}{"\\n"}{end}',
             '{.items[?(@.metadata.name=="a")].spec.tags}',
             "{range .items[*]}{range .spec.tags[*]}<{@}>{end}{end}",
             "{.items[*].status.conditions[?(@.type!='Ready')].status}", "{.items[*].*}"]
for i, t in enumerate(JSONPATHS):
    put("cli_jsonpath", "tmpl%d" % i, t + "\n" + JSONPATH_DOC)
put("cli_jsonpath", "mixed_sort", ".n\n" + json.dumps([{"n": 10}, {"n": 9}, {"n": "5a"}, {"n": None}, {}]))

# --- Ignition -----------------------------------------------------------------------
for f in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/butane/*.bu"))):
    put("butane", os.path.basename(f), open(f, "rb").read())
for f in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/butane/*.ign.json"))):
    put("ignition_validate", os.path.basename(f), open(f, "rb").read())
put("butane", "local-files.bu", b"variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/a\n      contents:\n        local: a.txt\n    - path: /usr/local/bin/run\n      contents:\n        local: bin/run.sh\n  trees:\n    - local: tree\n      path: /opt/tree\npasswd:\n  users:\n    - name: core\n      ssh_authorized_keys_local: [key.pub]\nignition:\n  config:\n    merge:\n      - local: merge.ign\n")
put("butane", "flatcar.bu", b"variant: flatcar\nversion: 1.1.0\nsystemd:\n  units:\n    - name: a.service\n      enabled: true\n      contents: |\n        [Service]\n        ExecStart=/bin/true\n")

# --- catalog.toml -----------------------------------------------------------------
put("catalog_toml", "catalog.toml", open(os.path.join(ROOT, "images/catalog.toml"), "rb").read())
H = "ab" * 32
put("catalog_toml", "rootfs.toml", '[[image]]\nref = "a:1"\narch = "arm64"\ncmdline = "x"\n'
    'kernel = { path = "a/vmlinuz", sha256 = "%s" }\ninitrd = { path = "a/initrd img", sha256 = "%s" }\n'
    'rootfs = { path = "a/root+fs.squashfs", sha256 = "%s" }\n' % (H, H.upper(), H))
put("catalog_toml", "two.toml", '[[image]]\nref = "a:1"\nkernel = { path = "k", sha256 = "%s" }\ninitrd = { path = "i", sha256 = "%s" }\n'
    '[[image]]\nref = "b:2"\nkernel = { path = "x/k", sha256 = "%s" }\ninitrd = { path = "x/i", sha256 = "%s" }\n' % (H, H, H, H))
put("catalog_toml", "bad_path.toml", '[[image]]\nref = "a:1"\nkernel = { path = "../k", sha256 = "%s" }\ninitrd = { path = "i", sha256 = "%s" }\n' % (H, H))

# --- provisioning progress --------------------------------------------------------
LINES = [
    '{"stage":"write","bytes":1048576,"total":4194304,"rate":52428800.5,"eta":3.2,"frame":7}',
    '{"written":"2097152","size":4194304.0}',
    '{"phase":"verify"}',
    '{"stage":"open","bytes":0,"total":null,"rate":0.0,"eta":null,"elapsed":0.01}',
    '{"stage":"copy","bytes":123,"total":456,"rate":1.2e9,"eta":0.5,"elapsed":1.0}',
    '{"stage":"error","bytes":300,"total":456,"rate":1e9,"eta":null,"elapsed":2.0,"code":13,"class":"integrity","error":"verification failed: frame 3 sha256 mismatch"}',
    '{"stage":"done","bytes":456,"total":456,"rate":1e9,"eta":0,"elapsed":2.5,"sha256":"ab","cpu":{"read":0.1}}',
    '{"stage":"error","message":"sha256 mismatch: expected ab, got cd"}',
    '{"level":"info","message":"opening source"}',
    '{"bytes":-5,"total":"lots","rate":null,"stage":7}',
    '{"error":"nfs: connection refused"}',
    "Error: disk too small",
    "{not json",
    "[1,2]",
    '{"bytes":1e300,"rate":"1e400","total":18446744073709551615}',
]
put("provision_progress", "streamer", "\n".join(LINES[:9]) + "\n")
for i, l in enumerate(LINES):
    put("provision_progress", "line%d" % i, l)

# --- NFS replies ------------------------------------------------------------------


def rec(body, last=True, xid=1):
    msg = struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + body  # reply, accepted, AUTH_NONE, SUCCESS
    return struct.pack(">I", len(msg) | (0x80000000 if last else 0)) + msg


def opaque(b):
    return struct.pack(">I", len(b)) + b + b"\0" * (-len(b) % 4)


def fattr(size):
    return struct.pack(">IIIII", 1, 0o644, 1, 0, 0) + struct.pack(">Q", size) + b"\0" * 56


FH = bytes(range(32))
put("nfs_xdr", "getport", rec(struct.pack(">I", 2049)))
put("nfs_xdr", "getport_unregistered", rec(struct.pack(">I", 0)))
put("nfs_xdr", "mnt", rec(struct.pack(">I", 0) + opaque(FH) + struct.pack(">II", 1, 1)))
put("nfs_xdr", "mnt_denied", rec(struct.pack(">I", 13)))
put("nfs_xdr", "lookup", rec(struct.pack(">I", 0) + opaque(FH) + struct.pack(">I", 1) + fattr(1 << 20) + struct.pack(">I", 0)))
put("nfs_xdr", "lookup_noent", rec(struct.pack(">I", 2) + struct.pack(">I", 0)))
put("nfs_xdr", "getattr", rec(struct.pack(">I", 0) + fattr(12345)[4:]))
put("nfs_xdr", "fsinfo", rec(struct.pack(">II", 0, 0) + struct.pack(">IIIIII", 1 << 20, 1 << 20, 4096, 1 << 20, 1 << 20, 4096)))
put("nfs_xdr", "read", rec(struct.pack(">II", 0, 1) + fattr(4096) + struct.pack(">II", 5, 1) + opaque(b"hello")))
put("nfs_xdr", "read_fragments", rec(struct.pack(">II", 0, 0), last=False) + struct.pack(">I", 0x80000000 | 12) + struct.pack(">II", 1, 0) + opaque(b"x"))
put("nfs_xdr", "denied", struct.pack(">I", 0x80000000 | 16) + struct.pack(">IIII", 7, 1, 1, 1))
put("nfs_xdr", "two_replies", rec(struct.pack(">I", 2049), xid=1) + rec(struct.pack(">I", 0) + opaque(FH), xid=2))

# redfish_json: BMC answers (shapes from the DMTF schemas, sushy-tools and the fake BMC).
import json as _json
RF = {
    "system": {"@odata.id": "/redfish/v1/Systems/1", "@odata.etag": "W/\"3\"", "Id": "1",
               "UUID": "5A2C0000-0000-4000-8000-000000000001", "Manufacturer": "Fake", "Model": "Fake-1",
               "SerialNumber": "SN00001", "BiosVersion": "F.1", "PowerState": "On",
               "Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once",
                        "BootSourceOverrideMode": "UEFI", "HttpBootUri": "http://10.0.0.1/ipxe/boot.iso",
                        "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Cd", "Hdd", "UefiHttp"]},
               "Actions": {"#ComputerSystem.Reset": {"target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                           "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown"]}},
               "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/BMC"}]},
               "VirtualMedia": {"@odata.id": "/redfish/v1/Systems/1/VirtualMedia"}},
    "collection": {"@odata.id": "/redfish/v1/Systems", "Members@odata.count": 2,
                   "Members": [{"@odata.id": "/redfish/v1/Systems/1"}, {"@odata.id": "/redfish/v1/Systems/2"}]},
    "root": {"@odata.id": "/redfish/v1/", "RedfishVersion": "1.11.0", "UUID": "00000000-0000-0000-0000-00000000F00D",
             "Vendor": "Fake", "Product": "FakeBMC", "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
             "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}},
    "manager": {"@odata.id": "/redfish/v1/Managers/BMC", "FirmwareVersion": "1.2.3", "Manufacturer": "Fake",
                "Model": "FakeBMC", "VirtualMedia": {"@odata.id": "/redfish/v1/Managers/BMC/VirtualMedia"}},
    "vmedia": {"@odata.id": "/redfish/v1/Managers/BMC/VirtualMedia/Cd1", "Id": "Cd1", "MediaTypes": ["CD", "DVD"],
               "Image": "http://10.0.0.1/boot.iso", "Inserted": True,
               "Actions": {"#VirtualMedia.InsertMedia": {"target": "/redfish/v1/Managers/BMC/VirtualMedia/Cd1/Actions/VirtualMedia.InsertMedia"},
                           "#VirtualMedia.EjectMedia": {"target": "/redfish/v1/Managers/BMC/VirtualMedia/Cd1/Actions/VirtualMedia.EjectMedia"}}},
    "task_running": {"TaskState": "Running", "PercentComplete": 40},
    # found by the target: an empty self link must not replace the path read from
    "empty_self_link": {"@odata.id": "", "PowerState": "On", "Members": [{"@odata.id": "/redfish/v1/Systems/1"}]},
    "task_failed": {"TaskState": "Exception", "Messages": [{"Message": "the host refused"}]},
    "error": {"error": {"code": "Base.1.8.GeneralError", "message": "bad request",
                        "@Message.ExtendedInfo": [{"Message": "The property Foo is unknown."}]}},
}
for name, body in RF.items():
    put("redfish_json", name, _json.dumps(body).encode())

print("seeds written under", SEEDS)


# --- discovery agent: an SMBIOS table like QEMU's (types 0/1/4/17/127), a 3.0 entry
# point, LLDP frames (plain and 802.1Q-tagged) -------------------------------------------
def smbios_struct(kind, handle, length, sets, strings):
    a = bytearray(length)
    a[0], a[1] = kind, length
    a[2:4] = struct.pack("<H", handle)
    for off, b in sets:
        a[off:off + len(b)] = b
    return bytes(a) + (z(*strings) + b"\0" if strings else b"\0\0")


UUID_LE = bytes.fromhex("3a2b1c6f5e4d604f8a9b0c1d2e3f4a5b")
W = lambda v: struct.pack("<H", v)
table = smbios_struct(0, 0, 0x18, [(4, b"\x01"), (5, b"\x02")], ["Bootplane", "BP-1.0"])
table += smbios_struct(1, 0x100, 0x1B, [(4, b"\x01"), (5, b"\x02"), (7, b"\x03"), (8, UUID_LE), (0x19, b"\x04")],
                       ["Bootplane", "ProbeVM", "SN-1234", "SKU-9"])
for i in range(2):
    table += smbios_struct(4, 0x400 + i, 0x30, [(4, b"\x01"), (7, b"\x02"), (0x10, b"\x03"), (0x14, W(2500)),
                                                (0x18, b"\x41"), (0x23, b"\x01"), (0x25, b"\x01"),
                                                (0x2A, W(1)), (0x2E, W(1))],
                           ["CPU %d" % i, "BootplaneCPU", "ProbeCore"])
table += smbios_struct(4, 0x402, 0x30, [(4, b"\x01"), (0x18, b"\x41"), (0x23, b"\xff"), (0x25, b"\xff"),
                                        (0x2A, W(300)), (0x2E, W(600))], ["CPU 2"])
table += smbios_struct(17, 0x1100, 0x28, [(0x0C, W(1024))], [])
table += smbios_struct(17, 0x1101, 0x28, [(0x0C, W(0x7FFF)), (0x1C, struct.pack("<I", 65536))], [])
table += smbios_struct(127, 0xFEFF, 4, [], [])
put("probe_parsers", "smbios_table", table)
put("probe_parsers", "entry_point_3", b"_SM3_\0\0\x03" + bytes(16))


def tlv(kind, value):
    return struct.pack(">H", (kind << 9) | len(value)) + value


LLDP_HDR = bytes([1, 0x80, 0xC2, 0, 0, 0x0E, 2, 0x11, 0x22, 0x33, 0x44, 0x55])
put("probe_parsers", "lldp_frame", LLDP_HDR + b"\x88\xcc" + tlv(1, b"\x04\x02\x11\x22\x33\x44\x55")
    + tlv(2, b"\x05Ethernet1/7") + tlv(3, b"\x00\x78") + tlv(4, b"uplink") + tlv(5, b"leaf-01")
    + tlv(6, b"Switch OS 4.2") + b"\0\0")
put("probe_parsers", "lldp_vlan_frame", LLDP_HDR + b"\x81\x00\x00\x0a\x88\xcc"
    + tlv(1, b"\x05\x01\x0a\x00\x00\x01") + tlv(2, b"\x03\x01\x02\x03\x04\x05\x06") + b"\0\0")


# --- wipe: partition tables (8-byte little-endian device size, then the device's bytes,
# used as both its head and its tail): a GPT with primary and backup, the same with a
# corrupt primary, a plain MBR with an extended entry, 4096-byte sectors -------------
def gpt_disk(sectors, parts, lba=512, count=128, esize=128):
    import zlib
    d = bytearray(sectors * lba)
    d[446 + 4] = 0xEE
    d[446 + 8:446 + 16] = struct.pack("<II", 1, 0xFFFFFFFF)
    d[510:512] = b"\x55\xaa"
    arr = bytearray(count * esize)
    for i, (s, l) in enumerate(parts):
        e = i * esize
        arr[e:e + 16] = b"\xaf" * 16
        arr[e + 16:e + 32] = bytes([i + 1]) * 16
        arr[e + 32:e + 48] = struct.pack("<QQ", s, l)
    arr_lbas = -(-len(arr) // lba)
    backup_entries = sectors - 1 - arr_lbas
    for my, alt, entries in [(1, sectors - 1, 2), (sectors - 1, 1, backup_entries)]:
        h = bytearray(92)
        h[0:8] = b"EFI PART"
        h[8:16] = struct.pack("<II", 0x00010000, 92)
        h[24:56] = struct.pack("<QQQQ", my, alt, 2 + arr_lbas, backup_entries - 1)
        h[72:92] = struct.pack("<QIII", entries, count, esize, zlib.crc32(bytes(arr)))
        h[16:20] = struct.pack("<I", zlib.crc32(bytes(h)))
        d[my * lba:my * lba + 92] = h
        d[entries * lba:entries * lba + len(arr)] = arr
    return d


def sized(d):
    return struct.pack("<Q", len(d)) + bytes(d)


GPT = gpt_disk(48, [(6, 20), (21, 40)], count=16)
put("wipe_parttable", "gpt", sized(GPT))
BAD = bytearray(GPT)
BAD[512 + 40] ^= 1
put("wipe_parttable", "gpt_corrupt_primary", sized(BAD))
put("wipe_parttable", "gpt_4k", sized(gpt_disk(12, [(4, 8)], lba=4096, count=4)))
MBR = bytearray(8 * 1024)
MBR[510:512] = b"\x55\xaa"
for i, (kind, s, n) in enumerate([(0x83, 2, 4), (0x05, 6, 8), (0x0C, 1 << 30, 10)]):
    MBR[446 + i * 16 + 4] = kind
    MBR[446 + i * 16 + 8:446 + i * 16 + 16] = struct.pack("<II", s, n)
put("wipe_parttable", "mbr_extended", sized(MBR))

# root_hints: Ironic's and Metal3's root device hints, every size operator, the kernel
# command line's %-encoded form, and a refused unknown key.
for name, doc in [
    ("size_eq", '{"size": "== 1"}'),
    ("size_int", '{"size": 100}'),
    ("size_ge_rot", '{"size": ">= 10", "rotational": false}'),
    ("name", '{"name": "/dev/sda"}'),
    ("ids", '{"wwn": "0x5000c500a1b2c3d4", "serial": "S1", "vendor": "ATA", "model": "QEMU"}'),
    ("by_path", '{"by_path": "/dev/disk/by-path/10", "size": "!= 1"}'),
    ("cmdline_encoded", "%7B%22size%22%3A%22%3C%2020%22%7D"),
    ("unknown_key", '{"serail": "x"}'),
]:
    put("root_hints", name, doc)
