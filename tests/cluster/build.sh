#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy, because no prebuilt release
# binary can be downloaded here and there is no Docker for kind: kube-apiserver,
# kube-controller-manager and kubectl from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3,
# and the helm CLI (the control plane); kubelet and kube-scheduler from k8s.io/kubernetes,
# containerd v2 with its runc shim and ctr, runc, the bridge/host-local/loopback CNI plugins and
# a tiny sandbox ("pause") command, and a NetworkPolicy enforcer around kube-network-policies'
# policy engine (the test node, tests/cluster/node.py and enforcer.py); the kwok controller
# from sigs.k8s.io/kwok, with the Stage files of its module (fake nodes: tests/cluster/kwok.py).
# Pins live in tests/cluster/versions.env.
#
# Output: ${LORENZ_K8S_CACHE:-$HOME/.cache/lorenz/k8s}/<K8S_VERSION>/bin/, outside the checkout.
# Each binary has a stamp (its pin plus a hash of its tools module); when every stamp matches,
# this script exits at once without touching Go, so ./scripts/bootstrap can call it on every run.
# The first build is long (tens of minutes on 2 cores): it runs the builds one after another
# (they each use every core), logs to <cache>/<version>/build.log and prints each build's time.
#
#   tests/cluster/build.sh            build what is missing or stale
#   tests/cluster/build.sh --print    print the bin directory and exit
set -euo pipefail
# NB: without inherit_errexit a failure inside $(…) (e.g. `dir=$(prepare_kube)`) does not stop
# the function running in it, and the build goes on with a half-generated module.
shopt -s inherit_errexit

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache_root=${LORENZ_K8S_CACHE:-$HOME/.cache/lorenz/k8s}
out=$cache_root/$K8S_VERSION
bin=$out/bin
stamps=$bin/.stamps

if [ "${1:-}" = --print ]; then
  echo "$bin"
  exit 0
fi

# name -> tools module directory; the order is the build order (etcd and the apiserver first:
# they are what most cluster tests need; the node's binaries last).
names=(etcd kube-apiserver kube-controller-manager kubectl helm
  kube-scheduler kubelet containerd containerd-shim-runc-v2 ctr runc pause
  bridge host-local loopback netpol kwok)
module_of() {
  case "$1" in
    etcd) echo etcd ;;
    kube-apiserver | kube-controller-manager | kubectl) echo kube ;;
    helm) echo helm ;;
    kube-scheduler | kubelet) echo kubenode ;;
    containerd | containerd-shim-runc-v2 | ctr) echo containerd ;;
    runc) echo runc ;;
    pause) echo pause ;;
    bridge | host-local | loopback) echo cni ;;
    netpol) echo netpol ;;
    kwok) echo kwok ;;
  esac
}
pin_of() {
  case "$(module_of "$1")" in
    etcd) echo "etcd=$ETCD_VERSION" ;;
    kube | kubenode) echo "kubernetes=$K8S_VERSION" ;;
    helm) echo "helm=$HELM_VERSION" ;;
    containerd) echo "containerd=$CONTAINERD_VERSION" ;;
    runc) echo "runc=$RUNC_VERSION" ;;
    pause) echo "pause=local" ;;
    cni) echo "cni-plugins=$CNI_PLUGINS_VERSION" ;;
    netpol) echo "kube-network-policies=$NETWORK_POLICIES_VERSION" ;;
    kwok) echo "kwok=$KWOK_VERSION" ;;
  esac
}
# What a binary's stamp must say: its pin and a hash of the sources that produce it (hashed once
# per module and run: the fast path below must stay well under a second).
declare -A module_hash=()
for mod in $(for n in "${names[@]}"; do module_of "$n"; done | sort -u); do
  module_hash[$mod]=$(cd "$here/tools/$mod" && find . -type f | LC_ALL=C sort | xargs cat |
    sha256sum | cut -c1-16)
done
want_stamp() {
  printf '%s %s\n' "$(pin_of "$1")" "${module_hash[$(module_of "$1")]}"
}
is_fresh() {
  [ -x "$bin/$1" ] && [ -f "$stamps/$1" ] && [ "$(cat "$stamps/$1")" = "$(want_stamp "$1")" ] &&
    { [ "$1" != kwok ] || [ -f "$bin/kwok-stages/pod-ready.yaml" ]; }
}
all_fresh() {
  local n
  for n in "${names[@]}"; do is_fresh "$n" || return 1; done
}

# Fast path: nothing to do (no lock, no Go).
if all_fresh; then exit 0; fi

mkdir -p "$bin" "$stamps"
# NB: other checkouts on this machine may run ./scripts/bootstrap at the same time; the lock
# makes a second caller wait for the first build instead of racing it on the same files.
exec 9>"$out/.lock"
if ! flock -n 9; then
  echo "tests/cluster/build.sh: another build holds $out/.lock; waiting for it…" >&2
  flock 9
fi
if all_fresh; then exit 0; fi

go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$go" ] || { echo "tests/cluster/build.sh: no Go toolchain (need Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
log=$out/build.log
work=$out/work
times=$out/build-times.txt
echo "tests/cluster/build.sh: building the test cluster ($K8S_VERSION, etcd $ETCD_VERSION," \
  "helm $HELM_VERSION, containerd $CONTAINERD_VERSION, runc $RUNC_VERSION," \
  "CNI plugins $CNI_PLUGINS_VERSION, kube-network-policies $NETWORK_POLICIES_VERSION) into" \
  "$bin; log: $log" >&2
echo "== $(date -u +%FT%TZ) build.sh start: $("$go" version), $(nproc) cores" >>"$log"
set -E
trap '[ "$BASH_SUBSHELL" != 0 ] || {
  echo "tests/cluster/build.sh: FAILED (line $LINENO); last lines of $log:" >&2
  tail -n 40 "$log" >&2
}' ERR

# Copies a tools module to a fresh scratch directory and prints its path.
scratch_copy() {
  local mod=$1 dir=$work/$1
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -R "$here/tools/$mod/." "$dir/"
  echo "$dir"
}

# Generates a Kubernetes tools module (kube, kubenode): require k8s.io/kubernetes and one replace per staging module, the
# list taken from the tag's own go.mod (its `require ... v0.0.0` entries that it replaces with
# ./staging/src/k8s.io/<name>), each pointed at the published v0.<minor>.<patch>.
prepare_kube() { # module
  local mod=$1 dir gomod staging n=0 name
  dir=$(scratch_copy "$mod")
  gomod=$("$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  staging=$("$go" mod edit -json "$gomod" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
zero = {r["Path"] for r in mod.get("Require") or [] if r["Version"] == "v0.0.0"}
local = {r["Old"]["Path"] for r in mod.get("Replace") or []
         if r["New"]["Path"].startswith("./staging/src/")}
# Every v0.0.0 require must be one k/k points at its staging tree (a few staging modules, e.g.
# sample-controller, are replaced without being required: nothing imports them).
if not zero or not zero <= local:
    sys.exit(f"unexpected k8s.io/kubernetes go.mod: v0.0.0 requires not from staging: "
             f"{sorted(zero - local)}")
print("\n".join(sorted(zero)))
')
  local ver=${K8S_VERSION#v1.}
  (
    cd "$dir"
    "$go" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    for name in $staging; do
      "$go" mod edit -replace="$name=$name@v0.$ver"
      n=$((n + 1))
    done
    echo "$mod module: $n staging replaces => v0.$ver" >&2
    "$go" mod tidy
  ) >>"$log" 2>&1
  echo "$dir"
}

prepare_tool() { # module, version, tool package...
  local dir mod=$1 version=$2 pkg
  shift 2
  dir=$(scratch_copy "$mod")
  local args=()
  for pkg in "$@"; do args+=("$pkg@$version"); done
  (cd "$dir" && "$go" get -tool "${args[@]}" && "$go" mod tidy) >>"$log" 2>&1
  echo "$dir"
}

# A tools module whose main.go imports a library's packages: require the library at its pin.
prepare_library() { # module, module path@version
  local dir
  dir=$(scratch_copy "$1")
  (cd "$dir" && "$go" get "$2" && "$go" mod tidy) >>"$log" 2>&1
  echo "$dir"
}

# One scratch module per tools module and build.sh run: the binaries of one module (the three
# Kubernetes ones, containerd's three, the CNI plugins) share its generated go.mod and build cache.
declare -A prepared=()
prepared_dir() { # module; sets $dir (not printed: a subshell would lose the cache)
  local mod=$1
  if [ -z "${prepared[$mod]:-}" ]; then
    case "$mod" in
      kube | kubenode) prepared[$mod]=$(prepare_kube "$mod") ;;
      containerd)
        local c=github.com/containerd/containerd/v2/cmd
        prepared[$mod]=$(prepare_tool containerd "$CONTAINERD_VERSION" \
          "$c/containerd" "$c/containerd-shim-runc-v2" "$c/ctr")
        ;;
      runc) prepared[$mod]=$(prepare_tool runc "$RUNC_VERSION" github.com/opencontainers/runc) ;;
      cni)
        local p=github.com/containernetworking/plugins/plugins
        prepared[$mod]=$(prepare_tool cni "$CNI_PLUGINS_VERSION" \
          "$p/main/bridge" "$p/ipam/host-local" "$p/main/loopback")
        ;;
      pause) prepared[$mod]=$(scratch_copy pause) ;;
      netpol)
        prepared[$mod]=$(prepare_library netpol \
          "sigs.k8s.io/kube-network-policies@$NETWORK_POLICIES_VERSION")
        ;;
      kwok) prepared[$mod]=$(prepare_tool kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok) ;;
    esac
  fi
  dir=${prepared[$mod]}
}

kube_ldflags() {
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local date # the tag's commit time, so rebuilds are reproducible
  date=$("$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json,sys; print(json.load(open(json.load(sys.stdin)["Info"]))["Time"])')
  local flags="-s -w" pkg
  # NB: without these the binaries say v0.0.0-master: helm then rejects charts whose kubeVersion
  # constraint wants >= 1.x, and kubectl warns about version skew.
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$flags"
}

# The kwok controller has no Stages built in (only kwokctl embeds them): copy the ones the fake
# nodes need from the pinned module (node-initialize; the "fast" Pod Stages: Running at once,
# deleted at once) next to the binary, where tests/cluster/kwok.py reads them.
kwok_stages() {
  local src
  src=$("$go" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$bin/kwok-stages"
  mkdir -p "$bin/kwok-stages"
  cp "$src/kustomize/stage/node/fast/node-initialize.yaml" \
    "$src/kustomize/stage/pod/fast/pod-ready.yaml" \
    "$src/kustomize/stage/pod/fast/pod-delete.yaml" "$bin/kwok-stages/"
  chmod 0644 "$bin/kwok-stages/"*.yaml
}

build_one() { # name
  local name=$1 mod dir target ldflags start end cgo=0 tags=
  mod=$(module_of "$name")
  start=$(date +%s.%N)
  echo "== $(date -u +%FT%TZ) $name ($(pin_of "$name"))" >>"$log"
  ldflags="-s -w"
  case "$mod" in
    kube | kubenode)
      prepared_dir "$mod"
      target=./cmd/$name
      ldflags=$(kube_ldflags)
      ;;
    etcd)
      dir=$(prepare_tool etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3)
      target=go.etcd.io/etcd/server/v3
      ;;
    helm)
      local major=${HELM_VERSION%%.*}
      local helm_mod=helm.sh/helm
      [ "$major" = v2 ] || helm_mod="$helm_mod/$major"
      dir=$(prepare_tool helm "$HELM_VERSION" "$helm_mod/cmd/helm")
      target=$helm_mod/cmd/helm
      ldflags+=" -X $helm_mod/internal/version.version=$HELM_VERSION"
      ldflags+=" -X $helm_mod/internal/version.gitTreeState=clean"
      ;;
    containerd)
      prepared_dir containerd
      target=github.com/containerd/containerd/v2/cmd/$name
      ;;
    runc)
      # NB: runc needs cgo and the seccomp build tag (libseccomp-dev): without seccomp every
      # container the kubelet asks for fails with "seccomp not supported".
      prepared_dir runc
      target=github.com/opencontainers/runc
      cgo=1
      tags=seccomp
      ldflags+=" -X main.version=${RUNC_VERSION#v}"
      ;;
    pause)
      prepared_dir pause
      target=.
      ;;
    netpol)
      # NB: our main around upstream's policy engine (tools/netpol/main.go says why upstream's
      # own command cannot run on this kernel).
      prepared_dir netpol
      target=.
      ;;
    kwok)
      prepared_dir kwok
      target=sigs.k8s.io/kwok/cmd/kwok
      ;;
    cni)
      prepared_dir cni
      case "$name" in
        host-local) target=github.com/containernetworking/plugins/plugins/ipam/$name ;;
        *) target=github.com/containernetworking/plugins/plugins/main/$name ;;
      esac
      ;;
  esac
  if [ "$mod" = kwok ]; then kwok_stages; fi
  (cd "$dir" && CGO_ENABLED=$cgo "$go" build -trimpath -tags="$tags" -ldflags="$ldflags" \
    -o "$bin/.$name.tmp" "$target") >>"$log" 2>&1
  mv -f "$bin/.$name.tmp" "$bin/$name"
  want_stamp "$name" >"$stamps/$name"
  end=$(date +%s.%N)
  local took
  took=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.0f}")' "$start" "$end")
  printf '%s %s %ss (%s, %s MiB)\n' "$(date -u +%FT%TZ)" "$name" "$took" "$(pin_of "$name")" \
    "$(($(stat -c %s "$bin/$name") / 1048576))" | tee -a "$times" "$log" >&2
}

total_start=$(date +%s)
for n in "${names[@]}"; do
  if is_fresh "$n"; then continue; fi
  build_one "$n"
done
echo "tests/cluster/build.sh: done in $(($(date +%s) - total_start))s; binaries in $bin" \
  "(times: $times)" >&2
