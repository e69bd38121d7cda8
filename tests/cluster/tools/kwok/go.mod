// Tools module for the kwok controller (fake nodes for the scale bench and its fixture,
// tests/cluster/kwok.py): tests/cluster/build.sh adds `tool sigs.k8s.io/kwok/cmd/kwok` at
// KWOK_VERSION and builds it. A module of its own: kwok pins its own k8s.io/* versions.
module lorenz.invalid/tests/cluster/tools/kwok

go 1.26.0
