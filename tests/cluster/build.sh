#!/usr/bin/env bash
# Builds the test control plane's binaries from the Go module proxy, because no prebuilt release
# binary can be downloaded here and there is no Docker for kind: kube-apiserver,
# kube-controller-manager and kubectl from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3,
# and the helm CLI. Pins live in tests/cluster/versions.env.
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
# they are what most cluster tests need).
names=(etcd kube-apiserver kube-controller-manager kubectl helm)
module_of() {
  case "$1" in
    etcd) echo etcd ;;
    kube-apiserver | kube-controller-manager | kubectl) echo kube ;;
    helm) echo helm ;;
  esac
}
pin_of() {
  case "$(module_of "$1")" in
    etcd) echo "etcd=$ETCD_VERSION" ;;
    kube) echo "kubernetes=$K8S_VERSION" ;;
    helm) echo "helm=$HELM_VERSION" ;;
  esac
}
# What a binary's stamp must say: its pin and a hash of the sources that produce it.
want_stamp() {
  local mod
  mod=$(module_of "$1")
  printf '%s %s\n' "$(pin_of "$1")" \
    "$(cd "$here/tools/$mod" && find . -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
}
is_fresh() {
  [ -x "$bin/$1" ] && [ -f "$stamps/$1" ] && [ "$(cat "$stamps/$1")" = "$(want_stamp "$1")" ]
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
echo "tests/cluster/build.sh: building the test control plane ($K8S_VERSION, etcd $ETCD_VERSION," \
  "helm $HELM_VERSION) into $bin; log: $log" >&2
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

# Generates the kube module: require k8s.io/kubernetes and one replace per staging module, the
# list taken from the tag's own go.mod (its `require ... v0.0.0` entries that it replaces with
# ./staging/src/k8s.io/<name>), each pointed at the published v0.<minor>.<patch>.
prepare_kube() {
  local dir gomod staging n=0 name
  dir=$(scratch_copy kube)
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
    echo "kube module: $n staging replaces => v0.$ver" >&2
    "$go" mod tidy
  ) >>"$log" 2>&1
  echo "$dir"
}

prepare_tool() { # module, tool package, version
  local dir
  dir=$(scratch_copy "$1")
  (cd "$dir" && "$go" get -tool "$2@$3" && "$go" mod tidy) >>"$log" 2>&1
  echo "$dir"
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

build_one() { # name
  local name=$1 mod dir target ldflags start end
  mod=$(module_of "$name")
  start=$(date +%s.%N)
  echo "== $(date -u +%FT%TZ) $name ($(pin_of "$name"))" >>"$log"
  case "$mod" in
    kube)
      dir=$kube_dir
      target=./cmd/$name
      ldflags=$(kube_ldflags)
      ;;
    etcd)
      dir=$(prepare_tool etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION")
      target=go.etcd.io/etcd/server/v3
      ldflags="-s -w"
      ;;
    helm)
      local major=${HELM_VERSION%%.*}
      local helm_mod=helm.sh/helm
      [ "$major" = v2 ] || helm_mod="$helm_mod/$major"
      dir=$(prepare_tool helm "$helm_mod/cmd/helm" "$HELM_VERSION")
      target=$helm_mod/cmd/helm
      ldflags="-s -w -X $helm_mod/internal/version.version=$HELM_VERSION"
      ldflags+=" -X $helm_mod/internal/version.gitTreeState=clean"
      ;;
  esac
  (cd "$dir" && "$go" build -trimpath -ldflags="$ldflags" -o "$bin/.$name.tmp" "$target") \
    >>"$log" 2>&1
  mv -f "$bin/.$name.tmp" "$bin/$name"
  want_stamp "$name" >"$stamps/$name"
  end=$(date +%s.%N)
  local took
  took=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.0f}")' "$start" "$end")
  printf '%s %s %ss (%s, %s MiB)\n' "$(date -u +%FT%TZ)" "$name" "$took" "$(pin_of "$name")" \
    "$(($(stat -c %s "$bin/$name") / 1048576))" | tee -a "$times" "$log" >&2
}

total_start=$(date +%s)
kube_dir=
for n in "${names[@]}"; do
  if is_fresh "$n"; then continue; fi
  if [ "$(module_of "$n")" = kube ] && [ -z "$kube_dir" ]; then
    # The three Kubernetes binaries share one generated module (and its build cache).
    kube_dir=$(prepare_kube)
  fi
  build_one "$n"
done
echo "tests/cluster/build.sh: done in $(($(date +%s) - total_start))s; binaries in $bin" \
  "(times: $times)" >&2
