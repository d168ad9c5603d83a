/* SPDX-License-Identifier: MIT */
/*
 * Compiler helpers shared by the public headers.  Everything here is plain
 * GNU C that also compiles as C++ (the headers are tested with g++ -pedantic):
 * the shared state is accessed through __atomic builtins rather than C11
 * _Atomic, which C++17 does not accept.
 */
#ifndef PERCPUREF_COMPILER_H
#define PERCPUREF_COMPILER_H

/* Every public header includes this one: the version macros come with any. */
#include <percpuref/version.h>

/*
 * 64-bit only.  Counts, biases and saturation zones are unsigned long
 * arithmetic around 2^63 (PERCPU_COUNT_BIAS = 2^63 - 2^32), and the fast
 * path's asm reads the 64-bit mode word with movq: with a 32-bit long
 * (i386, arm32) or 32-bit pointers (x32) it would compile and miscount.
 */
#if !defined(__LP64__) || __SIZEOF_LONG__ != 8 || __SIZEOF_POINTER__ != 8
#error "percpuref needs a 64-bit (LP64) target: 32-bit and x32 builds are not supported"
#endif

#define PERCPUREF_API __attribute__((visibility("default")))
#define percpuref_likely(x) __builtin_expect(!!(x), 1)
#define percpuref_unlikely(x) __builtin_expect(!!(x), 0)
#define PERCPUREF_CACHELINE 64
/* Keeps the compiler from moving memory accesses across it; no CPU fence. */
#define percpuref_barrier() __asm__ __volatile__("" ::: "memory")

#ifdef __cplusplus
/*
 * The C headers' casts and NULLs are C's: clang++ reports them under
 * -Wold-style-cast and -Wzero-as-null-pointer-constant, which C++ users
 * build with (g++ does not), so their declarations are exempt.
 */
#define PERCPUREF_BEGIN_DECLS						\
	_Pragma("GCC diagnostic push")					\
	_Pragma("GCC diagnostic ignored \"-Wold-style-cast\"")		\
	_Pragma("GCC diagnostic ignored \"-Wzero-as-null-pointer-constant\"") \
	extern "C" {
#define PERCPUREF_END_DECLS } _Pragma("GCC diagnostic pop")
#else
#define PERCPUREF_BEGIN_DECLS
#define PERCPUREF_END_DECLS
#endif

#endif
