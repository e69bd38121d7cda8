// Command netpol enforces NetworkPolicy on the test node (tests/cluster/enforcer.py) with
// kube-network-policies' own policy engine. Only the packet steering is ours.
//
// Upstream's dataplane (pkg/dataplane) steers the first packet of each connection to an
// nfqueue with nftables' `queue` expression; this host's kernel has no nft_queue (and no
// /lib/modules to load it from), so its rule sync fails. The xtables NFQUEUE target works here
// through iptables-nft, so this command installs iptables rules of its own (NEW connections from
// or to the Pod subnet, in FORWARD and INPUT, `--queue-bypass`) and hands every queued packet to
// upstream's networkpolicy.PolicyEngine, built exactly as upstream's standard command builds it.
// Packets it does not see (established connections, the node's own traffic) pass.
//
// What it leaves out of upstream's dataplane: strict mode (re-checking established connections
// when a policy changes: conntrack flushes) and the conntrack-label shortcut. A policy applies
// to connections opened after the enforcer saw it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kube-network-policies/pkg/api"
	"sigs.k8s.io/kube-network-policies/pkg/network"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
	"sigs.k8s.io/kube-network-policies/pkg/podinfo"
)

// chain is ours alone: FORWARD and INPUT jump to it, and stopping removes exactly that.
const chain = "LORENZ-NETPOL"

func main() {
	os.Exit(run())
}

func run() int {
	var (
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the enforcer's user")
		nodeName   = flag.String("hostname-override", "", "the Node whose Pods are enforced")
		podCIDR    = flag.String("pod-cidr", "", "the node's Pod subnet: traffic from or to it is steered")
		queueID    = flag.Int("nfqueue-id", 100, "nfqueue number")
		readyFile  = flag.String("ready-file", "", "written once policies are enforced")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *podCIDR == "" {
		fmt.Fprintln(os.Stderr, "netpol: --kubeconfig, --hostname-override and --pod-cidr are required")
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		logger.Error(err, "kubeconfig")
		return 1
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		logger.Error(err, "client")
		return 1
	}
	engine, err := newEngine(ctx, clientset, *nodeName)
	if err != nil {
		logger.Error(err, "policy engine")
		return 1
	}
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true,
		func(context.Context) (bool, error) { return engine.Ready(), nil }); err != nil {
		logger.Error(err, "the policy engine never became ready")
		return 1
	}

	queue, err := nfqueue.Open(&nfqueue.Config{
		NfQueue:      uint16(*queueID),
		Flags:        nfqueue.NfQaCfgFlagGSO,
		MaxPacketLen: 128, // headers only
		MaxQueueLen:  1024,
		Copymode:     nfqueue.NfQnlCopyPacket,
		WriteTimeout: 100 * time.Millisecond,
	})
	if err != nil {
		logger.Error(err, "nfqueue open")
		return 1
	}
	defer queue.Close()
	judge := func(a nfqueue.Attribute) int {
		verdict := nfqueue.NfDrop
		packet, err := network.ParsePacket(*a.Payload)
		if err != nil {
			logger.Error(err, "unparsable packet dropped", "id", *a.PacketID)
		} else {
			packet.ID = *a.PacketID
			allowed, err := engine.EvaluatePacket(ctx, &packet)
			if err != nil {
				logger.Error(err, "evaluation failed; packet dropped", "packet", packet)
			} else if allowed {
				verdict = nfqueue.NfAccept
			}
			logger.V(2).Info("verdict", "packet", packet, "accept", verdict == nfqueue.NfAccept)
		}
		if err := queue.SetVerdict(*a.PacketID, verdict); err != nil {
			logger.Error(err, "set verdict", "id", *a.PacketID)
		}
		return 0
	}
	onError := func(err error) int {
		if opError, ok := err.(*netlink.OpError); ok && (opError.Timeout() || opError.Temporary()) {
			return 0
		}
		logger.Info("nfqueue receive", "error", err)
		return 0
	}
	if err := queue.RegisterWithErrorFunc(ctx, judge, onError); err != nil {
		logger.Error(err, "nfqueue register")
		return 1
	}

	// NB: the queue is bound before any packet is steered to it, and --queue-bypass lets
	// packets through while nobody listens (before start, after a stop or a crash): the
	// node never blackholes its Pods because the enforcer is down.
	if err := steer(*podCIDR, *queueID); err != nil {
		logger.Error(err, "installing the steering rules")
		unsteer()
		return 1
	}
	defer unsteer()
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			logger.Error(err, "ready file")
			return 1
		}
	}
	logger.Info("enforcing NetworkPolicy", "node", *nodeName, "podCIDR", *podCIDR, "queue", *queueID)
	<-ctx.Done()
	logger.Info("stopping: removing the steering rules")
	return 0
}

// newEngine builds upstream's policy engine as its standard command does (informer-based Pod
// resolution; NRI is off: containerd's NRI socket would be the host's /var/run/nri).
func newEngine(ctx context.Context, clientset kubernetes.Interface, nodeName string) (*networkpolicy.PolicyEngine, error) {
	factory := informers.NewSharedInformerFactory(clientset, 0)
	namespaces := factory.Core().V1().Namespaces()
	policies := factory.Networking().V1().NetworkPolicies()
	pods := factory.Core().V1().Pods()
	resolver, err := podinfo.NewInformerResolver(pods.Informer())
	if err != nil {
		return nil, err
	}
	provider := podinfo.NewInformerProvider(pods, namespaces, nil, []podinfo.IPResolver{resolver})
	evaluators := []api.PolicyEvaluator{}
	if klog.V(2).Enabled() {
		evaluators = append(evaluators, networkpolicy.NewLoggingPolicy())
	}
	evaluators = append(evaluators, networkpolicy.NewStandardNetworkPolicy(nodeName, namespaces, pods, policies))
	factory.Start(ctx.Done())
	return networkpolicy.NewPolicyEngine(provider, evaluators), nil
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// steer sends the first packet of every connection from or to the Pod subnet to the queue:
// FORWARD sees Pod-to-Pod traffic (bridged, so only with bridge-nf-call-iptables on) and
// INPUT Pod-to-node traffic (the node's address, the API server's forwarder).
func steer(podCIDR string, queueID int) error {
	// NB: bridged frames skip iptables unless this is on (it is per network namespace).
	if err := os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("bridge-nf-call-iptables: %w", err)
	}
	unsteer()
	queue := []string{"-m", "conntrack", "--ctstate", "NEW", "-j", "NFQUEUE",
		"--queue-num", strconv.Itoa(queueID), "--queue-bypass"}
	steps := [][]string{
		{"-N", chain},
		append([]string{"-A", chain, "-s", podCIDR}, queue...),
		append([]string{"-A", chain, "-d", podCIDR}, queue...),
		{"-I", "FORWARD", "1", "-j", chain},
		{"-I", "INPUT", "1", "-j", chain},
	}
	for _, step := range steps {
		if err := iptables(step...); err != nil {
			return err
		}
	}
	return nil
}

// unsteer removes what steer installed; each step may fail when there is nothing to remove.
func unsteer() {
	_ = iptables("-D", "FORWARD", "-j", chain)
	_ = iptables("-D", "INPUT", "-j", chain)
	_ = iptables("-F", chain)
	_ = iptables("-X", chain)
}
