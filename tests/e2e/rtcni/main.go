// rtcni drives a CNI plugin chain through libcni, the library containerd and CRI-O build on, so
// that tests/e2e/libcni.sh sees the plugins exactly as a runtime does: the result cache under
// -cache, prevResult handed down the chain, capability arguments filtered per plugin, CHECK and
// DEL given the cached result. It is test code, built by tests/e2e/rtcni/build.sh with Debian's
// Go 1.19 against Debian's libcni 1.1.2 (golang-github-appc-cni-dev) in GOPATH mode: no network.
//
//	rtcni -conf FILE [-cache DIR] [-id ID] [-if eth0] [-netns PATH] [-args K=V;K=V] [-cap JSON] add|check|del|cached|version
//
// Every command prints one JSON document on stdout: the result (add, cached; null when nothing
// is cached), {} (check, del), the plugins' supported versions (version), or {"error": "..."}
// with exit status 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func printJSON(v interface{}) {
	_ = json.NewEncoder(os.Stdout).Encode(v)
}

func die(err error) {
	printJSON(map[string]string{"error": err.Error()})
	os.Exit(1)
}

// loadList reads a .conflist, or a single-plugin .conf wrapped as a list.
func loadList(path string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(path, ".conflist") {
		return libcni.ConfListFromFile(path)
	}
	conf, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

// parseArgs turns "K=V;K2=V2" into CNI_ARGS pairs.
func parseArgs(s string) ([][2]string, error) {
	var out [][2]string
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-args: %q is not K=V", kv)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func printResult(r types.Result) {
	if r == nil {
		fmt.Println("null")
		return
	}
	if err := r.Print(); err != nil {
		die(err)
	}
}

func main() {
	confPath := flag.String("conf", "", "the network configuration (.conflist, or .conf)")
	cacheDir := flag.String("cache", "", "libcni's result cache (default /var/lib/cni)")
	id := flag.String("id", "rtcni-test", "CNI_CONTAINERID")
	ifName := flag.String("if", "eth0", "CNI_IFNAME")
	netns := flag.String("netns", "", "CNI_NETNS")
	cniArgs := flag.String("args", "", "CNI_ARGS as K=V;K2=V2")
	capJSON := flag.String("cap", "", "capability arguments as JSON, e.g. {\"bandwidth\": {...}}")
	flag.Parse()
	if flag.NArg() != 1 || *confPath == "" {
		flag.Usage()
		os.Exit(2)
	}
	list, err := loadList(*confPath)
	if err != nil {
		die(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: *ifName}
	if rt.Args, err = parseArgs(*cniArgs); err != nil {
		die(err)
	}
	if *capJSON != "" {
		if err := json.Unmarshal([]byte(*capJSON), &rt.CapabilityArgs); err != nil {
			die(fmt.Errorf("-cap: %w", err))
		}
	}
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	if len(paths) == 0 {
		die(errors.New("CNI_PATH is empty: it names the plugins' directories"))
	}
	cni := libcni.NewCNIConfigWithCacheDir(paths, *cacheDir, nil)
	ctx := context.Background()

	switch cmd := flag.Arg(0); cmd {
	case "add":
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			die(err)
		}
		printResult(r)
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			die(err)
		}
		printJSON(struct{}{})
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			die(err)
		}
		printJSON(struct{}{})
	case "cached":
		r, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			die(err)
		}
		printResult(r)
	case "version":
		versions := map[string][]string{}
		for _, p := range list.Plugins {
			vi, err := cni.GetVersionInfo(ctx, p.Network.Type)
			if err != nil {
				die(err)
			}
			versions[p.Network.Type] = vi.SupportedVersions()
		}
		printJSON(versions)
	default:
		die(fmt.Errorf("unknown command %q (add, check, del, cached, version)", cmd))
	}
}
