/* SPDX-License-Identifier: MIT */
/*
 * A poll_registration made in one shared library, built with
 * -fvisibility=hidden as plugins are, and polled and destroyed on the
 * same thread by another: both must see it as this thread's.  The header
 * tells the registering thread by a thread_local, of which each such
 * library had a copy of its own: the other's poll threw EPERM and its
 * destruction left the thread registered.
 */
#include <cerrno>

#include <percpuref/percpu_ref.h>

#include "reg.h"
#include "tap.h"

int main()
{
	percpuref::poll_registration *reg = make_registration();

	is(poll_registration(reg), 0, "the other library polls this thread's registration");
	destroy_registration(reg);
	is(percpu_ref_poll(0), -EPERM, "and its destruction unregisters the thread");
	return done_testing();
}
