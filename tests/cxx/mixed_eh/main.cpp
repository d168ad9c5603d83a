/* SPDX-License-Identifier: MIT */
/*
 * One program, two exception modes: noeh.cpp is built with
 * -fno-exceptions, this file with exceptions, and both instantiate
 * make_owner<conn>.  Built without optimisation, so that the calls are not
 * inlined: the linker kept one make_owner<conn> for both units, the first
 * one it saw (noeh.cpp's, which aborts), and an init failure here aborted
 * instead of throwing std::bad_alloc.  The header's inline
 * namespace per mode gives the two copies different names.
 */
#include <new>

#include "conn.h"
#include "tap.h"

/* src/internal.h: the allocation after this many more fails; and the
 * spare impls freed, this thread's among them. */
extern "C" void percpuref_fault_fail_nth_alloc(long nth);
extern "C" void percpuref_test_spares_drop(void);

int main()
{
	bool caught = false;

	ok(noeh_make_and_kill(), "the -fno-exceptions unit makes an owner");
	/* Its ref's exit may have run here and kept the impl for this
	 * thread's next init, which then allocates nothing to refuse (1 run
	 * in 70 failed so). */
	percpuref_test_spares_drop();
	percpuref_fault_fail_nth_alloc(1);
	try {
		auto own = percpuref::make_owner<conn>();
	} catch (const std::bad_alloc &) {
		caught = true;
	}
	percpuref_fault_fail_nth_alloc(0);
	ok(caught, "an init failure in the unit with exceptions throws std::bad_alloc");
	return done_testing();
}
