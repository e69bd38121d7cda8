// Tools module for the test control plane's etcd: tests/cluster/build.sh adds
// `tool go.etcd.io/etcd/server/v3` at ETCD_VERSION (server/v3's root package is etcd's main) and
// builds it. Kept apart from the Kubernetes module so the two dependency graphs never meet.
module lorenz.invalid/tests/cluster/tools/etcd

go 1.26.0
