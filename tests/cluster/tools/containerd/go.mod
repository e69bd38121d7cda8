// Tools module for the test node's container runtime: tests/cluster/build.sh adds `tool`
// directives for containerd, its runc shim and ctr at CONTAINERD_VERSION and builds them with
// CGO_ENABLED=0. Kept apart from the Kubernetes module so the two dependency graphs never meet.
module lorenz.invalid/tests/cluster/tools/containerd

go 1.26.0
