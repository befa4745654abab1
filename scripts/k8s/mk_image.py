#!/usr/bin/env python3
"""Pack one static binary into a single-layer image tarball in `docker save` (docker-archive)
format, which `ctr -n k8s.io images import` accepts and names from RepoTags.

usage: mk_image.py BINARY PATH_IN_IMAGE OUT.tar REPO:TAG
   e.g. mk_image.py pause /pause pause.tar localhost/tern/pause:3.10
The binary is also the image's entrypoint. Standard library only; output is reproducible
(fixed mtimes), so re-running it gives the same image ID."""
import hashlib, io, json, sys, tarfile

src, dest, out, tag = sys.argv[1:5]
dest = dest.lstrip("/")


def add(t, name, data=None, mode=0o644, typ=tarfile.REGTYPE):
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.mode = mode
    ti.type = typ
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    if data is not None:
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    else:
        t.addfile(ti)


lbuf = io.BytesIO()
with tarfile.open(fileobj=lbuf, mode="w", format=tarfile.USTAR_FORMAT) as t:
    parts = dest.split("/")[:-1]
    for i in range(len(parts)):
        add(t, "/".join(parts[: i + 1]) + "/", mode=0o755, typ=tarfile.DIRTYPE)
    add(t, dest, open(src, "rb").read(), mode=0o755)
layer = lbuf.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {"Entrypoint": ["/" + dest], "WorkingDir": "/", "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tern scripts/k8s/mk_image.py"}],
}
cfg = json.dumps(config, sort_keys=True).encode()
cfg_hex = hashlib.sha256(cfg).hexdigest()
layer_dir = diff_id.split(":")[1]
repo, _, ver = tag.rpartition(":")
manifest = [{"Config": cfg_hex + ".json", "RepoTags": [tag], "Layers": [layer_dir + "/layer.tar"]}]
with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as t:
    add(t, layer_dir + "/", typ=tarfile.DIRTYPE, mode=0o755)
    add(t, layer_dir + "/layer.tar", layer)
    add(t, layer_dir + "/VERSION", b"1.0")
    add(t, cfg_hex + ".json", cfg)
    add(t, "manifest.json", json.dumps(manifest).encode())
    add(t, "repositories", json.dumps({repo: {ver: layer_dir}}).encode())
print(json.dumps({"out": out, "tag": tag, "config_digest": "sha256:" + cfg_hex}))
