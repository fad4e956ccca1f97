#!/usr/bin/env bash
# Builds the Kubernetes control plane that the Kubernetes backend's tests
# run on loopback: kube-apiserver and kube-controller-manager from the Go
# module k8s.io/kubernetes, at the version matching keyway's client-go.
# The binaries are cached outside the repository, keyed by version, and the
# script does nothing when they are already there. It prints the directory.
#
#   scripts/kube-testserver.sh            # build (about 10 minutes the first time)
#   KUBE_TEST_BIN=$(scripts/kube-testserver.sh) KEYWAY_SLOW_TESTS=1 go test ./integration -run Kube
#
# etcd comes from Debian (apt-get install etcd-server); .ci/run installs it.
set -euo pipefail
version="${KUBE_VERSION:-v1.37.2}"
staging="v0.${version#v1.}"
minor=$(echo "$version" | cut -d. -f2)
out="${KUBE_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keyway/kube/$version}"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ]; then
  echo "$out"; exit 0
fi
mkdir -p "$out"
modcache=$(go env GOMODCACHE)
GOFLAGS=-mod=mod go mod download k8s.io/kubernetes@"$version" >&2
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
src="$work/k8s"
cp -r "$modcache/k8s.io/kubernetes@$version" "$src"
chmod -R u+w "$src"
cd "$src"
rm -f go.work go.work.sum
# The module's go.mod points k8s.io/* at ./staging, which the module zip
# does not contain: point them at the matching published modules instead.
sed -i -E "s#^\t(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+\$#\t\1 => \1 $staging#" go.mod
ldflags="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
for cmd in kube-apiserver kube-controller-manager; do
  echo "== building $cmd $version" >&2
  GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$out/$cmd.tmp" "./cmd/$cmd" >&2
  mv "$out/$cmd.tmp" "$out/$cmd"
done
echo "$out"
