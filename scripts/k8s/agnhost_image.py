#!/usr/bin/env python3
"""Pack the e2e agnhost binary with a static busybox into a single-layer image tarball in
`docker save` (docker-archive) format, which `ctr -n k8s.io images import` accepts and names
from RepoTags.

usage: agnhost_image.py AGNHOST BUSYBOX OUT.tar REPO:TAG [SRC:/DEST]...
   e.g. agnhost_image.py agnhost /bin/busybox agnhost.tar registry.k8s.io/e2e-test-images/agnhost:2.56 \
            /usr/bin/curl:/usr/bin/curl /usr/bin/nc.openbsd:/usr/bin/nc

Upstream's image (test/images/agnhost/Dockerfile) is alpine with bash, curl, nc, iproute2 and
agnhost at /agnhost (entrypoint /agnhost, cmd `pause`, /agnhost-2 a symlink, /uploads for
netexec, user-defined-in-image uid 1000 in group-defined-in-image gid 50000). Alpine cannot be
pulled here, so busybox's applets stand in for the shell tools (every applet it lists, as
symlinks in /bin), and the machine's own binaries given as SRC:/DEST (the e2e specs run
`curl` and netcat-openbsd's `nc -u`, which busybox lacks) are copied with every shared library
ldd finds for them, at the paths ldd resolves. /usr/bin comes before /bin in PATH, so such a
DEST overrides the busybox applet of that name. Standard library only; reproducible (fixed
mtimes, sorted entries)."""
import hashlib, io, json, os, subprocess, sys, tarfile

agnhost, busybox, out, tag = sys.argv[1:5]
extra = {}  # path in the image (no leading /) -> source
for spec in sys.argv[5:]:
    src, sep, dest = spec.partition(":")
    if not sep or not dest.startswith("/") or not os.path.isfile(src):
        sys.exit(f"agnhost_image.py: {spec!r}: expected SRC:/DEST with SRC a file")
    extra[dest.lstrip("/")] = src


def ldd(path):
    """The shared libraries and loader of `path` ([] for a static binary)."""
    r = subprocess.run(["ldd", path], capture_output=True, text=True)
    text = r.stdout + r.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if r.returncode != 0:
        sys.exit(f"agnhost_image.py: ldd {path}: {text.strip()}")
    libs = []
    for line in text.splitlines():
        line = line.strip()
        if "=>" in line:
            rhs = line.split("=>", 1)[1].strip()
            if rhs.startswith("not found"):
                sys.exit(f"agnhost_image.py: {path}: library not found: {line}")
            if rhs.startswith("/"):
                libs.append(rhs.split(" (", 1)[0])
        elif line.startswith("/"):
            libs.append(line.split(" (", 1)[0])
    return libs


for src in list(extra.values()):
    for lib in ldd(src):
        extra.setdefault(lib.lstrip("/"), lib)


def info(name, typ, mode, size=0, link=""):
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.mode = mode
    ti.type = typ
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.size = size
    ti.linkname = link
    return ti


applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
if "sh" not in applets:
    sys.exit(f"agnhost_image.py: {busybox} has no sh applet")
files = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n"
    b"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
    b"nobody:x:65534:65534:nobody:/:/bin/false\n",
    "etc/group": b"root:x:0:\nuser-defined-in-image:x:1000:\n"
    b"group-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n",
    "etc/hosts": b"127.0.0.1 localhost\n",
}
dirs = ["bin", "dev", "etc", "home", "home/user-defined-in-image", "proc", "root", "sys", "tmp",
        "uploads", "usr", "usr/bin", "usr/local", "usr/local/bin", "var"]
for dest in extra:
    parts = dest.split("/")[:-1]
    for i in range(len(parts)):
        d = "/".join(parts[: i + 1])
        if d not in dirs:
            dirs.append(d)
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as t:
    for d in sorted(dirs):
        t.addfile(info(d + "/", tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
    data = open(agnhost, "rb").read()
    t.addfile(info("agnhost", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
    t.addfile(info("agnhost-2", tarfile.SYMTYPE, 0o777, link="agnhost"))
    data = open(busybox, "rb").read()
    t.addfile(info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
    # An applet whose /bin path an extra file provides is left out (a bash given as /bin/sh:
    # Debian's busybox ash runs its own applets before PATH, so under it `nc` would always be
    # busybox's, never netcat-openbsd).
    for a in sorted(set(applets) - {"busybox"} - {d[len("bin/"):] for d in extra if d.startswith("bin/")}):
        t.addfile(info("bin/" + a, tarfile.SYMTYPE, 0o777, link="busybox"))
    for dest in sorted(extra):
        data = open(extra[dest], "rb").read()
        mode = 0o755 if os.stat(extra[dest]).st_mode & 0o111 else 0o644
        t.addfile(info(dest, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    for name in sorted(files):
        t.addfile(info(name, tarfile.REGTYPE, 0o644, len(files[name])), io.BytesIO(files[name]))
layer = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {
        "Entrypoint": ["/agnhost"],
        "Cmd": ["pause"],
        "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
        "ExposedPorts": {f"{p}/tcp": {} for p in (80, 8080, 8081, 9376, 5000)},
    },
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tern scripts/k8s/agnhost_image.py"}],
}
cfg = json.dumps(config, sort_keys=True).encode()
cfg_hex = hashlib.sha256(cfg).hexdigest()
layer_dir = diff_id.split(":")[1]
repo, _, ver = tag.rpartition(":")
manifest = [{"Config": cfg_hex + ".json", "RepoTags": [tag], "Layers": [layer_dir + "/layer.tar"]}]
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
    def add(name, data):
        t.addfile(info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    t.addfile(info(layer_dir + "/", tarfile.DIRTYPE, 0o755))
    add(layer_dir + "/layer.tar", layer)
    add(layer_dir + "/VERSION", b"1.0")
    add(cfg_hex + ".json", cfg)
    add("manifest.json", json.dumps(manifest).encode())
    add("repositories", json.dumps({repo: {ver: layer_dir}}).encode())
print(json.dumps({"out": out, "tag": tag, "config_digest": "sha256:" + cfg_hex,
                  "diff_id": diff_id, "layer_bytes": len(layer)}))
