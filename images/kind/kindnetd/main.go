// kindnetd is the node networking agent kind's default CNI manifest runs on every node
// (DaemonSet kube-system/kindnet, image docker.io/kindest/kindnetd). kind's own kindnetd
// lives in a repository the Go module proxy does not serve, so this is an equivalent written
// for the kind node image built here; it does what kind's simple kindnetd did:
//
//   - writes /etc/cni/net.d/10-kindnet.conflist for its node's podCIDRs: the ptp plugin with
//     host-local IPAM, then portmap (the plugins are the node's, Debian's
//     containernetworking-plugins);
//   - routes every other node's podCIDRs via that node's InternalIP;
//   - masquerades traffic from pods to destinations outside the pod subnet (the
//     KIND-MASQ-AGENT chain), so pods reach the kind Docker network and the host.
//
// It reads Nodes from the API server with the pod's service account (the manifest's ClusterRole
// allows list/watch nodes) and re-syncs every few seconds; environment: HOST_IP (this node's
// address), POD_SUBNET (the cluster's pod CIDRs, comma separated).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	cniConfigPath     = "/etc/cni/net.d/10-kindnet.conflist"
	masqueradeChain   = "KIND-MASQ-AGENT"
	resyncInterval    = 5 * time.Second
)

type nodeList struct {
	Items []node `json:"items"`
}

type node struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		PodCIDR  string   `json:"podCIDR"`
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
	Status struct {
		Addresses []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
	} `json:"status"`
}

func (n node) cidrs() []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

func (n node) internalIPs() []string {
	var ips []string
	for _, address := range n.Status.Addresses {
		if address.Type == "InternalIP" {
			ips = append(ips, address.Address)
		}
	}
	return ips
}

// apiClient reads Nodes with the pod's service account, as client-go's in-cluster config does.
type apiClient struct {
	server string
	http   *http.Client
}

func newAPIClient() (*apiClient, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT are not set: not running in a pod")
	}
	caPEM, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s/ca.crt", serviceAccountDir)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	return &apiClient{
		server: "https://" + net.JoinHostPort(host, port),
		http:   &http.Client{Transport: transport, Timeout: 15 * time.Second},
	}, nil
}

func (c *apiClient) nodes() ([]node, error) {
	// The token is re-read on every call: the kubelet rotates it.
	token, err := os.ReadFile(filepath.Join(serviceAccountDir, "token"))
	if err != nil {
		return nil, err
	}
	request, err := http.NewRequest(http.MethodGet, c.server+"/api/v1/nodes", nil)
	if err != nil {
		return nil, err
	}
	request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	request.Header.Set("Accept", "application/json")
	response, err := c.http.Do(request)
	if err != nil {
		return nil, err
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/v1/nodes: %s", response.Status)
	}
	var list nodeList
	if err := json.NewDecoder(response.Body).Decode(&list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

func isIPv6(cidrOrIP string) bool { return strings.Contains(cidrOrIP, ":") }

// cniConfig is the conflist for this node's pod CIDRs.
func cniConfig(cidrs []string, mtu int) ([]byte, error) {
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, cidr := range cidrs {
		ranges = append(ranges, []map[string]string{{"subnet": cidr}})
		if isIPv6(cidr) {
			routes = append(routes, map[string]string{"dst": "::/0"})
		} else {
			routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
		}
	}
	config := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "kindnet",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": false,
				"mtu":    mtu,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"routes":  routes,
					"ranges":  ranges,
				},
			},
			map[string]any{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
			},
		},
	}
	return json.MarshalIndent(config, "", "  ")
}

// writeIfChanged replaces path atomically when its content differs: the runtime watches
// the directory and must never read half a file.
func writeIfChanged(path string, content []byte) (bool, error) {
	if current, err := os.ReadFile(path); err == nil && bytes.Equal(current, content) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}

// mtuOf is the MTU of the interface holding ip (the node's own), 1500 when not found.
func mtuOf(ip string) int {
	interfaces, err := net.Interfaces()
	if err != nil {
		return 1500
	}
	for _, iface := range interfaces {
		addresses, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, address := range addresses {
			if prefix, ok := address.(*net.IPNet); ok && prefix.IP.String() == ip {
				return iface.MTU
			}
		}
	}
	return 1500
}

func run(name string, args ...string) error {
	output, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err,
			strings.TrimSpace(string(output)))
	}
	return nil
}

// ensureMasquerade keeps the KIND-MASQ-AGENT chain: traffic that leaves the pod subnets for
// a non-local address is masqueraded; pod-to-pod traffic keeps its source.
func ensureMasquerade(subnets []string) error {
	for _, family := range []struct {
		command string
		ipv6    bool
	}{{"iptables", false}, {"ip6tables", true}} {
		var own []string
		for _, subnet := range subnets {
			if isIPv6(subnet) == family.ipv6 {
				own = append(own, subnet)
			}
		}
		if len(own) == 0 {
			continue
		}
		ipt := family.command
		if run(ipt, "-t", "nat", "-S", masqueradeChain) != nil {
			if err := run(ipt, "-t", "nat", "-N", masqueradeChain); err != nil {
				return err
			}
		}
		jump := []string{"POSTROUTING", "-m", "addrtype", "!", "--dst-type", "LOCAL",
			"-m", "comment", "--comment", "kind-masq-agent: non-LOCAL destinations go to KIND-MASQ-AGENT",
			"-j", masqueradeChain}
		if run(ipt, append([]string{"-t", "nat", "-C"}, jump...)...) != nil {
			if err := run(ipt, append([]string{"-t", "nat", "-A"}, jump...)...); err != nil {
				return err
			}
		}
		var rules [][]string
		for _, subnet := range own {
			rules = append(rules, []string{"-d", subnet, "-m", "comment", "--comment",
				"kind-masq-agent: local traffic is not subject to MASQUERADE", "-j", "RETURN"})
		}
		rules = append(rules, []string{"-m", "comment", "--comment",
			"kind-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)",
			"-j", "MASQUERADE"})
		complete := true
		for _, rule := range rules {
			if run(ipt, append([]string{"-t", "nat", "-C", masqueradeChain}, rule...)...) != nil {
				complete = false
			}
		}
		if complete {
			continue
		}
		if err := run(ipt, "-t", "nat", "-F", masqueradeChain); err != nil {
			return err
		}
		for _, rule := range rules {
			if err := run(ipt, append([]string{"-t", "nat", "-A", masqueradeChain}, rule...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// sync makes the node's CNI config and routes match the Nodes the API server reports.
func sync(client *apiClient, hostIP string, mtu int) error {
	nodes, err := client.nodes()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		ips, cidrs := n.internalIPs(), n.cidrs()
		own := false
		for _, ip := range ips {
			if ip == hostIP {
				own = true
			}
		}
		if own {
			if len(cidrs) == 0 {
				log.Printf("node %s (this node) has no podCIDR yet", n.Metadata.Name)
				continue
			}
			config, err := cniConfig(cidrs, mtu)
			if err != nil {
				return err
			}
			changed, err := writeIfChanged(cniConfigPath, config)
			if err != nil {
				return err
			}
			if changed {
				log.Printf("wrote %s for pod CIDRs %s", cniConfigPath, strings.Join(cidrs, ","))
			}
			continue
		}
		for _, cidr := range cidrs {
			for _, ip := range ips {
				if isIPv6(ip) != isIPv6(cidr) {
					continue
				}
				args := []string{"route", "replace", cidr, "via", ip}
				if isIPv6(cidr) {
					args = append([]string{"-6"}, args...)
				}
				if err := run("ip", args...); err != nil {
					log.Printf("route to node %s: %v", n.Metadata.Name, err)
				}
			}
		}
	}
	return nil
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	hostIP := os.Getenv("HOST_IP")
	if hostIP == "" {
		log.Fatal("HOST_IP is not set")
	}
	var subnets []string
	for _, subnet := range strings.Split(os.Getenv("POD_SUBNET"), ",") {
		if subnet = strings.TrimSpace(subnet); subnet != "" {
			subnets = append(subnets, subnet)
		}
	}
	client, err := newAPIClient()
	if err != nil {
		log.Fatal(err)
	}
	mtu := mtuOf(hostIP)
	log.Printf("kindnetd: node %s, pod subnets %v, MTU %d", hostIP, subnets, mtu)
	for {
		if err := ensureMasquerade(subnets); err != nil {
			log.Printf("masquerade: %v", err)
		}
		if err := sync(client, hostIP, mtu); err != nil {
			log.Printf("sync: %v", err)
		}
		time.Sleep(resyncInterval)
	}
}
