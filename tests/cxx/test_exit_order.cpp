/* SPDX-License-Identifier: MIT */
/*
 * At exit, the library finishes its pending releases before the static
 * objects that existed before its first use are destroyed: a T whose
 * destructor writes to such a global (a journal, a registry, a pool)
 * finds it alive.  The usual owner pattern leaves such a release pending:
 * an owner going out of scope at the end of main() kills asynchronously,
 * and the object is deleted on the library's callback thread.  The library
 * used to finish that work in its ELF destructor, which runs after every
 * static destructor: ~T wrote into a destroyed vector (ASan:
 * heap-use-after-free, 5 runs of 5).  Each scenario runs in a
 * child process, whose exit is what is tested.
 */
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <percpuref/managed.h>
#include <percpuref/percpuref.hpp>

#include "child.h"
#include "tap.h"

static std::atomic<int> destroyed;
static bool in_scenario;	/* a child's: the parent checks nothing at exit */

/* Constructed before main(), so before the library's first use. */
static struct journal {
	std::vector<std::string> lines;
	~journal()
	{
		/* The release must have run: the object wrote its line. */
		if (in_scenario && (destroyed.load() != 1 || lines.size() != 1))
			std::_Exit(3);
	}
} journal;

struct conn : percpuref::refcounted<conn> {
	~conn()
	{
		journal.lines.push_back("conn closed");
		destroyed++;
	}
};

/* The README's pattern: an owner local to main(), killed as main returns. */
static int mode_owner()
{
	auto own = percpuref::make_owner<conn>();
	auto user = own.share();
	return 0;
}

/* A managed object whose last reference goes as main returns. */
static int mode_managed()
{
	auto obj = percpuref::make_managed<conn>();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		in_scenario = true;
		if (!std::strcmp(argv[1], "--owner"))
			return mode_owner();
		if (!std::strcmp(argv[1], "--managed"))
			return mode_managed();
		return 2;
	}
	is(run_mode("--owner"), 0,
	   "exit: an owner killed at the end of main() is released before older statics die");
	is(run_mode("--managed"), 0,
	   "exit: a managed object dropped at the end of main() is released before them too");
	return done_testing();
}
