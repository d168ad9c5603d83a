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
static std::atomic<bool> journal_gone;
static bool in_scenario;	/* a child's: the parent checks nothing at exit */

/* Constructed before main(), so before the library's first use. */
static struct journal {
	std::vector<std::string> lines;
	~journal()
	{
		/* The release must have run: the object wrote its line. */
		if (in_scenario && (destroyed.load() != 1 || lines.size() != 1))
			std::_Exit(3);
		journal_gone = true;
	}
} journal;

/* A release after ~journal would write into the destroyed vector. */
static void closed(const char *what)
{
	if (journal_gone)
		std::_Exit(4);
	journal.lines.push_back(what);
	destroyed++;
}

struct conn : percpuref::refcounted<conn> {
	~conn() { closed("conn closed"); }
};

struct rcu_conn : percpuref::rcu_refcounted<rcu_conn> {
	~rcu_conn() { closed("rcu_conn closed"); }
};

/*
 * Statics declared after the journal, so destroyed before it, and empty
 * until main() fills them: constant-initialised, they exist before the
 * library's first use, and their destructors run after the library's
 * exit handler.  Their kill and their put came after it: up to 0.4.31 the
 * kill's release ran later on the callback thread, the managed object's
 * at the library's ELF destructor, both after ~journal (review 171).
 */
static percpuref::owner<conn> static_owner;
static percpuref::owner<rcu_conn> static_rcu_owner;
static percpuref::ref_ptr<conn> static_cached;
static percpuref::ref_ptr<rcu_conn> static_rcu_cached;

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
		if (!std::strcmp(argv[1], "--static-owner"))
			static_owner = percpuref::make_owner<conn>();
		else if (!std::strcmp(argv[1], "--static-rcu-owner"))
			static_rcu_owner = percpuref::make_owner<rcu_conn>();
		else if (!std::strcmp(argv[1], "--static-managed"))
			static_cached = percpuref::make_managed<conn>();
		else if (!std::strcmp(argv[1], "--static-rcu-managed"))
			static_rcu_cached = percpuref::make_managed<rcu_conn>();
		else
			return 2;
		return 0;
	}
	is(run_mode("--owner"), 0,
	   "exit: an owner killed at the end of main() is released before older statics die");
	is(run_mode("--managed"), 0,
	   "exit: a managed object dropped at the end of main() is released before them too");
	is(run_mode("--static-owner"), 0,
	   "exit: a static owner older than the library's first use: released in its destructor");
	is(run_mode("--static-rcu-owner"), 0,
	   "exit: likewise an rcu_refcounted one, its grace period included");
	is(run_mode("--static-managed"), 0,
	   "exit: a static ref_ptr to a managed object: released at its put");
	is(run_mode("--static-rcu-managed"), 0,
	   "exit: likewise to a managed rcu_refcounted object");
	return done_testing();
}
