// Tools module for the helm CLI the chart tests use (lint, template, install): tests/cluster/build.sh
// adds `tool helm.sh/helm/<major>/cmd/helm` at HELM_VERSION and builds it. Kept apart from the
// Kubernetes module because helm pins its own k8s.io/client-go.
module lorenz.invalid/tests/cluster/tools/helm

go 1.26.0
