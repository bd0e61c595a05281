#!/usr/bin/env bash
# Installs rbgctl on a systemd host: the binary, the units, the rbgctl user, /etc/rbgctl with
# the environment files the units read (existing ones are kept) and the example configs, and,
# with --secret, a fresh cluster secret readable by the rbgctl user alone, which the
# environment files it installs then name (RBGCTL_AUTH_TOKEN_FILE); with --disk-tier DIR, a
# store disk tier in DIR, which the unit may write (ProtectSystem=strict keeps everything else
# read-only: a drop-in adds ReadWritePaths=DIR).
#
#   cargo build --release && sudo scripts/install-systemd.sh [--secret] [--disk-tier DIR]
#   scripts/install-systemd.sh --destdir DIR [--bin PATH]     # into a staging tree (packaging)
#
# Then: edit /etc/rbgctl/<role>.env, `systemctl daemon-reload`, `systemctl enable --now
# rbgctl-master` (and rbgctl-store, rbgctl-router where they run).
set -euo pipefail
cd "$(dirname "$0")/.."

destdir=""
bin=target/release/rbgctl
secret=0
disk_tier=""
while [ $# -gt 0 ]; do
    case "$1" in
        --destdir) destdir=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --secret) secret=1; shift ;;
        --disk-tier) disk_tier=$2; shift 2 ;;
        *) echo "usage: $0 [--destdir DIR] [--bin PATH] [--secret] [--disk-tier DIR]" >&2; exit 2 ;;
    esac
done
case "$disk_tier" in
    ""|/*) ;;
    *) echo "--disk-tier $disk_tier: give an absolute path" >&2; exit 2 ;;
esac
if [ ! -x "$bin" ]; then
    echo "$bin: no such program (cargo build --release, or --bin PATH)" >&2
    exit 1
fi

install -D -m 0755 "$bin" "$destdir/usr/local/bin/rbgctl"
for unit in manifests/systemd/*.service; do
    install -D -m 0644 "$unit" "$destdir/etc/systemd/system/$(basename "$unit")"
done
install -D -m 0644 manifests/systemd/rbgctl.sysusers "$destdir/usr/lib/sysusers.d/rbgctl.conf"
install -d -m 0755 "$destdir/etc/rbgctl" "$destdir/etc/rbgctl/examples"
install -m 0644 config/*.toml "$destdir/etc/rbgctl/examples/"
# On the live system, the user first: the files below are given to its group.
if [ -z "$destdir" ] && command -v systemd-sysusers >/dev/null; then
    systemd-sysusers /usr/lib/sysusers.d/rbgctl.conf
fi
owner() {
    if [ -z "$destdir" ] && id rbgctl >/dev/null 2>&1; then chown "$@"; fi
}
unwired=""
for env in config/env/*.env; do
    target="$destdir/etc/rbgctl/$(basename "$env")"
    if [ -e "$target" ]; then
        echo "kept $target"
        if [ "$secret" = 1 ] && grep -q '^#RBGCTL_AUTH_TOKEN_FILE=' "$env" \
            && ! grep -q '^RBGCTL_AUTH_TOKEN_FILE=' "$target"; then
            unwired="$unwired $target"
        fi
    else
        install -m 0640 "$env" "$target"
        owner root:rbgctl "$target"
        # --secret means authenticated: the roles that hold the secret name it.
        if [ "$secret" = 1 ]; then
            sed -i 's|^#RBGCTL_AUTH_TOKEN_FILE=|RBGCTL_AUTH_TOKEN_FILE=|' "$target"
        fi
        if [ -n "$disk_tier" ] && [ "$(basename "$env")" = store.env ]; then
            printf '%s\n' "# The disk tier (scripts/install-systemd.sh --disk-tier); set its size too." \
                "RBGCTL_STORE_DISK_TIER=$disk_tier" "#RBGCTL_STORE_DISK_TIER_SIZE=200GiB" >> "$target"
        fi
    fi
done
if [ -n "$disk_tier" ]; then
    dropin="$destdir/etc/systemd/system/rbgctl-store.service.d/disk-tier.conf"
    install -d -m 0755 "$(dirname "$dropin")"
    printf '%s\n' "# Written by scripts/install-systemd.sh --disk-tier: the store's disk tier." \
        "[Service]" "ReadWritePaths=$disk_tier" > "$dropin"
    install -d -m 0700 "$destdir$disk_tier"
    owner rbgctl:rbgctl "$destdir$disk_tier"
    echo "wrote $dropin: the store may write $disk_tier"
fi
if [ "$secret" = 1 ]; then
    token="$destdir/etc/rbgctl/token"
    if [ -e "$token" ]; then
        echo "kept $token"
    else
        (umask 077 && head -c 32 /dev/urandom | base64 > "$token")
        owner rbgctl:rbgctl "$token"
        echo "wrote $token: copy it to every host of the cluster (mode 600, owner rbgctl)"
    fi
    for target in $unwired; do
        echo "WARNING: $target was kept and does not name the secret: add" >&2
        echo "  RBGCTL_AUTH_TOKEN_FILE=/etc/rbgctl/token" >&2
    done
fi
echo "installed under ${destdir:-/}: edit /etc/rbgctl/<role>.env, then systemctl daemon-reload"
echo "and systemctl enable --now rbgctl-master (rbgctl-store, rbgctl-router where they run)"
