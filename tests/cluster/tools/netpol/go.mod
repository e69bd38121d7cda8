// Tools module for the test node's NetworkPolicy enforcer (main.go): tests/cluster/build.sh
// requires sigs.k8s.io/kube-network-policies at NETWORK_POLICIES_VERSION and builds it with
// CGO_ENABLED=0. A module of its own: upstream pins its own k8s.io/* v0.36, which must never
// meet the node's k8s.io/kubernetes graph.
module lorenz.invalid/tests/cluster/tools/netpol

go 1.26.0
