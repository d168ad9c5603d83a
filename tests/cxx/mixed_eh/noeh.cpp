/* SPDX-License-Identifier: MIT */
/*
 * Built with -fno-exceptions (and listed first, so that its copies of the
 * templates are the ones a linker keeps when the names clash).
 */
#include "conn.h"

bool noeh_make_and_kill()
{
	auto own = percpuref::make_owner<conn>();

	return static_cast<bool>(own);
}
