/* SPDX-License-Identifier: MIT */
/* What the two libraries of test_hpp_dso_poll export. */
#ifndef PERCPUREF_TESTS_DSO_POLL_REG_H
#define PERCPUREF_TESTS_DSO_POLL_REG_H

#include <percpuref/percpuref.hpp>

#define DSO_POLL_API __attribute__((visibility("default")))

/* make.cpp */
DSO_POLL_API percpuref::poll_registration *make_registration();
/* use.cpp: poll()'s return, or the errno value it threw */
DSO_POLL_API int poll_registration(percpuref::poll_registration *reg);
DSO_POLL_API void destroy_registration(percpuref::poll_registration *reg);

/* The same for dlsym() (test_hpp_dlopen_poll: the two as plugins). */
extern "C" {
DSO_POLL_API void *dso_poll_make();
DSO_POLL_API int dso_poll_poll(void *reg);
DSO_POLL_API void dso_poll_destroy(void *reg);
}

#endif
