#!/bin/sh
# The official image builds Redis with protected mode off, so other containers can reach it
# without a configuration file; Debian's binary has it on.
set -e
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
fi
exec "$@"
