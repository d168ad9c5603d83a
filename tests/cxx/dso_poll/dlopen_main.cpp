/* SPDX-License-Identifier: MIT */
/*
 * test_hpp_dso_poll's two libraries as plugins: loaded with
 * dlopen(RTLD_LOCAL), built with -fvisibility=hidden and, by GCC, with
 * -fno-gnu-unique (as plugins that must unload are).  Neither sees the
 * other's symbols, so each has its own copy of whatever the header defines
 * inline: a registration that one makes on this thread must still be this
 * thread's to the other, which polls and destroys it.  The header's
 * exported thread_local could not do it (a copy per plugin; it does only
 * where GCC made it a unique symbol): the poll threw EPERM and the
 * destruction left the thread registered, "destroyed on another thread".
 */
#include <dlfcn.h>

#include <cerrno>

#include <percpuref/percpu_ref.h>

#include "tap.h"

int main(int argc, char **argv)
{
	void *make, *use;

	if (argc != 3)
		return 2;
	make = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	use = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!ok(make && use, "both plugins load: %s", make && use ? "yes" : dlerror()))
		return done_testing();
	auto make_reg = reinterpret_cast<void *(*)()>(dlsym(make, "dso_poll_make"));
	auto poll_reg = reinterpret_cast<int (*)(void *)>(dlsym(use, "dso_poll_poll"));
	auto destroy_reg = reinterpret_cast<void (*)(void *)>(dlsym(use, "dso_poll_destroy"));
	if (!ok(make_reg && poll_reg && destroy_reg, "their functions found"))
		return done_testing();

	void *reg = make_reg();

	is(poll_reg(reg), 0, "the other plugin polls this thread's registration");
	destroy_reg(reg);
	is(percpu_ref_poll(0), -EPERM, "and its destruction unregisters the thread");
	return done_testing();
}
