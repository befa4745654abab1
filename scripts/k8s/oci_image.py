#!/usr/bin/env python3
"""tern's one image packer: files into a single-layer image tarball in `docker save`
(docker-archive) format, which `ctr -n k8s.io images import` accepts and names from RepoTags.
Every image tern's scripts and tests import is made here, one subcommand per kind:

  oci_image.py files --out OUT.tar --tag REPO:TAG [--entrypoint /bin/x] [--env K=V]...
                     [--file SRC:/DEST]... [--symlink /DEST:TARGET]... [--dir /DEST]...
                     [--ldd] [--list]
      any files (the tern-node image, scripts/k8s/tern-image.sh)
      --file SRC:/DEST  copy SRC (symlinks followed) to DEST in the image, mode 0755 if SRC is
                        executable, else 0644
      --ldd             also copy every shared library (and the dynamic loader) the ELF files
                        among the --file sources need, at the paths ldd resolves them to
      --list            print the layer's paths after writing
  oci_image.py static BINARY /PATH OUT.tar REPO:TAG
      one static binary, also the entrypoint, run as 65535:65535 (the pause and probe images,
      scripts/k8s-components.sh)
  oci_image.py busybox BUSYBOX OUT.tar REPO:TAG
      Debian's static busybox (busybox-static) with a symlink for every applet it lists
      (`busybox --list`: sh, ip, ping, nc, httpd, ...), /etc/passwd and /etc/group with root and
      nobody, /tmp (1777) and /var/www/index.html for httpd; PATH=/bin, Cmd /bin/sh (the tests'
      busybox image, scripts/k8s-components.sh; `ctr images import` names it
      docker.io/library/REPO:TAG)
  oci_image.py agnhost AGNHOST BUSYBOX OUT.tar REPO:TAG [SRC:/DEST]...
      the e2e agnhost binary with busybox's applets and the machine's SRC binaries (with their
      shared libraries) as DEST (scripts/k8s-e2e.sh, below)

agnhost: upstream's image (test/images/agnhost/Dockerfile) is alpine with bash, curl, nc,
iproute2 and agnhost at /agnhost (entrypoint /agnhost, cmd `pause`, /agnhost-2 a symlink,
/uploads for netexec, user-defined-in-image uid 1000 in group-defined-in-image gid 50000).
Alpine cannot be pulled here, so busybox's applets stand in for the shell tools, and the
machine's own binaries given as SRC:/DEST (the e2e specs run `curl` and netcat-openbsd's
`nc -u`, which busybox lacks) are copied with every shared library ldd finds for them. /usr/bin
comes before /bin in PATH, so such a DEST overrides the busybox applet of that name; an applet
whose /bin path a SRC:/DEST provides is left out (a bash given as /bin/sh: Debian's busybox ash
runs its own applets before PATH, so under it `nc` would always be busybox's).

Standard library only. The layer is streamed through a temporary file (binaries of 100+ MB
are fine) and the output is reproducible (fixed mtimes, sorted entries, uid/gid 0), so the
same inputs give the same image ID. Each subcommand prints a JSON summary."""
import argparse, hashlib, io, json, os, subprocess, sys, tarfile, tempfile

MTIME = 0
DEFAULT_PATH = "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def die(msg):
    sys.exit(f"oci_image.py: {msg}")


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
        die(f"ldd {path} failed: {text.strip()}")
    libs = []
    for line in text.splitlines():
        line = line.strip()
        if "=>" in line:
            _, rhs = line.split("=>", 1)
            rhs = rhs.strip()
            if rhs.startswith("not found"):
                die(f"{path}: library not found: {line}")
            p = rhs.split(" (", 1)[0].strip()
            if p.startswith("/"):
                libs.append(p)
        elif line.startswith("/"):
            libs.append(line.split(" (", 1)[0].strip())  # the dynamic loader
    return libs


def write_image(out, tag, files, links=None, dirs=(), texts=None, env=None, entrypoint=None,
                cmd=None, user=None, ports=(), kind="files"):
    """Writes the image OUT named TAG. files: {dest: source path}; links: {dest: target};
    dirs: extra directories; texts: {dest: bytes} (regular files, mode 0644); dest paths have
    no leading /; env: the config's Env (None: none); ports: TCP ports exposed; kind: the
    subcommand, recorded in the history. Returns (the layer's paths, the summary printed)."""
    if ":" not in tag.rsplit("/", 1)[-1]:
        die(f"tag {tag!r}: expected REPO:TAG")
    links = links or {}
    texts = texts or {}
    dirs = {d.strip("/") for d in dirs if d.strip("/")}
    for p in list(dirs) + list(files) + list(links) + list(texts):
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
        cfg = {"WorkingDir": "/"}
        if env:
            cfg["Env"] = list(env)
        if entrypoint:
            cfg["Entrypoint"] = [entrypoint]
        if cmd:
            cfg["Cmd"] = list(cmd)
        if user:
            cfg["User"] = user
        if ports:
            cfg["ExposedPorts"] = {f"{p}/tcp": {} for p in ports}
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z",
                         "created_by": f"tern scripts/k8s/oci_image.py {kind}"}],
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


def with_libraries(files):
    """files plus every shared library (and loader) its ELF sources need, at their paths."""
    files = dict(files)
    for src in list(files.values()):
        if is_elf(src):
            for lib in ldd(src):
                files.setdefault(lib.lstrip("/"), lib)
    return files


def file_specs(specs):
    """{dest without the leading /: source} from SRC:/DEST specs, each SRC a file."""
    files = {}
    for spec in specs:
        src, sep, dest = spec.partition(":")
        if not sep or not dest.startswith("/"):
            die(f"{spec!r}: expected SRC:/DEST")
        if not os.path.isfile(src):
            die(f"{spec!r}: {src} is not a file")
        files[dest.lstrip("/")] = src
    return files


def applets(busybox):
    """The applets `busybox --list` names (busybox itself left out); sh must be one."""
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    names = sorted({a.strip() for a in listed.stdout.split() if a.strip()} - {"busybox"})
    if "sh" not in names:
        die(f"{busybox} --list has no sh")
    return names


def cmd_files(a):
    files = file_specs(a.file)
    if a.ldd:
        files = with_libraries(files)
    links = {}
    for spec in a.symlink:
        dest, sep, target = spec.partition(":")
        if not sep or not dest.startswith("/"):
            die(f"--symlink {spec!r}: expected /DEST:TARGET")
        links[dest.lstrip("/")] = target
    names, summary = write_image(a.out, a.tag, files, links, a.dir, env=a.env or [DEFAULT_PATH],
                                 entrypoint=a.entrypoint)
    if a.list:
        for n in names:
            print(n)
    return summary


def cmd_static(a):
    if not a.path.startswith("/"):
        die(f"static: {a.path!r}: expected an absolute path in the image")
    _, summary = write_image(a.out, a.tag, {a.path.lstrip("/"): a.binary},
                             entrypoint=a.path, user="65535:65535", kind="static")
    return summary


def cmd_busybox(a):
    names = applets(a.busybox)
    texts = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
        "var/www/index.html": b"hello from tern-busybox\n",
    }
    _, summary = write_image(
        a.out, a.tag, {"bin/busybox": a.busybox}, {"bin/" + n: "busybox" for n in names},
        dirs=["etc", "tmp", "proc", "sys", "dev", "root", "var/www"], texts=texts,
        env=["PATH=/bin"], cmd=["/bin/sh"], kind="busybox")
    summary["applets"] = len(names)
    return summary


def cmd_agnhost(a):
    extra = with_libraries(file_specs(a.extra))
    files = {"agnhost": a.agnhost, "bin/busybox": a.busybox, **extra}
    provided = {d[len("bin/"):] for d in extra if d.startswith("bin/")}
    links = {"bin/" + n: "busybox" for n in applets(a.busybox) if n not in provided}
    links["agnhost-2"] = "agnhost"
    texts = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n"
        b"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
        b"nobody:x:65534:65534:nobody:/:/bin/false\n",
        "etc/group": b"root:x:0:\nuser-defined-in-image:x:1000:\n"
        b"group-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n",
        "etc/hosts": b"127.0.0.1 localhost\n",
    }
    dirs = ["bin", "dev", "etc", "home/user-defined-in-image", "proc", "root", "sys", "tmp",
            "uploads", "usr/bin", "usr/local/bin", "var"]
    _, summary = write_image(a.out, a.tag, files, links, dirs, texts, env=[DEFAULT_PATH],
                             entrypoint="/agnhost", cmd=["pause"],
                             ports=(80, 8080, 8081, 9376, 5000), kind="agnhost")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("files", help="any files")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--entrypoint")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--symlink", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("--ldd", action="store_true")
    p.add_argument("--list", action="store_true")
    p.set_defaults(run=cmd_files)
    p = sub.add_parser("static", help="one static binary, its entrypoint")
    for arg in ("binary", "path", "out", "tag"):
        p.add_argument(arg)
    p.set_defaults(run=cmd_static)
    p = sub.add_parser("busybox", help="the tests' busybox image")
    for arg in ("busybox", "out", "tag"):
        p.add_argument(arg)
    p.set_defaults(run=cmd_busybox)
    p = sub.add_parser("agnhost", help="the e2e agnhost image")
    for arg in ("agnhost", "busybox", "out", "tag"):
        p.add_argument(arg)
    p.add_argument("extra", nargs="*", metavar="SRC:/DEST")
    p.set_defaults(run=cmd_agnhost)
    a = ap.parse_args()
    print(json.dumps(a.run(a)))


if __name__ == "__main__":
    main()
