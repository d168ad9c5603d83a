/* SPDX-License-Identifier: MIT */
/* One library of test_hpp_dso_poll: it makes the registration. */
#include "reg.h"

percpuref::poll_registration *make_registration()
{
	return new percpuref::poll_registration;
}

void *dso_poll_make()
{
	return make_registration();
}
