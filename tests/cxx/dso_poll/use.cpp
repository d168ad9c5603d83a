/* SPDX-License-Identifier: MIT */
/* The other library of test_hpp_dso_poll: it polls and destroys it. */
#include <system_error>

#include "reg.h"

int poll_registration(percpuref::poll_registration *reg)
{
	try {
		return static_cast<int>(reg->poll());
	} catch (const std::system_error &e) {
		return e.code().value();
	}
}

void destroy_registration(percpuref::poll_registration *reg)
{
	delete reg;
}

int dso_poll_poll(void *reg)
{
	return poll_registration(static_cast<percpuref::poll_registration *>(reg));
}

void dso_poll_destroy(void *reg)
{
	destroy_registration(static_cast<percpuref::poll_registration *>(reg));
}
