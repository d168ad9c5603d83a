# SPDX-License-Identifier: MIT
# preamble.sh - sourced by each bench/tests/NAME.sh (not a test itself:
# the harness tests are the *.sh one level up).  Sets bench (the binary,
# $1), python, a failure count, a scratch directory removed at exit, and
# finish, which ends the script: status 1 after any failure.
set -u
bench=$1
python=/usr/bin/python3
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

finish() {
	if [ "$fails" -ne 0 ]; then
		echo "$fails failure(s)"
		exit 1
	fi
	exit 0
}
