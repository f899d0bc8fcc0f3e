#!/usr/bin/env bash
# Proves the compose fleet end to end on a Docker engine (about 6 minutes here, 10 from
# nothing): brings it up with the lab doors and Prometheus (docker compose up --build --wait;
# every service but Grafana), runs the demo against it, checks the public door's X-Forwarded-For
# rule, runs the failure drills (Redis stopped; a replica restarted, stopped, cut off from the
# backend network; every replica cut off from Redis), asks Prometheus every query of the
# Grafana dashboard, prints a table of what each saw, tears everything down, and exits non-zero
# on any failure.
# The drills are in deploy/e2e/main.go.
#
#   deploy/e2e.sh               on a machine that can pull the official images
#   deploy/e2e.sh --standins    on one that cannot: first builds local stand-ins under the
#                               official names (deploy/standins/README.md); never use it where
#                               the real images can be pulled
#
# It needs ports 8080, 8081 and 6380 free on 127.0.0.1, and Go for the demo and the drills. It
# does not run in .ci/run: run it whenever deploy/, the Dockerfile or a compose file changes.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
for a in "$@"; do
  case "$a" in
    --standins) deploy/standins/build.sh ;;
    *) args+=("$a") ;;
  esac
done
docker compose version >/dev/null 2>&1 || { echo "e2e: needs a Docker engine with Compose v2" >&2; exit 1; }
exec go run ./deploy/e2e "${args[@]}"
