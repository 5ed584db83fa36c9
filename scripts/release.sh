#!/usr/bin/env bash
# Builds the release archives of sluice: one per platform, each holding the
# binary (pure Go, -trimpath, the version and the commit stamped), LICENSE,
# README.md and CHANGELOG.md, and SHA256SUMS over them. docs/releasing.md
# has the whole release.
#
#   scripts/release.sh [-o DIR] [-p PLATFORMS] [VERSION]
#
# VERSION: default git describe of the last vX.Y.Z tag (client/ tags are
# the client module's). A release version, vX.Y.Z, needs a clean work tree
# and its section in CHANGELOG.md; anything else (v0.2.0-rc.1, a describe
# output) is built as it is.
# -o DIR: where the archives go, empty or new; default dist/VERSION,
# emptied first.
# -p PLATFORMS: GOOS/GOARCH pairs, space-separated; default
# "linux/amd64 linux/arm64 darwin/arm64".
# Needs go, git, GNU tar, gzip and sha256sum (a Linux machine).
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
platforms="linux/amd64 linux/arm64 darwin/arm64"
while getopts "o:p:" opt; do
  case $opt in
    o) out=$OPTARG ;;
    p) platforms=$OPTARG ;;
    *) echo "usage: $0 [-o DIR] [-p PLATFORMS] [VERSION]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -gt 1 ]; then
  echo "usage: $0 [-o DIR] [-p PLATFORMS] [VERSION]" >&2
  exit 2
fi

version=${1:-$(git describe --tags --match 'v[0-9]*' --always --dirty)}
if ! [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ || $version =~ ^[0-9a-f]{7,40}(-dirty)?$ ]]; then
  echo "release: version $version: want vX.Y.Z (a tag), vX.Y.Z-suffix or a commit" >&2
  exit 2
fi
revision=$(git rev-parse HEAD)
dirty=""
if [ -n "$(git status --porcelain)" ]; then
  dirty=yes
  revision="$revision-dirty"
fi
if [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  if ! grep -q "^## \[${version#v}\]" CHANGELOG.md; then
    echo "release: CHANGELOG.md has no section \"## [${version#v}] - date\" for $version; add one" >&2
    exit 1
  fi
  if [ -n "$dirty" ]; then
    echo "release: $version from a work tree with uncommitted changes (git status); commit or stash them" >&2
    exit 1
  fi
fi

if [ -z "$out" ]; then
  out=dist/$version
  rm -rf "$out"
elif [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "release: -o $out is not empty; give an empty or new directory" >&2
  exit 2
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Archives made twice from one commit are the same bytes: fixed times,
# owners and order.
mtime=$(git log -1 --format=%ct)

for platform in $platforms; do
  goos=${platform%/*}
  goarch=${platform#*/}
  if [ -z "$goos" ] || [ -z "$goarch" ] || [ "$goos/$goarch" != "$platform" ]; then
    echo "release: platform $platform: want GOOS/GOARCH, such as linux/amd64" >&2
    exit 2
  fi
  name="sluice-$version-$goos-$goarch"
  mkdir "$work/$name"
  echo "release: building $name" >&2
  CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch go build -trimpath \
    -ldflags "-s -w -X main.version=$version -X main.revision=$revision" \
    -o "$work/$name/sluice" ./cmd/sluice
  cp LICENSE README.md CHANGELOG.md "$work/$name/"
  tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" \
    -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
done

(cd "$out" && sha256sum -- *.tar.gz >SHA256SUMS)
echo "release: $version ($revision) in $out:" >&2
cat "$out/SHA256SUMS" >&2
