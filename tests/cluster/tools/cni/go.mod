// Tools module for the test node's pod network: tests/cluster/build.sh adds `tool` directives
// for the bridge, host-local and loopback CNI plugins at CNI_PLUGINS_VERSION (CGO_ENABLED=0).
module lorenz.invalid/tests/cluster/tools/cni

go 1.26.0
