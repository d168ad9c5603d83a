// SPDX-License-Identifier: MIT
/*
 * attr_affinity_fails.c - an LD_PRELOAD shim for cli.sh: every
 * pthread_attr_setaffinity_np() fails as glibc's does when it cannot
 * allocate its copy of the CPU set (ENOMEM), and sets nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>

int pthread_attr_setaffinity_np(pthread_attr_t *attr, size_t size, const cpu_set_t *set)
{
	(void)attr;
	(void)size;
	(void)set;
	return ENOMEM;
}
