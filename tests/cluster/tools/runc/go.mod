// Tools module for the test node's OCI runtime: tests/cluster/build.sh adds `tool
// github.com/opencontainers/runc` at RUNC_VERSION and builds it with CGO and `-tags seccomp`
// (Debian's libseccomp-dev, from scripts/install-node-deps).
module lorenz.invalid/tests/cluster/tools/runc

go 1.26.0
