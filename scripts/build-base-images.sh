#!/usr/bin/env bash
# Builds the base image rbgctl's Dockerfile runs on, from Debian's packages, for machines that
# cannot pull from a registry: `debootstrap --variant=minbase` into a folder, trimmed, then
# `docker import`ed under a name of the project's own (never over an image of Debian's that
# may be there).
#
#   sudo scripts/build-base-images.sh [TAG]   # TAG defaults to rbgctl-base:bookworm
#
# The image carries what the runtime stage would otherwise apt-get: tini (PID 1),
# ca-certificates, and rdma-core's user libraries (ibverbs-providers: libibverbs1 and the
# providers, which the RDMA data path loads). Set DEBIAN_MIRROR to use another mirror, FORCE=1
# to rebuild an existing tag; an image of an older recipe (its label) is rebuilt.
# Needs root (debootstrap) and a Docker engine.
set -euo pipefail

TAG=${1:-rbgctl-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${DEBIAN_SUITE:-bookworm}

PACKAGES=tini,ca-certificates,ibverbs-providers
RECIPE="2 $PACKAGES"
have=$(docker image inspect -f '{{index .Config.Labels "rbgctl.base-recipe"}}' "$TAG" 2>/dev/null || true)
if [ "$have" = "$RECIPE" ] && [ -z "${FORCE:-}" ]; then
    echo "base image $TAG exists (FORCE=1 rebuilds it)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "the base image $TAG is missing, and building it needs root (debootstrap): run" >&2
    echo "  sudo $0${1:+ $1}" >&2
    echo "once (about a minute), or have Docker's debian:bookworm-slim present, which" >&2
    echo "scripts/build-image.sh uses instead" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && apt-get install -y -qq debootstrap
fi

root=$(mktemp -d /tmp/rbgctl-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $SUITE (minbase) from $MIRROR into $root"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >/dev/null

# Slim, as Debian's own -slim images: no docs, man pages, locales or package lists.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
    "$root"/var/cache/debconf/*-old "$root"/var/log/*.log
# Images get their resolver from the engine at run time.
: > "$root"/etc/resolv.conf
: > "$root"/etc/hostname

tar --numeric-owner -C "$root" -c . \
    | docker import \
        --change 'CMD ["bash"]' \
        --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase, built locally by rbgctl's scripts/build-base-images.sh\"" \
        --change "LABEL rbgctl.base-recipe=\"$RECIPE\"" \
        - "$TAG" >/dev/null
echo "built $TAG: $(docker image inspect "$TAG" --format '{{.Size}}') bytes"
