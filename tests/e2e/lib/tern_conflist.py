#!/usr/bin/env python3
"""Builds the tern-mode conflist for the containerd e2e test.

usage: tern_conflist.py GENERATED AGENT_SOCKET STATE_DIR LOG_DIR OUT

GENERATED is the conflist `ternctl install-cni` wrote; it must hold tern (with tern-ipam) first and
bandwidth and portmap chained. The output keeps the shape of a Calico install's conflist
(CALICO_CONFLIST below: every Calico key, cniVersion 0.3.1, bandwidth and portmap) with the types
changed to tern / tern-ipam, the keys install-cni generated, and every path pointed into the test's temp dir so
nothing on the machine is written.
"""
import copy
import json
import sys

# The conflist a Calico install writes (`10-calico.conflist`), as the product's first seed
# document quotes it.
CALICO_CONFLIST = {
    "name": "k8s-pod-network",
    "cniVersion": "0.3.1",
    "plugins": [
        {
            "container_settings": {"allow_ip_forwarding": False},
            "datastore_type": "kubernetes",
            "endpoint_status_dir": "/var/run/calico/endpoint-status",
            "ipam": {"assign_ipv4": "true", "assign_ipv6": "false", "type": "calico-ipam"},
            "kubernetes": {
                "k8s_api_root": "https://172.21.0.1:443",
                "kubeconfig": "/etc/cni/net.d/calico-kubeconfig",
            },
            "log_file_max_age": 30,
            "log_file_max_count": 10,
            "log_file_max_size": 100,
            "log_file_path": "/var/log/calico/cni/cni.log",
            "log_level": "Info",
            "mtu": 0,
            "nodename_file_optional": False,
            "policy": {"type": "k8s"},
            "policy_setup_timeout_seconds": 0,
            "type": "calico",
        },
        {"capabilities": {"bandwidth": True}, "type": "bandwidth"},
        {"capabilities": {"portMappings": True}, "snat": True, "type": "portmap"},
    ],
}



def main():
    gen_path, sock, state_dir, log_dir, out = sys.argv[1:6]
    gen = json.load(open(gen_path, encoding="utf-8"))
    types = [p.get("type") for p in gen.get("plugins", [])]
    problems = []
    if not types or types[0] != "tern":
        problems.append("first plugin is %r, want 'tern'" % (types[:1],))
    elif (gen["plugins"][0].get("ipam") or {}).get("type") != "tern-ipam":
        problems.append("tern's ipam.type is not 'tern-ipam'")
    for chained in ("bandwidth", "portmap"):
        if chained not in types:
            problems.append("%s is not chained although /usr/lib/cni has it" % chained)
    if problems:
        print("install-cni conflist %s: %s" % (gen_path, "; ".join(problems)))
        print(json.dumps(gen, indent=1))
        sys.exit(1)

    conf = copy.deepcopy(CALICO_CONFLIST)
    main_plugin = conf["plugins"][0]
    gen_main = gen["plugins"][0]
    for k, v in gen_main.items():
        if k != "ipam":
            main_plugin[k] = v
    main_plugin["type"] = "tern"
    ipam = dict(main_plugin.get("ipam") or {})
    ipam.update(gen_main.get("ipam") or {})
    ipam["type"] = "tern-ipam"
    main_plugin["ipam"] = ipam
    main_plugin["agent_socket"] = sock
    main_plugin["state_dir"] = state_dir
    main_plugin["log_file_path"] = log_dir + "/cni.log"
    main_plugin["endpoint_status_dir"] = log_dir + "/endpoint-status"
    main_plugin.setdefault("kubernetes", {})["kubeconfig"] = log_dir + "/kubeconfig"
    json.dump(conf, open(out, "w", encoding="utf-8"), indent=2)


if __name__ == "__main__":
    main()
