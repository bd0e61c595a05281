#!/bin/sh
# The image's entrypoint (under tini): `docker run IMAGE --help` or `docker run IMAGE store ...`
# are rbgctl's own arguments; `docker run IMAGE rbgctl ...`, `mooncake_master ...` or any other
# program on the PATH runs as given.
set -e
if [ "$#" -eq 0 ]; then
    exec rbgctl --help
fi
case "$1" in
    -*) exec rbgctl "$@" ;;
esac
if command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec rbgctl "$@"
