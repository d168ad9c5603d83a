#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What percpuref.hpp must refuse at compile time, each with its own
# message, and what it must still accept: an unpublish() that
# rcu_refcounted<T> cannot call (private, no friend: it was skipped, and
# readers found the freed object), a T whose destructor may throw (it
# terminated the process inside the C library's put) or is private (the
# message said "must not throw"), a standard before C++17 (a wall of
# template errors), and what it must accept: a build without exceptions
# (it did not compile), the managed API (make_managed's flush and
# settings) with this header alone.  Usage: check_hpp_refusals.sh CXX INCLUDE_DIR
set -u
cxx=$1
include=$2
status=0
prelude='#include <percpuref/percpuref.hpp>'

# check WANT NAME FLAGS SOURCE [MESSAGE]: compile SOURCE with FLAGS; WANT
# is "accepted", or "refused" with MESSAGE among the diagnostics.
check() {
  want=$1 name=$2 flags=$3 src=$4 msg=${5:-}
  out=$(printf '%s\n%s\n' "$prelude" "$src" |
        "$cxx" -std=c++17 -fsyntax-only $flags -I"$include" -x c++ - 2>&1)
  got=$?
  if [ "$want" = accepted ] && [ $got -eq 0 ]; then
    echo "ok - $name: accepted"
  elif [ "$want" = refused ] && [ $got -ne 0 ] && grep -qF "$msg" <<<"$out"; then
    echo "ok - $name: refused ($msg)"
  else
    echo "not ok - $name: want $want${msg:+ ($msg)}, compiler said: $out"
    status=1
  fi
}

check refused "private unpublish, no friend" "" '
struct entry : percpuref::rcu_refcounted<entry> {
private:
	void unpublish() noexcept {}
};
auto p = percpuref::make_managed<entry>();' "make it public or befriend rcu_refcounted<T>"
check accepted "private unpublish, friend" "" '
struct entry : percpuref::rcu_refcounted<entry> {
private:
	friend class percpuref::rcu_refcounted<entry>;
	void unpublish() noexcept {}
};
auto p = percpuref::make_managed<entry>();'
check accepted "no unpublish" "" '
struct entry : percpuref::rcu_refcounted<entry> {};
auto p = percpuref::make_managed<entry>();'
check refused "throwing destructor" "" '
struct conn : percpuref::refcounted<conn> {
	~conn() noexcept(false) {}
};
auto o = percpuref::make_owner<conn>();' "destructor must not throw"
check refused "private destructor" "" '
class conn : public percpuref::refcounted<conn> {
	~conn() = default;
};
auto o = percpuref::make_owner<conn>();' "destructor must be public"
check refused "C++14" "-std=c++14" '' "percpuref.hpp needs C++17"
# ... and that alone: the rest of the header added 20 to 40 errors.
errors=$(printf '%s\n' "$prelude" |
	 "$cxx" -std=c++14 -fsyntax-only -I"$include" -x c++ - 2>&1 | grep -c 'error:')
if [ "$errors" = 1 ]; then
	echo "ok - C++14: one error"
else
	echo "not ok - C++14: $errors errors, want 1"
	status=1
fi
check accepted "managed API through the header" "" '
int flush() { return percpu_ref_managed_flush(); }'
check accepted "-fno-exceptions" "-fno-exceptions" '
struct conn : percpuref::refcounted<conn> {};
auto o = percpuref::make_owner<conn>();'
exit $status
