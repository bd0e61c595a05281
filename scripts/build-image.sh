#!/usr/bin/env bash
# Builds the rbgctl image from this tree, offline and with Docker's legacy builder:
#
#   scripts/build-image.sh [TAG] [docker build flags...]     # TAG defaults to rbgctl:VERSION
#
# 1. the base image, from Debian's packages, if it is missing (scripts/build-base-images.sh);
# 2. the release binary (`cargo build --release --locked`), unless PREBUILT names one already
#    built (a path inside this tree);
# 3. `docker build`, with the OCI labels `revision` (git) and `created` (now) filled in.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-rbgctl:$version}
shift || true

scripts/build-base-images.sh
if [ -z "${PREBUILT:-}" ]; then
    cargo build --release --locked
    PREBUILT=target/release/rbgctl
fi
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
    revision="$revision-dirty"
fi
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
docker build -t "$tag" \
    --build-arg "PREBUILT=$PREBUILT" \
    --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$created" \
    "$@" .
echo "built $tag ($PREBUILT, revision $revision)"
