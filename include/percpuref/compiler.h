/*
 * Compiler helpers shared by the public headers.  Everything here is plain
 * GNU C that also compiles as C++ (the headers are tested with g++ -pedantic):
 * the shared state is accessed through __atomic builtins rather than C11
 * _Atomic, which C++17 does not accept.
 */
#ifndef PERCPUREF_COMPILER_H
#define PERCPUREF_COMPILER_H

#define PERCPUREF_API __attribute__((visibility("default")))
#define percpuref_likely(x) __builtin_expect(!!(x), 1)
#define percpuref_unlikely(x) __builtin_expect(!!(x), 0)
#define PERCPUREF_CACHELINE 64
/* Keeps the compiler from moving memory accesses across it; no CPU fence. */
#define percpuref_barrier() __asm__ __volatile__("" ::: "memory")

#ifdef __cplusplus
#define PERCPUREF_BEGIN_DECLS extern "C" {
#define PERCPUREF_END_DECLS }
#else
#define PERCPUREF_BEGIN_DECLS
#define PERCPUREF_END_DECLS
#endif

#endif
