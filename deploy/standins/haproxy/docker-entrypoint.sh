#!/bin/sh
# As the official image: master-worker (-W), in the foreground, logging to stdout (-db).
set -e
if [ "$1" = haproxy ]; then
  shift
  set -- haproxy -W -db "$@"
fi
exec "$@"
