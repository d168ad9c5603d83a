#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What percpuref.hpp must refuse at compile time, each with its own
# message, and what it must still accept: an unpublish() that
# rcu_refcounted<T> cannot call (private, no friend: it was skipped, and
# readers found the freed object; in a final T too, which must then say
# when it has none), a T whose destructor may throw (it
# terminated the process inside the C library's put) or is private (the
# message said "must not throw"), a standard before C++17 (a wall of
# template errors), and what it must accept: a build without exceptions
# (it did not compile), the managed API (make_managed's flush and
# settings) with this header alone; and in objects built with and without
# exceptions, the types the same and make_owner not.  Usage: check_hpp_refusals.sh CXX INCLUDE_DIR
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
# A class derived from a counted one: the release would delete it as its
# base (its destructor never run); the cast's own error named no reason.
check refused "derived from a counted class" "" '
struct base : percpuref::refcounted<base> {};
struct derived : base {};
auto o = percpuref::make_owner<derived>();' "T must derive from refcounted<T> or rcu_refcounted<T> itself"
check refused "derived from an rcu-counted class" "" '
struct base : percpuref::rcu_refcounted<base> {};
struct derived : base {};
auto p = percpuref::make_managed<derived>();' "T must derive from refcounted<T> or rcu_refcounted<T> itself"
check accepted "no unpublish" "" '
struct entry : percpuref::rcu_refcounted<entry> {};
auto p = percpuref::make_managed<entry>();'
# A final T: the probe that finds a private unpublish() cannot derive from
# it, and up to 0.4.6 such a T compiled and was never unpublished.
check refused "final, private unpublish, no friend" "" '
struct entry final : percpuref::rcu_refcounted<entry> {
private:
	void unpublish() noexcept {}
};
auto p = percpuref::make_managed<entry>();' "declare \`using percpuref_no_unpublish = void;\` in T"
check refused "final, no unpublish, not said" "" '
struct entry final : percpuref::rcu_refcounted<entry> {};
auto p = percpuref::make_managed<entry>();' "a final T"
check accepted "final, no unpublish, said" "" '
struct entry final : percpuref::rcu_refcounted<entry> {
	using percpuref_no_unpublish = void;
};
auto p = percpuref::make_managed<entry>();'
check accepted "final, public unpublish" "" '
struct entry final : percpuref::rcu_refcounted<entry> {
	void unpublish() noexcept {}
};
auto p = percpuref::make_managed<entry>();'
check accepted "final, private unpublish, friend" "" '
struct entry final : percpuref::rcu_refcounted<entry> {
private:
	friend class percpuref::rcu_refcounted<entry>;
	void unpublish() noexcept {}
};
auto p = percpuref::make_managed<entry>();'
# unpublish() runs inside the C library's callback: one that may throw
# would terminate the process there.
check refused "unpublish not noexcept" "" '
struct entry : percpuref::rcu_refcounted<entry> {
	void unpublish() {}
};
auto p = percpuref::make_managed<entry>();' "declare it noexcept"
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
# Mixed exception modes (a plugin built with -fno-exceptions): a type is
# one type in both, so a function taking a ref_ptr<conn> defined in one
# links from the other (up to 0.4.6 the plugin defined it for
# percpuref::noeh::ref_ptr<conn> and the program called it for
# percpuref::eh::ref_ptr<conn>), while make_owner, which throws or
# aborts, is one symbol per mode.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
compile() {	# OBJECT FLAGS SOURCE
  printf '%s\n%s\n' "$prelude" "$3" |
    "$cxx" -std=c++17 -c $2 -I"$include" -x c++ - -o "$scratch/$1" 2>&1
}
types='struct conn : percpuref::refcounted<conn> {};'
if compile plugin.o -fno-exceptions "$types
void submit(percpuref::ref_ptr<conn>) {}
percpuref::owner<conn> made() { return percpuref::make_owner<conn>(); }" &&
   compile program.o "" "$types
void submit(percpuref::ref_ptr<conn>);
void call(percpuref::ref_ptr<conn> p) { submit(p); }
percpuref::owner<conn> made_here() { return percpuref::make_owner<conn>(); }"; then
  defined=$(nm "$scratch/plugin.o" | awk '$2 == "T" && /submit/ { print $3 }')
  wanted=$(nm "$scratch/program.o" | awk '$1 == "U" && /submit/ { print $2 }')
  if [ -n "$defined" ] && [ "$defined" = "$wanted" ]; then
    echo "ok - mixed modes: ref_ptr<conn> is one type ($defined)"
  else
    echo "not ok - mixed modes: the plugin defines '$defined', the program wants '$wanted'"
    status=1
  fi
  plugin_make=$(nm "$scratch/plugin.o" | awk '/make_owner/ && $2 == "W" { print $3 }')
  program_make=$(nm "$scratch/program.o" | awk '/make_owner/ && $2 == "W" { print $3 }')
  if [ -n "$plugin_make" ] && [ -n "$program_make" ] && [ "$plugin_make" != "$program_make" ]; then
    echo "ok - mixed modes: make_owner<conn> is one symbol per mode"
  else
    echo "not ok - mixed modes: make_owner<conn> '$plugin_make' and '$program_make'"
    status=1
  fi
else
  echo "not ok - mixed modes: did not compile"
  status=1
fi
exit $status
