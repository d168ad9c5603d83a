#!/usr/bin/env bash
# Installs what building, testing, benchmarking and plotting need, from
# Debian 12 packages, when any of it is missing.  Needs root (or sudo).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config liburcu-dev valgrind spin
          python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
