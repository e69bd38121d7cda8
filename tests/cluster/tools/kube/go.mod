// Tools module for the test control plane's Kubernetes binaries (kube-apiserver,
// kube-controller-manager, kubectl), built from k8s.io/kubernetes by tests/cluster/build.sh.
//
// NB: deliberately incomplete. build.sh copies this module to a scratch directory in the cache,
// adds `require k8s.io/kubernetes <K8S_VERSION>` plus one `replace k8s.io/<staging> =>
// k8s.io/<staging> v0.<minor>.<patch>` per staging module listed in that tag's own go.mod (the
// `require ... v0.0.0` entries that k/k replaces with ./staging/src/...), then runs go mod tidy.
// k/k's own replaces are ignored in a dependency, so without them the build fails with
// "unknown revision v0.0.0". Generating the list keeps it exact for every tag.
module lorenz.invalid/tests/cluster/tools/kube

go 1.26.0
