#!/usr/bin/env bash
# Builds the stand-in base images (README.md beside this file) under the official names that
# docker-compose.yml and the Dockerfile use. A test aid for machines without an image registry:
# never run it where the real images can be pulled. Idempotent: an image already built is kept
# (-f builds again); --remove deletes them all.
set -euo pipefail
cd "$(dirname "$0")"
root=../..
base=pixlimit-standin/debian:bookworm

# The names to stand in for, read from the files that use them, so they cannot drift apart.
image_of() { sed -n "s|^ *image: *\($1:[^ ]*\).*|\1|p" "$root/${2:-docker-compose.yml}" | head -n 1; }
from_of() { sed -n "s|^FROM *\($1[^ ]*\).*|\1|p" "$root/Dockerfile" | head -n 1; }
declare -A names=(
  [redis]=$(image_of redis) [postgres]=$(image_of postgres) [haproxy]=$(image_of haproxy)
  [golang]=$(from_of golang) [distroless]=$(from_of gcr.io/distroless/static)
  [prometheus]=$(image_of prom/prometheus docker-compose.observability.yml)
)
for k in "${!names[@]}"; do
  [ -n "${names[$k]}" ] || { echo "standins: no $k image named in a compose file or the Dockerfile" >&2; exit 1; }
done

force=""
case "${1:-}" in
  -f) force=1 ;;
  --remove) docker image rm -f "$base" "${names[@]}"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [-f | --remove]" >&2; exit 2 ;;
esac
# Every stand-in carries the hash of what built it (this script, its directory, and for golang
# the host's Go): an image under an official name whose label differs (stale, or not ours) is
# rebuilt, never trusted.
self=$(pwd)/$(basename "$0")
hash_of() { (sha256sum <"$self"; find "$@" -type f -print0 | sort -z | xargs -0 -r sha256sum) | sha256sum | cut -c1-16; }
label=pixlimit.standin
have() {
  [ -z "$force" ] && [ "$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$1" 2>/dev/null)" = "$2" ]
}

base_hash=$(hash_of /dev/null)
if ! have "$base" "$base_hash"; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "standins: debootstrap bookworm (a few minutes)"
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
  cat >"$rootfs/etc/apt/sources.list" <<'SOURCES'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  # mktemp -d made the root 0700, and tar keeps it: a USER other than root (the redis image's)
  # could then reach no file at all ("executable file not found in $PATH").
  chmod 755 "$rootfs"
  tar -C "$rootfs" -c . | docker import --change "LABEL $label=$base_hash" - "$base" >/dev/null
  rm -rf "$rootfs"
fi

for k in redis postgres haproxy distroless prometheus; do
  h=$( (hash_of "$k"; echo "$base_hash") | sha256sum | cut -c1-16) # a new base rebuilds them all
  have "${names[$k]}" "$h" && continue
  echo "standins: ${names[$k]}"
  docker build -q --build-arg BASE="$base" --label "$label=$h" -t "${names[$k]}" "$k" >/dev/null
done

go_hash=$( (hash_of golang; go env GOVERSION; echo "$base_hash") | sha256sum | cut -c1-16)
if ! have "${names[golang]}" "$go_hash"; then
  echo "standins: ${names[golang]} (the host's Go, $(go env GOVERSION))"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  cp golang/Dockerfile "$ctx/"
  cp -r "$(go env GOROOT)" "$ctx/go"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
  docker build -q --build-arg BASE="$base" --label "$label=$go_hash" -t "${names[golang]}" "$ctx" >/dev/null
  rm -rf "$ctx"
fi
echo "standins: ready: ${names[*]}"
