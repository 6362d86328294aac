#!/usr/bin/env bash
# Install Debian's chromium (for the headless-browser leaderboard test) when it is missing.
# Idempotent and quiet: does nothing when a chromium binary is already on PATH.
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  command -v "$b" >/dev/null 2>&1 && exit 0
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: no apt-get here; install chromium yourself (the browser test will skip)" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
