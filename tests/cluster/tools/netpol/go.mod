// Tools module for the test node's NetworkPolicy enforcement: tests/cluster/build.sh adds
// `tool sigs.k8s.io/kube-network-policies/cmd` at KUBE_NETWORK_POLICIES_VERSION and builds it
// (CGO_ENABLED=0: nftables and NFQUEUE through netlink, no `nft` binary). A module of its own:
// it pins its own k8s.io/* versions.
module lorenz.invalid/tests/cluster/tools/netpol

go 1.26.0
