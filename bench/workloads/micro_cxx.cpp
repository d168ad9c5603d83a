/* SPDX-License-Identifier: MIT */
/*
 * micro_cxx.cpp - the ref_ptr variant of the micro workload: what C++ code
 * pays for a shared reference through <percpuref/percpuref.hpp>, beside
 * std::shared_ptr (micro_shared_ptr.cpp).
 *
 * Copying a percpuref::ref_ptr is percpu_ref_get and destroying the copy
 * is percpu_ref_put: one rseq add on this CPU's counter each, inlined into
 * the loop here, no shared line written.  The object is owned
 * (make_owner); teardown kills the owner and checks that the release
 * deletes the object exactly when the last ref_ptr goes.
 */
#include <cstdlib>
#include <exception>
#include <new>

#include <percpuref/percpuref.hpp>

#include "bench.h"
#include "micro_cxx.h"

namespace {

int deleted;	/* objects deleted; one measurement at a time */

struct shared_object : percpuref::refcounted<shared_object> {
	~shared_object() { deleted++; }
};

/* On its own aligned block: the ref_ptr (read by all) shares no line. */
struct micro_handle {
	percpuref::owner<shared_object> owner;
	percpuref::ref_ptr<shared_object> shared;
};

} /* namespace */

void *micro_ref_ptr_new(void)
{
	auto *h = new (bench_zalloc(sizeof(micro_handle))) micro_handle();

	try {
		h->owner = percpuref::make_owner<shared_object>();
	} catch (const std::exception &e) {
		bench_die("micro ref_ptr: make_owner: %s", e.what());
	}
	h->shared = h->owner.share();
	return h;
}

void micro_ref_ptr_pairs(void *handle, unsigned int n)
{
	const auto &shared = static_cast<const micro_handle *>(handle)->shared;

	for (unsigned int i = 0; i < n; i++) {
		percpuref::ref_ptr<shared_object> copy(shared);	/* percpu_ref_get */
	}							/* percpu_ref_put */
}

int micro_ref_ptr_delete(void *handle)
{
	auto *h = static_cast<micro_handle *>(handle);
	int before = deleted;

	h->owner.kill();
	percpu_ref_barrier();
	if (deleted != before)
		return -1;	/* freed while the shared ref_ptr held it */
	h->shared.reset();
	h->~micro_handle();
	free(h);
	return deleted == before + 1 ? 0 : -1;
}
