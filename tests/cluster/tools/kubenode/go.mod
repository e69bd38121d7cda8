// Tools module for the test node's Kubernetes binaries (kubelet, kube-scheduler), built from
// k8s.io/kubernetes by tests/cluster/build.sh exactly like tools/kube (same generated require
// and staging replaces, so the two share Go's build cache).
//
// NB: a module of its own, not two more commands in tools/kube: build.sh stamps each binary
// with a hash of its tools module, and adding files to tools/kube would make the control
// plane's binaries look stale and rebuild for nothing.
module lorenz.invalid/tests/cluster/tools/kubenode

go 1.26.0
