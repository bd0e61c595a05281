#!/usr/bin/env bash
# Builds the rbgctl image from this tree, offline and with Docker's legacy builder:
#
#   scripts/build-image.sh [TAG] [docker build flags...]     # TAG defaults to rbgctl:VERSION
#
# 1. the base: RUNTIME if given; else Docker's own debian:bookworm-slim when present (pulled
#    from a registry); else rbgctl-base:bookworm, built from Debian's packages when missing
#    (scripts/build-base-images.sh, the one step that needs root: this script says so);
# 2. the release binary (`cargo build --release --locked`, as the user who called sudo when
#    run under sudo), unless PREBUILT names one already built (a path inside this tree, e.g.
#    PREBUILT=target/release/rbgctl after a build of your own);
# 3. the binary without its debug sections (target/docker/rbgctl: 130 MB less in the image);
# 4. `docker build`, with the OCI labels `revision` (git) and `created` (now) filled in.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-rbgctl:$version}
shift || true

recipe() { docker image inspect -f '{{index .Config.Labels "rbgctl.base-recipe"}}' "$1" 2>/dev/null; }
if [ -z "${RUNTIME:-}" ]; then
    # Debian's own image (no recipe label of ours) when it is there; else the project's.
    if docker image inspect debian:bookworm-slim >/dev/null 2>&1 \
        && [ -z "$(recipe debian:bookworm-slim)" ]; then
        RUNTIME=debian:bookworm-slim
    else
        RUNTIME=rbgctl-base:bookworm
        scripts/build-base-images.sh "$RUNTIME"
    fi
fi
if [ -z "${PREBUILT:-}" ]; then
    if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ]; then
        # Under sudo: build as the user, not as root (target/ stays theirs).
        sudo -u "$SUDO_USER" -- cargo build --release --locked
    else
        cargo build --release --locked
    fi
    PREBUILT=target/release/rbgctl
fi
# The image gets the binary without its debug sections (symbols stay, for backtraces).
mkdir -p target/docker
stripped=target/docker/rbgctl
if ! objcopy --strip-debug "$PREBUILT" "$stripped" 2>/dev/null; then
    cp "$PREBUILT" "$stripped"
fi
PREBUILT=$stripped
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
    revision="$revision-dirty"
fi
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
docker build -t "$tag" \
    --build-arg "RUNTIME=$RUNTIME" \
    --build-arg "PREBUILT=$PREBUILT" \
    --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$created" \
    "$@" .
echo "built $tag ($PREBUILT on $RUNTIME, revision $revision)"
