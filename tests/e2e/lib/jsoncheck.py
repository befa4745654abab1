#!/usr/bin/env python3
"""Small JSON checkers for the e2e scripts; JSON comes on stdin.

  jsoncheck.py result VERSION NETNS   CNI ADD result shape for cniVersion VERSION
  jsoncheck.py error CODE             CNI error object with that code
  jsoncheck.py empty-list             [] / {"items": []} / null (no resources left)
  jsoncheck.py pod-ip                 prints the first ips[].address without its prefix length
  jsoncheck.py host-if                prints interfaces[0].name (the host-side veth)
Exit status 0 when the check passes; the reasons for a failure are printed.
"""
import ipaddress
import json
import sys


def fail(msgs, doc):
    for m in msgs:
        print("jsoncheck: " + m)
    print("jsoncheck: document: " + json.dumps(doc)[:2000])
    sys.exit(1)


def check_result(doc, version, netns):
    errs = []
    if not isinstance(doc, dict):
        fail(["result is not an object"], doc)
    if doc.get("cniVersion") != version:
        errs.append("cniVersion is %r, want %r" % (doc.get("cniVersion"), version))
    ifaces = doc.get("interfaces")
    if not isinstance(ifaces, list) or len(ifaces) < 2:
        fail(errs + ["want at least 2 interfaces (host veth, pod iface), got %r" % ifaces], doc)
    host, pod = ifaces[0], ifaces[1]
    if host.get("sandbox"):
        errs.append("interfaces[0] (host veth) has sandbox %r" % host.get("sandbox"))
    if pod.get("sandbox") != netns:
        errs.append("interfaces[1].sandbox is %r, want netns %r" % (pod.get("sandbox"), netns))
    for i, itf in enumerate(ifaces[:2]):
        if not itf.get("name"):
            errs.append("interfaces[%d] has no name" % i)
        if not itf.get("mac"):
            errs.append("interfaces[%d] has no mac" % i)
    ips = doc.get("ips")
    if not isinstance(ips, list) or not ips:
        fail(errs + ["no ips"], doc)
    has_version = version in ("0.3.0", "0.3.1", "0.4.0")
    for i, ip in enumerate(ips):
        if ip.get("interface") != 1:
            errs.append("ips[%d].interface is %r, want 1" % (i, ip.get("interface")))
        try:
            iface = ipaddress.ip_interface(ip.get("address", ""))
        except ValueError:
            errs.append("ips[%d].address %r is not a CIDR" % (i, ip.get("address")))
            continue
        if has_version:
            want = str(iface.version)
            if ip.get("version") != want:
                errs.append("ips[%d].version is %r, want %r" % (i, ip.get("version"), want))
        elif "version" in ip:
            errs.append("ips[%d] has 'version' which cniVersion %s removed" % (i, version))
        gw = ip.get("gateway")
        if gw and ipaddress.ip_address(gw).version != iface.version:
            errs.append("ips[%d].gateway %r is not the address's family" % (i, gw))
    for i, r in enumerate(doc.get("routes") or []):
        try:
            ipaddress.ip_network(r.get("dst", ""), strict=False)
        except ValueError:
            errs.append("routes[%d].dst %r is not a CIDR" % (i, r.get("dst")))
    if errs:
        fail(errs, doc)


def main():
    mode = sys.argv[1]
    raw = sys.stdin.read()
    try:
        doc = json.loads(raw) if raw.strip() else None
    except ValueError as e:
        print("jsoncheck: not JSON (%s): %s" % (e, raw[:2000]))
        sys.exit(1)
    if mode == "result":
        check_result(doc, sys.argv[2], sys.argv[3])
    elif mode == "error":
        want = int(sys.argv[2])
        if not isinstance(doc, dict) or doc.get("code") != want or not doc.get("msg"):
            fail(["want an error object with code %d and a msg" % want], doc)
    elif mode == "empty-list":
        items = doc.get("items") if isinstance(doc, dict) else doc
        if items not in (None, []):
            fail(["resources are left: %d" % len(items)], doc)
    elif mode == "host-if":
        print(doc["interfaces"][0]["name"])
    elif mode == "pod-ip":
        print(doc["ips"][0]["address"].split("/")[0])
    else:
        print("jsoncheck: unknown mode " + mode)
        sys.exit(2)


if __name__ == "__main__":
    main()
