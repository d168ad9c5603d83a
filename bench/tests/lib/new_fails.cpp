// SPDX-License-Identifier: MIT
/*
 * new_fails.cpp - an LD_PRELOAD shim for cli.sh: every operator new fails
 * as it does when memory runs out, with std::bad_alloc (the array and
 * nothrow forms call this one).
 */
#include <cstddef>
#include <new>

void *operator new(std::size_t size)
{
	(void)size;
	throw std::bad_alloc();
}
