/* SPDX-License-Identifier: MIT */
/*
 * topology.c - which CPUs the benchmark may use, and in which order threads
 * are placed on them.
 *
 * Scaling efficiency is only comparable across machines if threads are
 * placed the same way, so the order is fixed by the topology, not by CPU
 * numbers: fill one last-level-cache domain before the next (inside a
 * domain a contended line bounces through one L3; across domains through
 * the fabric, which is where the reports' efficiency dropped), and inside a
 * domain use one CPU of every physical core before any SMT sibling (two
 * hyperthreads share a core's pipeline and would halve the per-thread
 * figure for reasons that have nothing to do with the count).
 *
 * Sources, all sysfs: cpuN/cache/indexM/{level,shared_cpu_list} for the L3
 * domain, else cpuN/topology/package_cpus_list (one domain per socket),
 * else one domain; cpuN/topology/thread_siblings_list for the cores.  A CPU
 * is usable when it is online and in the process's affinity mask, so
 * `taskset -c 2-7 percpuref-bench ...` restricts the run as expected.
 * Masks are cpu_set_t: machines of up to CPU_SETSIZE (1024) CPUs.
 *
 * PERCPUREF_BENCH_SYSFS=DIR reads DIR in place of /sys/devices/system/cpu,
 * so a test can check the order on a machine it makes up (bench/tests/
 * topology.sh).  The affinity mask belongs to the real machine, so it is
 * ignored then: every CPU online in DIR is usable, which is good for
 * `percpuref-bench --topology` and nothing else.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const char *sysfs = "/sys/devices/system/cpu";

struct cpu_info {
	int cpu;
	int domain_key;	/* lowest CPU of its domain */
	int core_key;	/* lowest CPU of its core */
	int rank;	/* 0 for the core's lowest usable CPU, 1 for the next... */
};

/* A CPU number at @p (digits only: strtol() would skip blanks and a
 * newline, and take a sign) that a cpu_set_t holds, or -1: a list naming
 * CPU 1024 or more (or past a long) is not one this harness can use, where
 * it read "0-1024" as CPUs 0-1023. */
static long parse_cpu(const char *p, char **end)
{
	long cpu;

	if (*p < '0' || *p > '9')
		return -1;
	cpu = strtol(p, end, 10);
	return cpu < CPU_SETSIZE ? cpu : -1;
}

/*
 * Parse a sysfs CPU list ("0-3,8,10-11") into @set; false if unreadable,
 * malformed ("0-", "1-0", "x") or empty: the callers then fall back, or
 * refuse a made-up machine.
 */
static bool read_cpulist(const char *path, cpu_set_t *set)
{
	FILE *f = fopen(path, "r");
	char buf[4096], *p, *end;
	bool ok;

	CPU_ZERO(set);
	if (!f)
		return false;
	ok = fgets(buf, sizeof(buf), f) != NULL;
	fclose(f);
	for (p = buf; ok && *p && *p != '\n'; p = end + (*end == ',')) {
		long lo = parse_cpu(p, &end), hi = lo;

		if (lo < 0)
			return false;
		if (*end == '-') {
			hi = parse_cpu(end + 1, &end);
			if (hi < lo)
				return false;
		}
		for (long c = lo; c <= hi; c++)
			CPU_SET(c, set);
	}
	return ok && CPU_COUNT(set) > 0;
}

static int lowest_cpu(const cpu_set_t *set, int dflt)
{
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, set))
			return c;
	return dflt;
}

/* The lowest CPU sharing cpu's L3, or -1 if sysfs does not say. */
static int l3_key(int cpu)
{
	char path[PATH_MAX];
	cpu_set_t set;

	for (int idx = 0; idx < 16; idx++) {
		FILE *f;
		int level = 0;

		snprintf(path, sizeof(path), "%s/cpu%d/cache/index%d/level", sysfs, cpu, idx);
		f = fopen(path, "r");
		if (!f)
			break;
		if (fscanf(f, "%d", &level) != 1)
			level = 0;
		fclose(f);
		if (level != 3)
			continue;
		snprintf(path, sizeof(path), "%s/cpu%d/cache/index%d/shared_cpu_list", sysfs, cpu,
			 idx);
		if (read_cpulist(path, &set))
			return lowest_cpu(&set, -1);
	}
	return -1;
}

static int topology_key(int cpu, const char *file)
{
	char path[PATH_MAX];
	cpu_set_t set;

	snprintf(path, sizeof(path), "%s/cpu%d/topology/%s", sysfs, cpu, file);
	return read_cpulist(path, &set) ? lowest_cpu(&set, -1) : -1;
}

static int cmp_cpu_info(const void *a, const void *b)
{
	const struct cpu_info *x = a, *y = b;

	if (x->domain_key != y->domain_key)
		return x->domain_key < y->domain_key ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->core_key != y->core_key)
		return x->core_key < y->core_key ? -1 : 1;
	return x->cpu < y->cpu ? -1 : x->cpu > y->cpu;
}

static void read_model(struct topology *topo)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];

	snprintf(topo->model, sizeof(topo->model), "unknown CPU");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (strncmp(line, "model name", 10) || !colon)
			continue;
		colon += 1 + (colon[1] == ' ');
		colon[strcspn(colon, "\n")] = '\0';
		snprintf(topo->model, sizeof(topo->model), "%s", colon);
		break;
	}
	fclose(f);
}

void topology_read(struct topology *topo)
{
	cpu_set_t online, allowed, usable;
	struct cpu_info *info;
	bool have_l3 = true, have_package = true;
	const char *fake = getenv("PERCPUREF_BENCH_SYSFS");
	char path[PATH_MAX];
	unsigned int n = 0;

	memset(topo, 0, sizeof(*topo));
	if (fake && *fake)
		sysfs = fake;
	/* EINVAL: the kernel's mask is wider than a cpu_set_t. */
	if (sched_getaffinity(0, sizeof(allowed), &allowed))
		bench_die("sched_getaffinity: %m (this harness handles machines of up to %d CPUs)",
			  CPU_SETSIZE);
	snprintf(path, sizeof(path), "%s/online", sysfs);
	if (read_cpulist(path, &online)) {
		if (sysfs == fake)
			allowed = online;
	} else if (sysfs == fake) {
		/* The made-up machine is the point: not the real one's CPUs. */
		bench_die("PERCPUREF_BENCH_SYSFS: %s unreadable or not a CPU list", path);
	} else {
		online = allowed;	/* no sysfs (a sandbox): what we may use */
	}
	CPU_AND(&usable, &allowed, &online);
	if (!CPU_COUNT(&usable)) {
		/* This process runs on one of the mask's CPUs, so the list is
		 * what lies (a container's virtual one): do as without sysfs. */
		fprintf(stderr, "percpuref-bench: warning: %s lists none of the %d CPUs "
			"this process may run on; using the affinity mask\n",
			path, CPU_COUNT(&allowed));
		online = usable = allowed;
	}
	topo->online = CPU_COUNT(&online);
	allowed = usable;
	info = calloc(CPU_COUNT(&allowed), sizeof(*info));
	if (!info)
		bench_die("out of memory");
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &allowed))
			continue;
		info[n].cpu = c;
		info[n].domain_key = l3_key(c);
		have_l3 &= info[n].domain_key >= 0;
		info[n].core_key = topology_key(c, "thread_siblings_list");
		if (info[n].core_key < 0)
			info[n].core_key = c;
		n++;
	}
	/* The domain source is all-or-nothing, so domains are comparable. */
	for (unsigned int i = 0; i < n && !have_l3; i++) {
		info[i].domain_key = topology_key(info[i].cpu, "package_cpus_list");
		if (info[i].domain_key < 0)
			info[i].domain_key = topology_key(info[i].cpu, "core_siblings_list");
		have_package &= info[i].domain_key >= 0;
	}
	if (!have_l3 && !have_package)
		for (unsigned int i = 0; i < n; i++)
			info[i].domain_key = 0;
	topo->domain_source = have_l3 ? "L3" : have_package ? "package" : "none";

	/* Rank of each CPU among the usable CPUs of its core (CPU order). */
	for (unsigned int i = 0; i < n; i++)
		for (unsigned int j = 0; j < i; j++)
			if (info[j].core_key == info[i].core_key)
				info[i].rank++;
	qsort(info, n, sizeof(*info), cmp_cpu_info);

	topo->ncpus = n;
	topo->order = calloc(n, sizeof(*topo->order));
	topo->domain = calloc(n, sizeof(*topo->domain));
	topo->core = calloc(n, sizeof(*topo->core));
	if (!topo->order || !topo->domain || !topo->core)
		bench_die("out of memory");
	for (unsigned int i = 0; i < n; i++) {
		topo->order[i] = info[i].cpu;
		topo->core[i] = info[i].core_key;
		topo->smt |= info[i].rank > 0;
		if (i > 0 && info[i].domain_key != info[i - 1].domain_key)
			topo->ndomains++;
		topo->domain[i] = topo->ndomains;
	}
	topo->ndomains++;
	free(info);
	read_model(topo);
}

void topology_free(struct topology *topo)
{
	free(topo->order);
	free(topo->domain);
	free(topo->core);
}

unsigned int topology_domains_used(const struct topology *topo, unsigned int nthreads)
{
	unsigned int n = nthreads < topo->ncpus ? nthreads : topo->ncpus;

	/* Domains are contiguous in the order and numbered from 0. */
	return n ? topo->domain[n - 1] + 1 : 0;
}

unsigned int topology_cores_used(const struct topology *topo, unsigned int nthreads)
{
	unsigned int n = nthreads < topo->ncpus ? nthreads : topo->ncpus, cores = 0;

	/* A core counts once: at its first CPU in the order. */
	for (unsigned int i = 0; i < n; i++) {
		unsigned int j = 0;

		while (j < i && topo->core[j] != topo->core[i])
			j++;
		cores += j == i;
	}
	return cores;
}

void topology_format_config(const struct topology *topo, unsigned int nthreads, char *buf,
			    size_t len)
{
	snprintf(buf, len, "%uC%uT", topology_cores_used(topo, nthreads), nthreads);
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

void topology_format_cpus(const struct topology *topo, unsigned int n, char *buf, size_t len)
{
	int cpus[CPU_SETSIZE];
	size_t used = 0;

	memcpy(cpus, topo->order, n * sizeof(*cpus));
	qsort(cpus, n, sizeof(*cpus), cmp_int);
	buf[0] = '\0';
	for (unsigned int i = 0; i < n && used < len; i++) {
		unsigned int j = i;

		while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
			j++;
		used += snprintf(buf + used, len - used, j > i ? "%s%d-%d" : "%s%d",
				 i ? "," : "", cpus[i], cpus[j]);
		i = j;
	}
}
