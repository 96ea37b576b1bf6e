#!/usr/bin/env bash
# Installs the Debian packages the tests use (listed in .ci/apt-packages.txt), once.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
while read -r pkg; do
  case "$pkg" in ''|'#'*) continue;; esac
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done < .ci/apt-packages.txt
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
