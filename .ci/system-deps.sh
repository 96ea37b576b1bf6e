#!/usr/bin/env bash
# Installs the Debian packages the tests use (listed in .ci/apt-packages.txt), once. Runs apt-get
# as root, or through sudo for any other user (`make system-deps`).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
while read -r pkg; do
  case "$pkg" in ''|'#'*) continue;; esac
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done < .ci/apt-packages.txt
if [ ${#missing[@]} -eq 0 ]; then
  echo "== system-deps: Debian packages already installed"
  exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "system-deps: not root and no sudo: install these Debian packages as root: ${missing[*]}" >&2
    exit 1
  fi
  # a terminal can answer sudo's password prompt; CI (no terminal) needs password-less sudo
  if [ -t 0 ]; then as_root=(sudo); else as_root=(sudo -n); fi
fi
# another apt-get or dpkg (unattended-upgrades, a second `make test`) holds the dpkg lock: wait for
# it (up to 10 min; apt-get prints "Waiting for cache lock") instead of failing at once
apt_opts=(-o DPkg::Lock::Timeout=600)
echo "== system-deps: installing Debian packages (usually 1-2 min; waits up to 10 min for another apt-get): ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
