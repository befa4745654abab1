#!/usr/bin/env python3
"""Build the tests' busybox image from Debian's static busybox (package busybox-static), with no
registry and the Python standard library only (oci_image.write_image).

usage: busybox_image.py BUSYBOX OUT.tar REPO:TAG
   e.g. busybox_image.py /bin/busybox busybox.tar tern-busybox:1
   -> ctr images import busybox.tar   # named docker.io/library/tern-busybox:1

The image holds /bin/busybox and a symlink to it for every applet it was built with
(`busybox --list`: sh, ip, ping, nc, httpd, ...), /etc/passwd and /etc/group with root and
nobody, /tmp (1777) and /var/www/index.html for httpd; PATH=/bin, Cmd /bin/sh. Reproducible:
the same binary gives the same image ID."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oci_image  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    busybox, out, tag = sys.argv[1:4]
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    applets = sorted({a.strip() for a in listed.stdout.split() if a.strip()} - {"busybox"})
    if "sh" not in applets:
        sys.exit(f"busybox_image.py: {busybox} --list has no sh")
    links = {"bin/" + a: "busybox" for a in applets}
    texts = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
        "var/www/index.html": b"hello from tern-busybox\n",
    }
    _, summary = oci_image.write_image(
        out, tag, {"bin/busybox": busybox}, links,
        dirs=["etc", "tmp", "proc", "sys", "dev", "root", "var/www"], texts=texts,
        env=["PATH=/bin"], cmd=["/bin/sh"])
    summary["applets"] = len(applets)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
