/* SPDX-License-Identifier: MIT */
/* The type both units of test_hpp_mixed_eh make owners of. */
#ifndef PERCPUREF_TESTS_MIXED_EH_CONN_H
#define PERCPUREF_TESTS_MIXED_EH_CONN_H

#include <percpuref/percpuref.hpp>

struct conn : percpuref::refcounted<conn> {
	int id = 0;
};

/* noeh.cpp, built with -fno-exceptions. */
bool noeh_make_and_kill();

#endif
