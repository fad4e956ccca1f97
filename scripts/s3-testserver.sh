#!/usr/bin/env bash
# Builds the S3-compatible server the audit sink's tests run on loopback:
# SeaweedFS's `weed`, from the Go module github.com/seaweedfs/seaweedfs
# (its go.mod has a replace directive, so it is built inside a copy of the
# module, not with go install). The binary is cached outside the
# repository, keyed by version; the script does nothing when it is there
# already. It prints the directory.
#
#   scripts/s3-testserver.sh              # build (about 20 minutes the first time)
#   S3_TEST_BIN=$(scripts/s3-testserver.sh) KEYWAY_SLOW_TESTS=1 go test ./integration -run S3
set -euo pipefail
version="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
out="${S3_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keyway/seaweedfs/$version}"
if [ -x "$out/weed" ]; then
  echo "$out"; exit 0
fi
mkdir -p "$out"
GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$version" >/dev/null
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
src="$work/sw"
cp -r "$(go env GOMODCACHE)/github.com/seaweedfs/seaweedfs@$version" "$src"
chmod -R u+w "$src"
cd "$src"
rm -f go.work go.work.sum
echo "== building weed $version" >&2
GOWORK=off GOFLAGS=-mod=mod go build -o "$out/weed.tmp" ./weed >&2
mv "$out/weed.tmp" "$out/weed"
echo "$out"
