#!/usr/bin/env python3
"""Pack files into a single-layer image tarball in `docker save` (docker-archive) format, which
`ctr -n k8s.io images import` accepts and names from RepoTags. The general form of
mk_image.py (one static binary): several files, their shared libraries (found with ldd),
symlinks and directories. busybox_image.py builds the test images' busybox on write_image().

usage: oci_image.py --out OUT.tar --tag REPO:TAG [--entrypoint /bin/x] [--env K=V]...
                    [--file SRC:DEST]... [--symlink DEST:TARGET]... [--dir DEST]... [--ldd]
  --file SRC:DEST   copy SRC (symlinks followed) to DEST in the image, mode 0755 if SRC is
                    executable, else 0644
  --ldd             also copy every shared library (and the dynamic loader) the ELF files
                    among the --file sources need, at the paths ldd resolves them to
  --list            print the layer's paths after writing

Standard library only. The layer is streamed through a temporary file (binaries of 100+ MB
are fine) and the output is reproducible (fixed mtimes, sorted entries, uid/gid 0), so the
same inputs give the same image ID."""
import argparse, hashlib, io, json, os, subprocess, sys, tarfile, tempfile

MTIME = 0


def tarinfo(name, typ, mode, size=0, link=""):
    ti = tarfile.TarInfo(name)
    ti.mtime = MTIME
    ti.mode = mode
    ti.type = typ
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.size = size
    if link:
        ti.linkname = link
    return ti


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def ldd(path):
    """Paths of the shared libraries and loader `path` needs; [] for a static binary."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    text = out.stdout + out.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if out.returncode != 0:
        sys.exit(f"oci_image.py: ldd {path} failed: {text.strip()}")
    libs = []
    for line in text.splitlines():
        line = line.strip()
        if "=>" in line:
            _, rhs = line.split("=>", 1)
            rhs = rhs.strip()
            if rhs.startswith("not found"):
                sys.exit(f"oci_image.py: {path}: library not found: {line}")
            p = rhs.split(" (", 1)[0].strip()
            if p.startswith("/"):
                libs.append(p)
        elif line.startswith("/"):
            libs.append(line.split(" (", 1)[0].strip())  # the dynamic loader
    return libs


def write_image(out, tag, files, links=None, dirs=(), texts=None, env=None, entrypoint=None,
                cmd=None):
    """Writes the image OUT named TAG. files: {dest: source path}; links: {dest: target};
    dirs: extra directories; texts: {dest: bytes} (regular files, mode 0644); dest paths have
    no leading /. Returns (the layer's paths, the summary printed by the CLI)."""
    links = links or {}
    texts = texts or {}
    dirs = {d.strip("/") for d in dirs if d.strip("/")}
    for p in list(files) + list(links) + list(texts):
        parts = p.split("/")[:-1]
        for i in range(len(parts)):
            dirs.add("/".join(parts[: i + 1]))
    # A path that is a symlink in the merged usr layout (/lib64 -> usr/lib64 on the host) is a
    # plain directory here: only what is packed exists in the image.

    with tempfile.TemporaryFile() as layer:
        with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as t:
            for d in sorted(dirs):
                mode = 0o1777 if d == "tmp" else 0o755
                t.addfile(tarinfo(d + "/", tarfile.DIRTYPE, mode))
            for dest in sorted(files):
                src = files[dest]
                st = os.stat(src)
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                with open(src, "rb") as f:
                    t.addfile(tarinfo(dest, tarfile.REGTYPE, mode, st.st_size), f)
            for dest in sorted(texts):
                data = texts[dest]
                t.addfile(tarinfo(dest, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
            for dest in sorted(links):
                t.addfile(tarinfo(dest, tarfile.SYMTYPE, 0o777, link=links[dest]))
            names = t.getnames()
        size = layer.tell()
        layer.seek(0)
        h = hashlib.sha256()
        for chunk in iter(lambda: layer.read(1 << 20), b""):
            h.update(chunk)
        diff_id = "sha256:" + h.hexdigest()
        cfg = {"Env": env or ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
               "WorkingDir": "/"}
        if entrypoint:
            cfg["Entrypoint"] = [entrypoint]
        if cmd:
            cfg["Cmd"] = list(cmd)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z",
                         "created_by": "tern scripts/k8s/oci_image.py"}],
        }
        cfg_bytes = json.dumps(config, sort_keys=True).encode()
        cfg_hex = hashlib.sha256(cfg_bytes).hexdigest()
        layer_dir = diff_id.split(":")[1]
        repo, _, ver = tag.rpartition(":")
        manifest = [{"Config": cfg_hex + ".json", "RepoTags": [tag],
                     "Layers": [layer_dir + "/layer.tar"]}]
        tmp_out = out + ".tmp"
        with tarfile.open(tmp_out, "w", format=tarfile.GNU_FORMAT) as t:
            def add(name, data):
                t.addfile(tarinfo(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
            t.addfile(tarinfo(layer_dir + "/", tarfile.DIRTYPE, 0o755))
            layer.seek(0)
            t.addfile(tarinfo(layer_dir + "/layer.tar", tarfile.REGTYPE, 0o644, size), layer)
            add(layer_dir + "/VERSION", b"1.0")
            add(cfg_hex + ".json", cfg_bytes)
            add("manifest.json", json.dumps(manifest).encode())
            add("repositories", json.dumps({repo: {ver: layer_dir}}).encode())
        os.replace(tmp_out, out)
    summary = {"out": out, "tag": tag, "config_digest": "sha256:" + cfg_hex,
               "diff_id": diff_id, "layer_bytes": size}
    return names, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--entrypoint")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--file", action="append", default=[])
    ap.add_argument("--symlink", action="append", default=[])
    ap.add_argument("--dir", action="append", default=[])
    ap.add_argument("--ldd", action="store_true")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if ":" not in a.tag.rsplit("/", 1)[-1]:
        sys.exit(f"oci_image.py: --tag {a.tag!r}: expected REPO:TAG")

    files = {}  # dest (no leading /) -> source
    for spec in a.file:
        src, sep, dest = spec.partition(":")
        if not sep or not dest.startswith("/"):
            sys.exit(f"oci_image.py: --file {spec!r}: expected SRC:/DEST")
        if not os.path.isfile(src):
            sys.exit(f"oci_image.py: --file {spec!r}: {src} is not a file")
        files[dest.lstrip("/")] = src
    if a.ldd:
        for src in list(files.values()):
            if is_elf(src):
                for lib in ldd(src):
                    files.setdefault(lib.lstrip("/"), lib)
    links = {}
    for spec in a.symlink:
        dest, sep, target = spec.partition(":")
        if not sep or not dest.startswith("/"):
            sys.exit(f"oci_image.py: --symlink {spec!r}: expected /DEST:TARGET")
        links[dest.lstrip("/")] = target
    names, summary = write_image(a.out, a.tag, files, links, a.dir, env=a.env,
                                 entrypoint=a.entrypoint)
    if a.list:
        for n in names:
            print(n)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
